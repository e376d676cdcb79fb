# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --apply`` end to end on a real slurmctld and real slurmd, with simulated
NVML: the queue waits for a MIG profile no node in service offers, the idle GPUs change, Slurm
sees the new GRES, the waiting jobs run; and what a failing, hanging or interrupted change
leaves behind.

The bed runs without ``SlurmdParameters=config_overrides``, so slurmctld validates every
registration as on a real cluster: the nodes declare this machine's CPUs and less memory than
it has, and a GRES count that does not match gres.conf would make a node INVAL.

Three nodes on ``GPUSHARE_BED_PORT`` + 320 up: rl1 is the one that changes (GPU 0 Kubernetes'
MIG, GPU 1 Slurm's whole, GPUs 2-3 Slurm's 7 × 1g.10gb, menu 7x1g.10gb / 2x3g.40gb / whole);
rl2 (2 × 3g.40gb) and rl3 are drained at the start, so that jobs asking for 3g.40gb are
accepted (Slurm refuses at submission a type no node declares) and wait. The nodes share one
gres.conf, which ``--cluster-gres-conf`` renders again from the plan and the applied layouts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

import slurmbed

PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200")) + 320
ROOT = f"/tmp/gsbed-relayout-{PORT}"
NODE = "rl1"
PLAN = """\
version: 1
slurm:
  device_root: @ROOT@/dev
  mps_units_per_gpu: 100
node_groups:
  - name: flex
    nodes: rl1
    gpu_model: h100-80gb
    gpus: 4
    layout:
      0: {owner: kubernetes, mig: [{profile: 3g.40gb, count: 2}]}
      1: {owner: slurm}
      all: {owner: slurm, mig: [{profile: 1g.10gb, count: 7}]}
    relayout:
      min_interval_s: 0
      menu:
        - 7x1g.10gb
        - 2x3g.40gb
        - whole
  - name: big
    nodes: rl2
    gpu_model: h100-80gb
    gpus: 2
    layout:
      all: {owner: slurm, mig: [{profile: 3g.40gb, count: 2}]}
  - name: small
    nodes: rl3
    gpu_model: h100-80gb
    gpus: 1
    layout:
      all: {owner: slurm, mig: [{profile: 1g.10gb, count: 7}]}
"""


def gpushare(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.path.join(slurmbed.REPO, "src"),
               SLURM_CONF=os.path.join(ROOT, "etc", "slurm.conf"))
    return subprocess.run([sys.executable, "-m", "gpushare.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def _bed() -> slurmbed.SlurmBed:
    from gpushare.admin.mig_profiles import caps_minors

    plan_path = ROOT + ".plan.yaml"
    with open(plan_path, "w") as handle:
        handle.write(PLAN.replace("@ROOT@", ROOT))
    bed = slurmbed.plan_bed(root=ROOT, port_base=PORT, plan_path=plan_path, simulate=True)
    cpus = os.cpu_count() or 1
    for node in bed.nodes:
        node.cpus, node.memory_mb = cpus, 1000  # this machine's CPUs, less than its memory
    prepare = bed.prepare

    def prepare_without_overrides() -> None:
        prepare()
        conf = bed.path("etc", "slurm.conf")
        with open(conf) as handle:
            lines = [line for line in handle if not line.startswith("SlurmdParameters=")]
        with open(conf, "w") as handle:
            handle.writelines(lines)
        # Every MIG capability file a layout may need (a real node has them all).
        for gpu_minor in range(4):
            for gi in range(15):
                for minor in {caps_minors(gpu_minor, gi, ci)[i] for ci in range(8)
                              for i in (0, 1)}:
                    path = bed.path("dev", "nvidia-caps", f"nvidia-cap{minor}")
                    if not os.path.exists(path):
                        os.mknod(path, 0o444 | 0o020000, os.makedev(240, minor))

    bed.prepare = prepare_without_overrides  # type: ignore[method-assign]
    return bed


@pytest.fixture(scope="module")
def bed():
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    if not os.path.exists(os.path.join(slurmbed.BUILD, "spank_gpushare.so")):
        subprocess.run(["make", "-C", slurmbed.REPO, "build"], check=True)
    cluster = _bed()
    cluster.start()
    try:
        with open(cluster.conf) as handle:
            assert "config_overrides" not in handle.read()
        for spare in ("rl2", "rl3"):
            cluster.run(["scontrol", "update", f"NodeName={spare}", "State=DRAIN",
                         "Reason=spare"])
        yield cluster
    finally:
        cluster.stop()


SAVED = ("nodes/rl1.json", "nodes/rl3.json", "etc/gres.conf", "etc/slurm.conf", "etc/plan.yaml")


@pytest.fixture
def fresh(bed) -> Iterator[slurmbed.SlurmBed]:
    """rl1 as the plan lays it out, in service, no job and no relayout recorded; again
    after the test."""
    saved = {}
    for name in SAVED:
        with open(bed.path(name)) as handle:
            saved[name] = handle.read()

    def reset() -> None:
        bed.run(["scancel", "--quiet", "--full", "-u", slurmbed.TEST_USERS[0]], check=False)
        slurmbed.wait_until("no job left", lambda: not bed.run(
            ["squeue", "-h", "-o", "%i"]).stdout.strip())
        for name, text in saved.items():
            with open(bed.path(name), "w") as handle:
                handle.write(text)
        for name in ("etc/relayout-state.json", "etc/relayout-state.json.journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(bed.path(name))
        bed.run(["scontrol", "reconfigure"])

        def back() -> bool:
            return shows(bed, {"gpu:h100": 1, "gpu:1g.10gb": 14}) and registered(bed)

        if restarts_slurmctld():
            # As relayout does: slurmd has read gres.conf, slurmctld takes the count at start.
            for attempt in (1, 2):
                bed.restart_slurmctld()
                try:
                    slurmbed.wait_until("rl1 has its planned GRES back and registered it",
                                        back, timeout=60)
                    break
                except AssertionError:
                    if attempt == 2:
                        raise
        slurmbed.wait_until("rl1 has its planned GRES back and registered it", back)
        bed.resume(NODE)
        slurmbed.wait_until("rl1 idle", lambda: bed.node_state(NODE)["State"] == "IDLE")

    reset()
    yield bed
    reset()


def shows(bed, want: dict[str, int]) -> bool:
    """slurmctld shows rl1 with these GPU types, at least these many of each (22.05 counts
    each file of a slice's MultipleFiles= line once a reconfigure took the node's count)."""
    seen = gres_of(bed)
    return set(seen) == set(want) and all(seen[k] >= v for k, v in want.items())


def registered(bed) -> bool:
    """rl1's slurmd has registered with slurmctld since it started (BootTime=None until then),
    and nothing marks the node unusable."""
    state = bed.node_state(NODE)
    flags = set(state["State"].split("+"))
    return state.get("BootTime") != "None" and not flags & {"NOT_RESPONDING", "INVAL", "DOWN"}


def gres_of(bed) -> dict[str, int]:
    """slurmctld's GPU GRES of rl1 by type ({"gpu:3g.40gb": 4, ...})."""
    gres = bed.node_state(NODE).get("Gres", "")
    counts: dict[str, int] = {}
    for item in re.split(r",(?![^(]*\))", gres):
        head = item.split("(", 1)[0]
        name, _, count = head.rpartition(":")
        if name.startswith("gpu"):
            counts[name] = counts.get(name, 0) + int(count)
    return counts


def sim_layout(bed, index: int, node: str = NODE) -> Any:
    with open(bed.path("nodes", f"{node}.json")) as handle:
        gpu = json.load(handle)["gpus"][index]
    if not gpu.get("mig", {}).get("current"):
        return "whole"
    return sorted(d["profile"] for d in gpu.get("mig_devices", []))


def step_command(bed, before: str = "") -> str:
    """The node's step as a site's --node-command runs it (here, on this host)."""
    step = [sys.executable, "-m", "gpushare.cli", "relayout", "node",
            "--plan", bed.path("etc", "plan.yaml"), "--node", "{node}", "--gpu", "{gpu}",
            "--layout", "{layout}", "--round={round}", "--decision", "{decision}",
            "--step-timeout", "{timeout}", "--source", "sim:" + bed.path("nodes", "{node}.json"),
            "--gres-conf", "none", "--lock-dir", bed.path("run"), "--apply"]
    if before:
        return shlex.join(["/bin/sh", "-c", before + ' && exec "$0" "$@"', *step])
    return shlex.join(step)


def restarts_slurmctld() -> bool:
    """Slurm before 23.11 keeps a node's GPU count across ``scontrol reconfigure``; relayout
    restarts slurmctld there (``--slurmctld-restart``, systemctl on a site)."""
    from gpushare.admin.plan.model import release_tuple
    from gpushare.admin.slurm_client import installed_release

    return release_tuple(installed_release() or "24.11") < (23, 11)


# The jobs of earlier tests stay in slurmctld (MinJobAge) and would stand for the next hour's
# submissions in the forecast that guards each change (a whole-GPU one keeps rl1's whole GPU);
# these tests are about carrying a change out, so the forecast weighs the waiting jobs alone.
# test_a_whole_gpu_job_that_just_ended_keeps_the_last_whole_gpu weighs the recent past.
# The bed runs no slurmdbd, so sacct cannot tell what MIG jobs held and every MIG profile
# would keep what the plan gives it (test_without_accounting_every_mig_profile_keeps_its_slices):
# no floor either.
ALONE = ("--lookback", "0", "--keep-hours", "0")
NO_FLOOR = ("--keep-hours", "0")


def relayout(bed, *extra: str, command: str = "", **popen: Any) -> Any:
    argv = ["relayout", "--plan", bed.path("etc", "plan.yaml"), "--backend", "scontrol",
            "--hysteresis", "0.2", *ALONE, "--node-command", command or step_command(bed),
            "--slurm-conf", bed.conf, "--cluster-gres-conf", bed.path("etc", "gres.conf"),
            "--settle-timeout", "90", "--apply", "--json", *extra]
    if restarts_slurmctld():
        argv += ["--slurmctld-restart", bed.slurmctld_restart_command()]
    try:
        if popen:
            env = dict(os.environ, PYTHONPATH=os.path.join(slurmbed.REPO, "src"),
                       SLURM_CONF=bed.conf)
            return subprocess.Popen([sys.executable, "-m", "gpushare.cli", *argv], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return gpushare(*argv)
    finally:
        if not popen:
            bed.adopt_slurmctld()


def queue_large(bed, count: int = 4) -> list[int]:
    """Jobs asking for a 3g.40gb, which no node in service offers: they wait."""
    jobs = [bed.sbatch("echo CVD=$CUDA_VISIBLE_DEVICES", "--gres=gpu:3g.40gb:1", "--time=2")
            for _ in range(count)]
    for job in jobs:
        assert bed.job(job)["JobState"] == "PENDING", bed.job(job)
    return jobs


@pytest.mark.smoke
def test_the_layout_follows_the_queue(fresh):
    bed = fresh
    mig_parted = gpushare("render", "mig-parted", "--plan", bed.path("etc", "plan.yaml"))
    assert mig_parted.returncode == 0, mig_parted.stderr
    kubernetes_gpu = sim_layout(bed, 0)
    # A job on GPU 1 (whole) of the same node: Slurm has no per-GPU drain, so the node
    # takes no new job and changes once this one has ended.
    marker = os.path.join(bed.out_dir, "neighbour-started")
    running = bed.sbatch(f"touch {marker}; echo CVD=$CUDA_VISIBLE_DEVICES; sleep 10; "
                         "echo neighbour done", "-w", NODE, "--gres=gpu:h100:1", "--time=2")
    slurmbed.wait_until("the neighbour runs", lambda: os.path.exists(marker))
    waiting = queue_large(bed)

    done = relayout(bed)
    assert done.returncode == 0, (json.loads(done.stdout or "{}").get("nodes"), done.stderr,
                                  bed.logs()[-3000:])
    out = json.loads(done.stdout)
    assert len(out["nodes"]) == 1, (out["why"], bed.run(["squeue", "-h", "-t", "PD", "-o",
                                                         "%i|%b|%V|%P|%u|%a|%r"]).stdout)
    [node] = out["nodes"]
    assert node["node"] == NODE and node["failed"] is None, node
    assert sorted(node["applied"]) == [[2, "2x3g.40gb"], [3, "2x3g.40gb"]], node
    # NVML (simulated) shows the new instances; Kubernetes' GPU kept its layout.
    assert sim_layout(bed, 2) == sim_layout(bed, 3) == ["3g.40gb", "3g.40gb"]
    assert sim_layout(bed, 0) == kubernetes_gpu
    # slurmctld shows the new GRES, the node is back, the waiting jobs run.
    assert shows(bed, {"gpu:h100": 1, "gpu:3g.40gb": 4}), gres_of(bed)
    state = bed.node_state(NODE)
    assert "DRAIN" not in state["State"] and "INVAL" not in state["State"], state
    neighbour = bed.wait_job(running)
    assert neighbour["JobState"] == "COMPLETED" and neighbour["ExitCode"] == "0:0", neighbour
    assert "neighbour done" in bed.output(running)
    for job in waiting:
        info = bed.wait_job(job)
        assert info["JobState"] == "COMPLETED" and info["NodeList"] == NODE, info
    # The neighbour had ended before any GPU changed (Slurm drained the node until idle).
    with open(bed.path("etc", "relayout-state.json")) as handle:
        record = json.load(handle)
    changed_at = record["gpus"][NODE]["2"]["at"]
    ended = time.mktime(time.strptime(neighbour["EndTime"], "%Y-%m-%dT%H:%M:%S"))
    assert ended <= changed_at, (neighbour["EndTime"], changed_at)
    assert record["counters"]["applied"] == 2 and record["gpus"][NODE]["2"]["decision"] == \
        out["decision_id"]
    # The Kubernetes side's config is the plan's; check agrees with the node and slurmctld.
    again = gpushare("render", "mig-parted", "--plan", bed.path("etc", "plan.yaml"))
    assert again.stdout == mig_parted.stdout
    check = gpushare("check", "--plan", bed.path("etc", "plan.yaml"), "--node", NODE,
                     "--source", "sim:" + bed.path("nodes", f"{NODE}.json"),
                     "--gres-conf", bed.path("etc", "gres.conf"), "--json")
    findings = json.loads(check.stdout)["findings"]
    assert [f for f in findings if f["severity"] == "error"] == [], findings
    assert not any("twice" in f["what"] for f in findings), findings
    cluster = gpushare("check", "--plan", bed.path("etc", "plan.yaml"), "--cluster",
                       "--backend", "scontrol", "--json")
    findings = json.loads(cluster.stdout)["findings"]
    # Only 22.05's per-file count may differ; what check expects is the applied layout.
    assert all("gives Slurm gpu:h100:1,gpu:3g.40gb:4" in f["what"]
               for f in findings if f["severity"] == "error"), findings
    # The bed records no GRES in accounting: relayout's floors cannot read sacct, and the
    # check says what to add (test_relayout_accounting has slurmdbd and the line).
    assert any("does not record gres/gpu" in f["what"] and "AccountingStorageTRES=" in f["fix"]
               for f in findings if f["severity"] == "warning"), findings
    rendered = gpushare("render", "gres", "--plan", bed.path("etc", "plan.yaml"), "--node",
                        NODE)
    assert rendered.stdout.count("Type=3g.40gb") == 4, rendered.stdout
    # No new demand: a second round changes nothing and drains nothing.
    second = relayout(bed)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["changes"] == [] and out["nodes"] == [], out
    assert shows(bed, {"gpu:h100": 1, "gpu:3g.40gb": 4}), gres_of(bed)
    metrics = gpushare("metrics", "--relayout-state", bed.path("etc", "relayout-state.json"),
                       "--plugstack", bed.path("etc", "none.conf"))
    assert 'gpushare_relayout_changes_total{result="applied"} 2' in metrics.stdout, metrics


def expected_gres(applied: list[list[Any]]) -> dict[str, int]:
    """rl1's GRES after these GPUs took 2x3g.40gb (which the decision picks depends on the
    release: 22.05 keeps one MIG profile per node)."""
    changed = {gpu for gpu, layout in applied if layout == "2x3g.40gb"}
    assert changed and changed == {gpu for gpu, _layout in applied}, applied
    counts = {"gpu:h100": 0 if 1 in changed else 1, "gpu:3g.40gb": 2 * len(changed),
              "gpu:1g.10gb": 7 * len({2, 3} - changed)}
    return {k: v for k, v in counts.items() if v}


def test_the_nodes_step_by_hand_changes_no_gpu_of_a_node_in_service(fresh):
    """The node's step run by hand (as docs/admin.md shows) asks slurmctld first: on rl1 in
    service a job may start on the GPU, and on a draining rl1 a job holds it (with no
    process on the GPU yet, which NVML would show); only once rl1 is drained and idle does
    the GPU change."""
    bed = fresh
    step = ("relayout", "node", "--plan", bed.path("etc", "plan.yaml"), "--node", NODE,
            "--gpu", "2", "--layout", "whole", "--source",
            "sim:" + bed.path("nodes", f"{NODE}.json"), "--gres-conf", "none", "--state",
            "none", "--lock-dir", bed.path("run"), "--apply")
    in_service = gpushare(*step)
    assert in_service.returncode == 2, in_service.stdout + in_service.stderr
    assert "GPU 2 of node rl1 not changed: slurmctld shows it IDLE, so a job may start" \
        in in_service.stderr, in_service.stderr
    marker = os.path.join(bed.out_dir, "holder-started")
    holder = bed.sbatch(f"touch {marker}; sleep 300", "-w", NODE, "--gres=gpu:1g.10gb:1",
                        "--time=10")
    slurmbed.wait_until("the job runs", lambda: os.path.exists(marker))
    bed.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=by hand"])
    draining = gpushare(*step)
    assert draining.returncode == 2, draining.stdout + draining.stderr
    assert "a job holds it" in draining.stderr, draining.stderr
    assert sim_layout(bed, 2) == ["1g.10gb"] * 7
    bed.run(["scancel", str(holder)])
    bed.wait_job(holder)
    slurmbed.wait_until("rl1 drained and idle", lambda: bed.node_state(NODE)["State"] in (
        "IDLE+DRAIN", "DRAINED"))
    drained = gpushare(*step)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert sim_layout(bed, 2) == "whole"


def test_a_step_refused_for_gpus_in_use_resumes_the_node_unchanged(fresh):
    """A process on every Slurm GPU of rl1 that slurmctld does not know of (NVML refuses to
    destroy an instance in use): each step refuses, nothing changes, the node comes back."""
    bed = fresh
    queue_large(bed)
    path = bed.path("nodes", f"{NODE}.json")
    with open(path) as handle:
        profile = json.load(handle)
    busy = [{"pid": 4242, "kind": "compute"}]
    profile["gpus"][1]["processes"] = busy
    for index in (2, 3):
        for device in profile["gpus"][index]["mig_devices"]:
            device["processes"] = busy
    with open(path, "w") as handle:
        json.dump(profile, handle)
    done = relayout(bed)
    assert done.returncode == 0, (done.stdout, done.stderr)
    [node] = json.loads(done.stdout)["nodes"]
    assert node["applied"] == [] and node["failed"] is None, node
    assert node["restored"] and all("in use" in why for _gpu, why in node["restored"]), node
    assert [sim_layout(bed, i) for i in (1, 2, 3)] == ["whole"] + [["1g.10gb"] * 7] * 2
    assert shows(bed, {"gpu:h100": 1, "gpu:1g.10gb": 14}), gres_of(bed)
    assert "DRAIN" not in bed.node_state(NODE)["State"]
    # In service (a restarted slurmctld may still wait for a ping answer).
    slurmbed.wait_until("rl1 idle", lambda: bed.node_state(NODE)["State"] == "IDLE")


def test_a_step_that_hangs_leaves_the_node_drained_with_the_cause(fresh):
    bed = fresh
    queue_large(bed)
    done = relayout(bed, "--step-timeout", "1", command=step_command(bed, "sleep 600"))
    assert done.returncode == 2, (done.stdout, done.stderr)
    out = json.loads(done.stdout)
    [node] = out["nodes"]
    assert "did not end within 32 s" in node["failed"], node
    state = bed.node_state(NODE)
    assert "DRAIN" in state["State"], state
    assert state["Reason"].startswith("gpushare relayout: GPU "), state
    assert "layout is unknown" in state["Reason"], state
    assert shows(bed, {"gpu:h100": 1, "gpu:1g.10gb": 14}), gres_of(bed)


def test_slurmctld_restarts_and_a_job_lands_while_the_node_changes(fresh):
    bed = fresh
    waiting = queue_large(bed)
    started, go = bed.path("out", "step-started"), bed.path("out", "step-go")
    for path in (started, go):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    hold = f"touch {started}; while [ ! -e {go} ]; do sleep 0.2; done"
    running = relayout(bed, command=step_command(bed, hold), popen=True)
    try:
        slurmbed.wait_until("the node's step started", lambda: os.path.exists(started))
        # A job for the node while it changes: the node is drained, the job waits.
        small = bed.sbatch("echo small", "-w", NODE, "--time=2")
        assert bed.job(small)["JobState"] == "PENDING", bed.job(small)
        # slurmctld goes away and comes back (its state kept) in the middle.
        bed.restart_slurmctld()
        with open(go, "w"):
            pass
        out, err = running.communicate(timeout=400)
    finally:
        if running.poll() is None:
            running.kill()
        bed.adopt_slurmctld()
    assert running.returncode == 0, (json.loads(out or "{}").get("nodes"), err, bed.logs()[-4000:])
    [node] = json.loads(out)["nodes"]
    assert node["failed"] is None, node
    assert shows(bed, expected_gres(node["applied"])), gres_of(bed)
    assert bed.wait_job(small)["JobState"] == "COMPLETED"
    for job in waiting:
        assert bed.wait_job(job)["JobState"] == "COMPLETED"


def _reasons(bed) -> dict[int, str]:
    listed = bed.run(["squeue", "-h", "-t", "PD", "-o", "%i|%r"]).stdout
    return {int(job): reason for job, _sep, reason in
            (line.partition("|") for line in listed.splitlines() if line)}


def test_held_dependent_and_begin_jobs_do_not_move_the_layout(fresh):
    """Jobs for 3g.40gb that cannot start whatever the layout (held, waiting for another job,
    or for a --begin an hour away) leave rl1 as it is; released, the held one moves it."""
    bed = fresh
    args = ("--gres=gpu:3g.40gb:1", "--time=2")
    held = [bed.sbatch("true", "--hold", *args) for _ in range(3)]
    after = bed.sbatch("true", f"--dependency=afterok:{held[0]}", *args)
    later = bed.sbatch("true", "--begin=now+3600", *args)
    slurmbed.wait_until("Slurm gives each its reason", lambda: _reasons(bed).get(after) ==
                        "Dependency" and _reasons(bed).get(later) == "BeginTime")
    plan = bed.path("etc", "plan.yaml")
    dry = gpushare("relayout", "--plan", plan, "--backend", "scontrol", "--hysteresis", "0.2",
                   *ALONE, "--json")
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert out["changes"] == [] and out["demand"] == {}, out
    assert any("3 held" in why and "1 dependency" in why and "1 --begin in the future" in why
               for why in out["why"]), out["why"]
    done = relayout(bed)
    assert done.returncode == 0 and json.loads(done.stdout)["nodes"] == [], done.stdout
    assert sim_layout(bed, 2) == sim_layout(bed, 3) == ["1g.10gb"] * 7
    assert "DRAIN" not in bed.node_state(NODE)["State"]
    # Released, they wait for resources: now they count.
    bed.run(["scontrol", "release", ",".join(map(str, held))])
    slurmbed.wait_until("the released jobs wait for resources", lambda: all(
        _reasons(bed).get(job, "").split(",")[0] in ("Resources", "Priority", "ReqNodeNotAvail")
        for job in held))
    moved = gpushare("relayout", "--plan", plan, "--backend", "scontrol", "--hysteresis", "0.2",
                     *ALONE, "--json")
    assert moved.returncode == 0, moved.stderr
    out = json.loads(moved.stdout)
    assert out["demand"] == {"3g.40gb": 3} and out["changes"], out


def test_jobs_asking_gpus_per_job_or_per_task_count_in_the_demand(fresh):
    """Jobs that ask 3g.40gb with --gpus (squeue's tres-per-job) or --gpus-per-task
    (tres-per-task), not --gres, wait as the others do: relayout and status --demand count
    what each asks of its one node, and relayout changes rl1 for them."""
    bed = fresh
    per_job = bed.sbatch("true", "--gpus=3g.40gb:2", "--time=2")
    per_task = bed.sbatch("true", "-n", "2", "--gpus-per-task=3g.40gb:1", "--time=2")
    slurmbed.wait_until("both wait for resources", lambda: all(
        _reasons(bed).get(job, "").split(",")[0] in ("Resources", "Priority", "ReqNodeNotAvail")
        for job in (per_job, per_task)))
    listed = bed.run(["squeue", "-h", "-t", "PD", "-o", "%i|%b"]).stdout
    assert f"{per_job}|N/A" in listed and f"{per_task}|N/A" in listed, listed  # not in %b
    dry = gpushare("relayout", "--plan", bed.path("etc", "plan.yaml"), "--backend", "scontrol",
                   "--hysteresis", "0.2", *ALONE, "--json")
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert out["demand"] == {"3g.40gb": 4} and out["changes"], out
    assert not any("not counted" in why for why in out["why"]), out["why"]
    status = gpushare("status", "--cluster", "--demand", "--backend", "scontrol", "--plan",
                      bed.path("etc", "plan.yaml"), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["demand"]["waiting"] == {"3g.40gb": 4}, status.stdout
    shown = gpushare("status", "--cluster", "--demand", "--backend", "scontrol", "--plan",
                     bed.path("etc", "plan.yaml"))
    assert shown.returncode == 0, shown.stderr
    assert "a job counts what it asks of one node" in shown.stdout, shown.stdout
    assert re.search(r"^3g\.40gb\s+4\s+\d+$", shown.stdout, re.M), shown.stdout


def test_a_whole_gpu_job_that_just_ended_keeps_the_last_whole_gpu(fresh):
    """A whole-GPU job ran and ended a moment ago; four 3g.40gb jobs wait. Turning rl1's
    idle GPUs 1-3 (the cluster's only whole GPU in service among them) into 3g.40gb slices
    would start the four, but the forecast lets the ended job's kind come again within the
    hour, and it would then find no whole GPU: the change is refused, saying so. Weighing the
    waiting jobs alone (--lookback 0), the same change is made."""
    bed = fresh
    whole = bed.sbatch("true", "--gres=gpu:h100:1", "--time=2")
    assert bed.wait_job(whole)["JobState"] == "COMPLETED"
    queue_large(bed)
    plan = bed.path("etc", "plan.yaml")
    base = ("relayout", "--plan", plan, "--backend", "scontrol", "--hysteresis", "0.2",
            *NO_FLOOR)
    dry = gpushare(*base, "--json")
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert out["demand"] == {"3g.40gb": 4} and out["changes"] == [], out
    [prediction] = out["predictions"]
    assert 1 in prediction["gpus"] and not prediction["made"], prediction
    assert prediction["refusal"].startswith("whole-GPU jobs would wait longer"), prediction
    assert prediction["with"]["whole_wait_s"] > prediction["without"]["whole_wait_s"]
    explained = gpushare(*base, "--explain")
    assert explained.returncode == 0, explained.stderr
    assert "refused, whole-GPU jobs would wait longer" in explained.stdout, explained.stdout
    alone = gpushare(*base, "--lookback", "0", "--json")
    assert alone.returncode == 0, alone.stderr
    out = json.loads(alone.stdout)
    assert out["changes"] and [p["made"] for p in out["predictions"]] == [True], out
    assert sim_layout(bed, 1) == "whole"  # dry runs: nothing changed


def test_without_accounting_every_mig_profile_keeps_its_slices(fresh):
    """The bed's slurm.conf keeps no accounting (no slurmdbd), so Slurm's own sacct cannot
    say what MIG jobs held in the last day: no change takes a MIG slice the plan gives
    Slurm, the decision says why and how to go on; with --keep-hours 0 the 3g.40gb jobs get
    their slices."""
    bed = fresh
    queue_large(bed)
    plan = bed.path("etc", "plan.yaml")
    base = ("relayout", "--plan", plan, "--backend", "scontrol", "--hysteresis", "0.2",
            "--lookback", "0", "--json")
    kept = gpushare(*base)
    assert kept.returncode == 0, kept.stderr
    out = json.loads(kept.stdout)
    assert out["demand"] == {"3g.40gb": 4}, out
    assert not [c for c in out["changes"] if "1g.10gb" in c["from"]], out
    [line] = [why for why in out["why"] if why.startswith("kept:")]
    assert "every MIG profile and MPS keeps what the plan's layouts give it" in line, line
    assert "sacct" in line and "--keep-hours 0" in line, line
    assert out["floors"]["from_history"] is False and out["floors"]["by_kind"], out["floors"]
    free = gpushare(*base, *NO_FLOOR)
    assert free.returncode == 0, free.stderr
    out = json.loads(free.stdout)
    assert [c for c in out["changes"] if "1g.10gb" in c["from"]], out
    assert not any(why.startswith("kept:") for why in out["why"]) and out["floors"] is None
    assert sim_layout(bed, 2) == ["1g.10gb"] * 7  # dry runs: nothing changed


DESTROY = """\
import sys
from gpushare.gpu.inventory import load_nvml
nvml = load_nvml("sim:" + sys.argv[1])
nvml.nvmlInit()
handle = nvml.nvmlDeviceGetHandleByIndex(int(sys.argv[2]))
for gi_id in range(15):
    try:
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    except nvml.NVMLError:
        continue
    for ci_id in range(8):
        try:
            nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
        except nvml.NVMLError:
            continue
    nvml.nvmlGpuInstanceDestroy(gi)
"""


def test_a_run_killed_after_the_destroy_is_finished_by_the_next(fresh):
    """The controller dies (SIGKILL) once GPU 2's instances are destroyed and before any is
    created: rl1 is left drained, GPU 2 empty. The next run settles it first (the journalled
    layout, Gres=, the resume), then goes on; the waiting jobs run."""
    bed = fresh
    script = os.path.join(bed.out_dir, "destroy.py")
    with open(script, "w") as handle:
        handle.write(DESTROY)
    profile = bed.path("nodes", f"{NODE}.json")
    hook = (f"if [ {{gpu}} = 2 ]; then PYTHONPATH={shlex.quote(os.path.join(slurmbed.REPO, 'src'))}"
            f" {shlex.quote(sys.executable)} {shlex.quote(script)} {shlex.quote(profile)} 2"
            " && kill -9 $PPID; exit 9; fi; true")
    waiting = queue_large(bed)
    killed = relayout(bed, command=step_command(bed, before=hook), popen=True)
    _out, err = killed.communicate(timeout=300)
    assert killed.returncode == -9, err
    bed.adopt_slurmctld()
    assert sim_layout(bed, 2) == [], sim_layout(bed, 2)
    assert "DRAIN" in bed.node_state(NODE)["State"]
    assert os.path.exists(bed.path("etc", "relayout-state.json.journal"))
    done = relayout(bed)
    assert done.returncode == 0, (done.stdout, done.stderr[:4000])
    assert "an interrupted run" in done.stderr or '"recovered"' in done.stderr, done.stderr
    assert not os.path.exists(bed.path("etc", "relayout-state.json.journal"))
    # GPU 2 has its journalled layout; so has every GPU the state file records (which
    # others the rounds chose depends on the release: 22.05 keeps one MIG profile per node).
    with open(bed.path("etc", "relayout-state.json")) as handle:
        record = json.load(handle)["gpus"][NODE]
    applied = sorted([int(gpu), entry["layout"]] for gpu, entry in record.items())
    assert [2, "2x3g.40gb"] in applied, applied
    for gpu, _layout in applied:
        assert sim_layout(bed, gpu) == ["3g.40gb", "3g.40gb"], (gpu, applied)
    state = bed.node_state(NODE)
    assert "DRAIN" not in state["State"] and "INVAL" not in state["State"], state
    assert shows(bed, expected_gres(applied)), (gres_of(bed), applied)
    for job in waiting:
        info = bed.wait_job(job)
        assert info["JobState"] == "COMPLETED" and info["NodeList"] == NODE, info


def test_a_run_killed_after_the_drain_is_rolled_back_by_the_next(fresh):
    """The controller dies (SIGKILL) once rl1 is drained, while a running job keeps it from
    going idle: no GPU has changed. The next run finds the journal, resumes rl1 with its
    layout as it was, waits for slurmctld to hear from it, and then decides afresh: the
    waiting jobs run."""
    bed = fresh
    holder = bed.sbatch("sleep 600", "--gres=gpu:h100:1", "-w", NODE, "--time=10")
    bed.wait_job(holder, states={"RUNNING"})
    waiting = queue_large(bed)
    killed = relayout(bed, "--drain-timeout", "300", popen=True)
    try:
        slurmbed.wait_until("rl1 drained by the run", lambda: "DRAIN" in bed.node_state(
            NODE)["State"] and os.path.exists(bed.path("etc", "relayout-state.json.journal")),
            120)
    finally:
        killed.kill()
        killed.communicate(timeout=60)
    assert killed.returncode == -9
    assert sim_layout(bed, 2) == sim_layout(bed, 3) == ["1g.10gb"] * 7
    assert "DRAIN" in bed.node_state(NODE)["State"], bed.node_state(NODE)
    bed.run(["scancel", str(holder)])
    bed.wait_job(holder)
    def without_jobs() -> bool:
        states = set(bed.node_state(NODE)["State"].split("+"))
        return bool(states & {"IDLE", "DRAINED"}) and "COMPLETING" not in states
    slurmbed.wait_until("rl1 without jobs", without_jobs, 60)
    done = relayout(bed)
    assert done.returncode == 0, (done.stdout, done.stderr[:4000])
    assert "the interrupted run had changed none of its GPUs" in done.stderr, done.stderr
    assert not os.path.exists(bed.path("etc", "relayout-state.json.journal"))
    state = bed.node_state(NODE)
    assert "DRAIN" not in state["State"] and "INVAL" not in state["State"], state
    # It waited for slurmctld to hear from the resumed node (NOT_RESPONDING until its ping
    # answers), so its own round saw the node in service and changed it.
    assert sim_layout(bed, 2) != ["1g.10gb"] * 7 or sim_layout(bed, 3) != ["1g.10gb"] * 7, \
        (done.stdout, done.stderr[:4000])
    for job in waiting:
        info = bed.wait_job(job)
        assert info["JobState"] == "COMPLETED" and info["NodeList"] == NODE, info


def test_a_second_run_at_once_changes_nothing(fresh):
    bed = fresh
    from gpushare.admin.relayout.journal import run_lock

    with run_lock(bed.path("etc", "relayout-state.json")):
        queue_large(bed)
        second = relayout(bed)
    assert second.returncode == 2 and "another gpushare relayout or tidal --apply runs" in \
        second.stderr, second.stderr
    assert "DRAIN" not in bed.node_state(NODE)["State"]
    assert sim_layout(bed, 2) == ["1g.10gb"] * 7


def test_a_step_left_running_holds_the_node_and_the_next_run_finishes_it(fresh):
    """A node's step that a killed run left running (here: a holder of rl1's lock) keeps the
    next run's step off the node: that step waits, changes nothing and exits 3, so rl1 stays
    drained with the holder named, and the run after leaves it alone; once the holder has
    ended and an administrator resumed rl1, a run makes the change and the jobs run."""
    bed = fresh
    from gpushare.admin.relayout.journal import held

    waiting = queue_large(bed)
    with held(bed.path("run", f"relayout-{NODE}.lock"), "busy", record={"gpu": 2}):
        blocked = relayout(bed)
    assert blocked.returncode != 0, blocked.stdout
    state = bed.node_state(NODE)
    assert "DRAIN" in state["State"], state
    [node] = json.loads(blocked.stdout)["nodes"]
    assert "another relayout step holds node rl1" in node["failed"], node
    assert f'"pid": {os.getpid()}' in node["failed"] and '"gpu": 2' in node["failed"], node
    assert state["Reason"].startswith("gpushare relayout: GPU "), state
    assert "another relayout step holds node rl1" in state["Reason"], state
    assert sim_layout(bed, 1) == "whole"  # as the plan lays rl1 out: nothing changed
    assert sim_layout(bed, 2) == sim_layout(bed, 3) == ["1g.10gb"] * 7
    again = relayout(bed)  # the drain is the administrator's to lift, not a run's
    assert json.loads(again.stdout)["nodes"] == [], again.stdout
    assert bed.node_state(NODE)["Reason"] == state["Reason"]
    bed.resume(NODE)
    slurmbed.wait_until("rl1 idle", lambda: bed.node_state(NODE)["State"] == "IDLE")
    done = relayout(bed)
    assert done.returncode == 0, (done.stdout, done.stderr[:4000])
    with open(bed.path("etc", "relayout-state.json")) as handle:
        record = json.load(handle)["gpus"].get(NODE)
    assert record, ("no change after the resume", done.stdout[-3000:])
    for gpu, entry in record.items():
        assert entry["layout"] == "2x3g.40gb" and sim_layout(bed, int(gpu)) == [
            "3g.40gb", "3g.40gb"], (gpu, entry)
    assert "DRAIN" not in bed.node_state(NODE)["State"]
    for job in waiting:
        info = bed.wait_job(job)
        assert info["JobState"] == "COMPLETED" and info["NodeList"] == NODE, info


def test_an_included_nodename_line_is_refused_before_anything_is_drained(fresh):
    bed = fresh
    nodes = bed.path("etc", "nodes-rl1.conf")
    with open(bed.conf) as handle:
        lines = handle.readlines()
    own = [line for line in lines if re.match(rf"NodeName={NODE}\b", line)]
    assert own, lines
    with open(nodes, "w") as handle:
        handle.writelines(own)
    with open(bed.conf, "w") as handle:
        handle.writelines([line for line in lines if line not in own] + [f"Include {nodes}\n"])
    queue_large(bed)
    done = relayout(bed)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"nothing drained: no NodeName line names {NODE}" in done.stderr, done.stderr
    assert f"it Includes {nodes}" in done.stderr, done.stderr
    assert "DRAIN" not in bed.node_state(NODE)["State"]
    assert sim_layout(bed, 2) == sim_layout(bed, 3) == ["1g.10gb"] * 7


def test_a_symlinked_slurm_conf_is_written_through_and_stays_a_link(fresh):
    bed = fresh
    real_dir = bed.path("etc", "real")
    os.makedirs(real_dir, mode=0o755, exist_ok=True)
    real = os.path.join(real_dir, "slurm.conf")
    os.replace(bed.conf, real)
    os.symlink(real, bed.conf)
    try:
        waiting = queue_large(bed)
        done = relayout(bed)
        assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
        assert os.path.islink(bed.conf)
        with open(real) as handle:
            assert "3g.40gb" in handle.read()
        for job in waiting:
            assert bed.wait_job(job)["JobState"] == "COMPLETED"
    finally:
        os.unlink(bed.conf)
        os.replace(real, bed.conf)  # the reset writes the saved text into a plain file


def test_a_run_killed_between_nodes_settles_the_other_on_the_next(fresh):
    """Two nodes change, one after the other (--parallel 1): rl3, the spare, gets a relayout
    menu too, and eight 3g.40gb jobs of two users wait, more than rl1 alone can start. A job
    without a GPU keeps rl3 from going idle. The controller dies (SIGKILL) once rl1 is changed
    and back while rl3 is drained and untouched. The next run rolls rl3 back (resumed, its
    layout as it was), leaves rl1 as it is, and goes on; every waiting job runs."""
    bed = fresh
    from gpushare.admin.relayout.journal import load_journal

    plan = bed.path("etc", "plan.yaml")
    with open(plan) as handle:
        text = handle.read()
    spare = "  - name: small\n    nodes: rl3\n"
    assert spare in text, text
    menu = ("    relayout:\n      min_interval_s: 0\n      menu:\n        - 7x1g.10gb\n"
            "        - 2x3g.40gb\n")
    head, _sep, tail = text.partition(spare)
    with open(plan, "w") as handle:
        handle.write(head + spare + menu + tail)
    bed.resume("rl3")
    try:
        slurmbed.wait_until("rl3 idle", lambda: bed.node_state("rl3")["State"] == "IDLE")
        holder = bed.sbatch("sleep 600", "-w", "rl3", "--time=10")
        bed.wait_job(holder, states={"RUNNING"})
        # Two users' jobs: one user alone moves at most a few GPUs' worth a round.
        waiting = [bed.sbatch("true", "--gres=gpu:3g.40gb:1", "--time=30", user=user)
                   for user in slurmbed.TEST_USERS for _ in range(4)]
        state_path = bed.path("etc", "relayout-state.json")

        def phases() -> list[tuple[str, str]]:
            journal = load_journal(state_path)
            return [] if journal is None else [(e.node, e.phase) for e in journal.nodes]

        killed = relayout(bed, "--parallel", "1", "--max-changes", "8", "--drain-timeout",
                          "600", popen=True)
        try:
            slurmbed.wait_until("rl1 changed and back, rl3 drained and waiting", lambda: phases()
                                == [(NODE, "done"), ("rl3", "planned")], 300)
        finally:
            killed.kill()
            out, err = killed.communicate(timeout=60)
            bed.adopt_slurmctld()
        assert killed.returncode == -9, (out, err[-4000:])
        assert phases() == [(NODE, "done"), ("rl3", "planned")], phases()
        journal = load_journal(state_path)
        assert journal is not None
        changed = [step.gpu for step in journal.nodes[0].gpus]  # which: the release's choice
        assert changed and all(sim_layout(bed, gpu) == ["3g.40gb", "3g.40gb"]
                               for gpu in changed), changed
        assert "DRAIN" not in bed.node_state(NODE)["State"], bed.node_state(NODE)
        assert "DRAIN" in bed.node_state("rl3")["State"], bed.node_state("rl3")
        assert sim_layout(bed, 0, "rl3") == ["1g.10gb"] * 7
        bed.run(["scancel", str(holder)])
        bed.wait_job(holder)
        done = relayout(bed)
        assert done.returncode == 0, (done.stdout, done.stderr[-4000:])
        recovered = json.loads(done.stderr[done.stderr.index('{\n  "recovered"'):])
        assert [n["node"] for n in recovered["nodes"]] == ["rl3"], recovered
        assert "rl3: resumed: the interrupted run had changed none of its GPUs" in \
            recovered["nodes"][0]["log"], recovered
        assert not os.path.exists(bed.path("etc", "relayout-state.json.journal"))
        assert all(sim_layout(bed, gpu) == ["3g.40gb", "3g.40gb"] for gpu in changed)
        for name in (NODE, "rl3"):
            state = bed.node_state(name)
            assert "DRAIN" not in state["State"] and "INVAL" not in state["State"], state
        for job in waiting:
            info = bed.wait_job(job)
            assert info["JobState"] == "COMPLETED", info
    finally:
        bed.run(["scancel", "--quiet", "--full", "-u", slurmbed.TEST_USERS[1]], check=False)
        bed.run(["scontrol", "update", "NodeName=rl3", "State=DRAIN", "Reason=spare"])


def test_a_configless_slurm_is_changed_through_slurmctlds_file_and_never_slurmds_copy(fresh):
    """slurmctld serves slurm.conf to the nodes (SlurmctldParameters=enable_configless, read
    from the live slurmctld) and rl1's slurmd runs configless (``--conf-server``, no
    SLURM_CONF), keeping what slurmctld sent it in its spool's conf-cache. A --slurm-conf
    naming that copy, or a file that is not there, is refused before anything is drained;
    the file slurmctld reads is changed, and the configless slurmd follows it."""
    bed = fresh
    with open(bed.conf, "a") as handle:
        handle.write("SlurmctldParameters=enable_configless\n")
    bed.restart_slurmctld()
    slurmbed.wait_until("slurmctld serves its configuration", lambda: "enable_configless" in
                        bed.run(["scontrol", "show", "config"], check=False).stdout)
    cache = bed.path("spool", NODE, "conf-cache", "slurm.conf")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cache)
    bed.stop_slurmd(NODE)
    bed.start_slurmd(NODE, conf_server=f"127.0.0.1:{bed.ctld_port}")
    try:
        slurmbed.wait_until("rl1's configless slurmd fetched its configuration",
                            lambda: os.path.exists(cache), 90)
        slurmbed.wait_until("slurmctld hears from rl1 again", lambda: registered(bed) and
                            bed.node_state(NODE)["State"] == "IDLE")
        with open(bed.path("run", f"slurmd-{NODE}.pid")) as handle:
            pid = int(handle.read())
        with open(f"/proc/{pid}/environ", "rb") as handle:
            assert b"SLURM_CONF=" not in handle.read()
        waiting = queue_large(bed)
        copy = relayout(bed, "--slurm-conf", cache)
        assert copy.returncode == 2, (copy.stdout, copy.stderr)
        assert f"--slurm-conf {cache} is slurmd's copy of a configless slurm.conf" in \
            copy.stderr, copy.stderr
        assert "name the file slurmctld reads" in copy.stderr, copy.stderr
        absent = bed.path("etc", "absent", "slurm.conf")
        missing = relayout(bed, "--slurm-conf", absent)
        assert missing.returncode == 2, (missing.stdout, missing.stderr)
        assert f"--slurm-conf {absent} does not exist: this Slurm is configless" in \
            missing.stderr
        assert "DRAIN" not in bed.node_state(NODE)["State"]
        assert sim_layout(bed, 2) == sim_layout(bed, 3) == ["1g.10gb"] * 7
        assert not os.path.exists(bed.path("etc", "relayout-state.json.journal"))
        done = relayout(bed)
        assert done.returncode == 0, (done.stdout, done.stderr[-4000:])
        with open(bed.conf) as handle:
            assert "3g.40gb" in handle.read()
        for job in waiting:
            assert bed.wait_job(job)["JobState"] == "COMPLETED"
        # The copy the configless slurmd runs on came from slurmctld's changed file.
        with open(cache) as handle:
            assert "3g.40gb" in handle.read()
    finally:
        bed.stop_slurmd(NODE)
        bed.start_slurmd(NODE)
