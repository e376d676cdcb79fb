# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal --apply`` end to end on a real slurmctld and slurmd, with a stand-in
Kubernetes API server and kubelet (scripts/kube_standin: the real ``kubernetes`` client and
real gRPC talk to them) and simulated NVML: a window opens and a batch job runs on the GPU
Kubernetes lent; the window closes and the GPU goes home once the job has ended, no job
killed; a run killed in the middle of a move is undone by the next.

One node, tl1 on ``GPUSHARE_BED_PORT`` + 380: GPU 0 is Kubernetes' (lent at night), GPU 1
Slurm's. The plan, both state files and the shared gres.conf lie in the bed's etc/, where
the SPANK plugin reads the plan and what is lent.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shlex
import subprocess
import sys
from typing import Any, Iterator

import pytest

import slurmbed
from kube_standin.apiserver import ApiServer
from kube_standin.kubelet import Kubelet

PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200")) + 380
ROOT = f"/tmp/gsbed-tidal-{PORT}"
NODE = "tl1"
PLAN = """\
version: 1
slurm:
  device_root: @ROOT@/dev
node_groups:
  - name: infer
    nodes: tl1
    gpu_model: h100-80gb
    gpus: 2
    layout:
      0: {owner: kubernetes}
      1: {owner: slurm}
lending:
  - name: night
    home: kubernetes
    nodes: tl1
    gpus: 0
    window: {from: "20:00", to: "08:00"}
    max_lent: 1
    reclaim_minutes: 30
    borrowers: [debug]
"""
RULE = "gpushare-tidal-tl1-gpu0"
RESERVATION = "gpushare_tidal_tl1"


def restarts_slurmctld() -> bool:
    from gpushare.admin.plan.model import release_tuple
    from gpushare.admin.slurm_client import installed_release

    return release_tuple(installed_release() or "24.11") < (23, 11)


@pytest.fixture(scope="module")
def site() -> Iterator[tuple[slurmbed.SlurmBed, ApiServer, Kubelet]]:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    if not os.path.exists(os.path.join(slurmbed.BUILD, "spank_gpushare.so")):
        subprocess.run(["make", "-C", slurmbed.REPO, "build"], check=True)
    plan_path = ROOT + ".plan.yaml"
    with open(plan_path, "w") as handle:
        handle.write(PLAN.replace("@ROOT@", ROOT))
    bed = slurmbed.plan_bed(root=ROOT, port_base=PORT, plan_path=plan_path, simulate=True)
    prepare = bed.prepare

    def prepare_with_every_gpu() -> None:
        prepare()
        for minor in (0, 1):  # GPU 0 is Kubernetes' in gres.conf until it is lent
            path = bed.path("dev", f"nvidia{minor}")
            if not os.path.exists(path):
                os.mknod(path, 0o666 | 0o020000, os.makedev(195, minor))

    bed.prepare = prepare_with_every_gpu  # type: ignore[method-assign]
    api = ApiServer()
    api.add_node(NODE)
    api.add_slice(NODE, "gpu.nvidia.com", ["gpu-0", "gpu-1"])
    kubelet = Kubelet(os.path.join(ROOT + ".kubelet.sock"))
    bed.start()
    try:
        url = api.start()
        with open(bed.path("etc", "kubeconfig"), "w") as handle:
            handle.write(api.kubeconfig(url))
        kubelet.start()
        yield bed, api, kubelet
    finally:
        kubelet.stop()
        api.stop()
        bed.stop()


def holders_command(bed: slurmbed.SlurmBed, before: str = "") -> str:
    """`gpushare tidal holders` as a site's --holders-command runs it (here, on this host)."""
    step = [sys.executable, "-m", "gpushare.cli", "tidal", "holders", "--devices",
            "{devices}", "--socket", ROOT + ".kubelet.sock", "--source",
            "sim:" + bed.path("nodes", "{node}.json")]
    if before:
        return shlex.join(["/bin/sh", "-c", before + ' && exec "$0" "$@"', *step])
    return shlex.join(step)


def node_gres_command(bed: slurmbed.SlurmBed) -> str:
    """`gpushare render gres` as a site's --node-gres-command runs it on each node."""
    return shlex.join([sys.executable, "-m", "gpushare.cli", "render", "gres", "--plan",
                       bed.path("etc", "plan.yaml"), "--node", "{node}", "--output",
                       bed.path("etc", "gres.conf")])


def tidal(bed: slurmbed.SlurmBed, at: str, command: str = "", own_gres: bool = False) -> Any:
    gres = ["--node-gres-command", node_gres_command(bed)] if own_gres else \
        ["--cluster-gres-conf", bed.path("etc", "gres.conf")]
    argv = ["tidal", "--plan", bed.path("etc", "plan.yaml"), "--apply", "--at", at,
            "--state-dir", bed.path("etc"), "--kubeconfig", bed.path("etc", "kubeconfig"),
            "--holders-command", command or holders_command(bed), "--slurm-conf", bed.conf,
            *gres, "--settle-timeout", "90", "--release-timeout", "20"]
    if restarts_slurmctld():
        argv += ["--slurmctld-restart", bed.slurmctld_restart_command()]
    env = dict(os.environ, PYTHONPATH=os.path.join(slurmbed.REPO, "src"), SLURM_CONF=bed.conf)
    return subprocess.Popen([sys.executable, "-m", "gpushare.cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(bed: slurmbed.SlurmBed, run: Any) -> tuple[int, str]:
    out, _ = run.communicate(timeout=400)
    if restarts_slurmctld():
        bed.adopt_slurmctld()
    return run.returncode, out


def gpus(bed: slurmbed.SlurmBed) -> int:
    gres = bed.node_state(NODE).get("Gres", "")
    return sum(int(m) for m in re.findall(r"gpu:h100:(\d+)", gres))


def reservation(bed: slurmbed.SlurmBed) -> str:
    return bed.run(["scontrol", "-o", "show", "reservation", RESERVATION],
                   check=False).stdout.strip()


def in_service(bed: slurmbed.SlurmBed) -> bool:
    state = bed.node_state(NODE)["State"]
    return "DRAIN" not in state and "INVAL" not in state and "IDLE" in state


@pytest.mark.smoke
def test_a_night_window_lends_the_gpu_a_job_runs_on_it_and_it_goes_home_after(site):
    bed, api, _kubelet = site
    assert gpus(bed) == 1
    code, out = finish(bed, tidal(bed, "22:00"))
    assert code == 0, out
    assert "tl1 GPU 0: kubernetes -> slurm (night)" in out
    assert RULE in api.taint_rules  # no new pod lands on GPU 0 while Slurm has it
    slurmbed.wait_until("tl1 back in service with 2 GPUs",
                        lambda: gpus(bed) == 2 and in_service(bed), timeout=90)
    shown = reservation(bed)  # from the window's end: no job that would outlive it starts
    assert f"ReservationName={RESERVATION}" in shown and "Flags=MAINT" in shown, shown
    with open(bed.path("etc", "gres.conf")) as handle:
        assert re.search(r"NodeName=tl1 Name=gpu Type=h100 File=\S+/dev/nvidia\[0-1\]",
                         handle.read())

    status = subprocess.run(
        [sys.executable, "-m", "gpushare.cli", "status", "--cluster", "--backend", "scontrol",
         "--plan", bed.path("etc", "plan.yaml")], capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=os.path.join(slurmbed.REPO, "src"),
                 SLURM_CONF=bed.conf), check=False)
    assert status.returncode == 0, status.stderr
    assert re.search(r"tl1 GPU 0\s+night\s+kubernetes\s+slurm\s+\S+ \S+\s+\S+ 08:00",
                     status.stdout), status.stdout

    job = bed.sbatch("sleep 15; echo CVD=$CUDA_VISIBLE_DEVICES", "--gres=gpu:h100:2",
                     "--time=2")
    bed.wait_job(job, states=("RUNNING",), timeout=60)
    # The window closes while the job runs: the reclaim drains tl1 and waits for it.
    run = tidal(bed, "08:05")
    slurmbed.wait_until("tl1 draining for the reclaim",
                        lambda: "DRAIN" in bed.node_state(NODE)["State"], timeout=60)
    info = bed.wait_job(job, timeout=120)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    assert re.search(r"CVD=\d,\d", bed.output(job)), bed.output(job)
    code, out = finish(bed, run)
    assert code == 0, out
    assert "tl1 GPU 0: slurm -> kubernetes (night)" in out
    assert api.taint_rules == {}  # pods may land on GPU 0 again
    slurmbed.wait_until("tl1 back in service with its own GPU",
                        lambda: gpus(bed) == 1 and in_service(bed), timeout=90)
    assert f"ReservationName={RESERVATION}" not in reservation(bed)
    assert not os.path.exists(bed.path("etc", "tidal-state.json.journal"))


def test_a_run_killed_in_the_middle_of_a_lend_is_undone_by_the_next(site):
    bed, api, _kubelet = site
    counter = bed.path("etc", "holders-calls")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(counter)
    # The first call (is GPU 0 busy?) answers; the second (released yet?) kills the run.
    crash = (f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; '
             'if [ "$n" -ge 1 ]; then kill -9 $PPID; sleep 5; fi')
    code, out = finish(bed, tidal(bed, "22:00", command=holders_command(bed, crash)))
    assert code == -9, out
    assert RULE in api.taint_rules and "DRAIN" in bed.node_state(NODE)["State"]
    assert os.path.exists(bed.path("etc", "tidal-state.json.journal"))
    # Day: the next run finds the lend half done and undoes it, then decides nothing.
    code, out = finish(bed, tidal(bed, "12:00"))
    assert code == 0, out
    assert "an earlier run left it at 'fenced'; undo" in out
    assert api.taint_rules == {}
    slurmbed.wait_until("tl1 in service as before", lambda: in_service(bed) and gpus(bed) == 1,
                        timeout=60)
    assert not os.path.exists(bed.path("etc", "tidal-state.json.journal"))


def test_a_demand_keeps_borrowed_jobs_within_its_promise_and_a_waiting_pod_takes_it_back(
        site):
    """With a demand too, the node's reservation starts reclaim_minutes on and moves on each
    round (scontrol update); a pod the scheduler cannot place takes the GPU back. The node's
    gres.conf is rendered as one of its own (--node-gres-command)."""
    bed, api, _kubelet = site
    plan = bed.path("etc", "plan.yaml")
    with open(plan) as handle:
        original = handle.read()
    day = (datetime.date.today() + datetime.timedelta(days=2)).isoformat()
    try:
        with open(plan, "w") as handle:
            handle.write(original.replace(
                "    max_lent: 1\n",
                "    demand: {idle_below_percent: 50, for_minutes: 30}\n    max_lent: 1\n"))
        for at in ("22:00", "22:31"):  # idle from 22:00; lent half an hour later
            code, out = finish(bed, tidal(bed, f"{day} {at}", own_gres=True))
            assert code == 0, out
        assert "tl1 GPU 0: kubernetes -> slurm (night)" in out
        assert "tl1: rendered its gres.conf" in out, out
        slurmbed.wait_until("tl1 back in service with 2 GPUs",
                            lambda: gpus(bed) == 2 and in_service(bed), timeout=90)
        assert f"StartTime={day}T23:01:00" in reservation(bed), reservation(bed)
        code, out = finish(bed, tidal(bed, f"{day} 22:36", own_gres=True))
        assert code == 0, out
        assert f"StartTime={day}T23:06:00" in reservation(bed), reservation(bed)

        api.pods = [{"metadata": {"name": "llm-0", "namespace": "serving"},
                     "spec": {"containers": [{"name": "c", "resources": {
                         "limits": {"nvidia.com/gpu": "1"}}}]},
                     "status": {"phase": "Pending", "conditions": [
                         {"type": "PodScheduled", "status": "False",
                          "reason": "Unschedulable"}]}}]
        code, out = finish(bed, tidal(bed, f"{day} 22:40", own_gres=True))
        assert code == 0, out
        assert "tl1 GPU 0 -> kubernetes: reclaimed: kubernetes needs 1 and holds 0" in out
        assert "tl1 GPU 0: slurm -> kubernetes (night)" in out
        assert api.taint_rules == {}
        slurmbed.wait_until("tl1 back in service with its own GPU",
                            lambda: gpus(bed) == 1 and in_service(bed), timeout=90)
        assert f"ReservationName={RESERVATION}" not in reservation(bed)
    finally:
        api.pods = []
        with open(plan, "w") as handle:
            handle.write(original)
