# SPDX-License-Identifier: GPL-2.0-or-later
"""Device verification at job start against the real local Slurm: the rendered gres.conf is
what slurmd runs with, healthy MIG and whole-GPU jobs run, and a slice that disagrees with the
node's (simulated) NVML, a Kubernetes-owned device or a foreign process stops the job in the
prolog and drains the node with gpushare's reason."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Callable, Iterator

import pytest

import slurmbed

pytestmark = pytest.mark.slurm

USER = slurmbed.TEST_USERS[0]
MIG_NODE = "n5"
CVD_LINE = re.compile(r"^CVD=(.*)$", re.MULTILINE)


def gpushare(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.path.join(slurmbed.REPO, "src"))
    return subprocess.run([sys.executable, "-m", "gpushare.cli", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def wait_for(what: str, probe: Callable[[], object], timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout:.0f}s")


@contextlib.contextmanager
def node_profile(bed, edit: Callable[[dict], None]) -> Iterator[dict]:
    """Change the MIG node's simulated NVML (the plugin reads it at each prolog)."""
    path = bed.path("nodes", f"{MIG_NODE}.json")
    with open(path) as handle:
        original = handle.read()
    profile = json.loads(original)
    edit(profile)
    with open(path, "w") as handle:
        json.dump(profile, handle)
    try:
        yield profile
    finally:
        with open(path, "w") as handle:
            handle.write(original)


@contextlib.contextmanager
def plugin_plan(bed, text: str) -> Iterator[None]:
    """Replace the ownership plan the plugin's plan= points at."""
    path = bed.path("etc", "plan.yaml")
    with open(path) as handle:
        original = handle.read()
    with open(path, "w") as handle:
        handle.write(text)
    try:
        yield
    finally:
        with open(path, "w") as handle:
            handle.write(original)


def marker_script(bed, tag: str) -> tuple[str, str]:
    """A job script that leaves a file behind if it runs at all."""
    marker = os.path.join(bed.out_dir, f"ran-{tag}-{time.monotonic_ns()}")
    return f"touch {marker}; echo CVD=$CUDA_VISIBLE_DEVICES", marker


def stopped_by_prolog(bed, job_id: int) -> dict[str, str]:
    """Wait until Slurm has given up starting the job (requeued/held or failed)."""
    def probe() -> dict[str, str]:
        info = bed.job(job_id)
        state, reason = info.get("JobState", ""), info.get("Reason", "")
        if state in slurmbed.TERMINAL_STATES:
            return info
        if state == "PENDING" and (int(info.get("Restarts", "0")) > 0 or "held" in reason.lower()
                                   or "launch_failed" in reason.lower()):
            return info
        return {}
    return wait_for(f"job {job_id} stopped", probe)  # type: ignore[return-value]


def drain_reason(bed, node: str) -> str:
    def probe() -> str:
        state = bed.node_state(node)
        return state.get("Reason", "") if "DRAIN" in state.get("State", "") else ""
    return wait_for(f"{node} drained", probe)  # type: ignore[return-value]


@pytest.fixture
def mig_bed(clean_bed):
    """The bed, with n5 resumed and idle again after the test (and its held jobs gone)."""
    yield clean_bed
    clean_bed.run(["scancel", "--quiet", "-u", USER], check=False)
    clean_bed.resume(MIG_NODE)
    clean_bed.wait_idle()


# --------------------------------------------------------------------------------------------
# 1. slurmd runs with the rendered gres.conf


def test_rendered_gres_conf_is_what_slurmd_runs_with(bed):
    from gpushare.admin.plan import load_plan
    from gpushare.admin.render import slurm_node_gres
    from gpushare.admin.slurm_client import parse_node_gres, parse_sinfo_json
    from gpushare.gpu.gresconf import load_gres_conf, parse_gres_conf

    # sinfo --json: a "nodes" list on 22.05, groups of alike nodes ("sinfo") on 24.11.
    states = {n.name: n for n in parse_sinfo_json(bed.run(["sinfo", "--json"]).stdout)}
    assert sorted(states) == sorted(node.name for node in bed.nodes)
    for node in states.values():
        assert node.states == ("IDLE",), node
    show = bed.node_state(MIG_NODE)
    for gres_type in ("1g.10gb", "a100"):
        assert f"gpu:{gres_type}:" in show["Gres"], show
    assert "3g.40gb" not in show["Gres"], show  # GPU 1 and its slices are Kubernetes'
    assert show["Gres"].startswith("gpu:a100:1,"), show  # whole GPUs come first
    # The CLI renders for n5 from its simulated NVML what the bed's slurmd was started with.
    rendered = gpushare("render", "gres", "--plan", slurmbed.BED_PLAN, "--node", MIG_NODE,
                        "--source", "sim:" + bed.path("nodes", f"{MIG_NODE}.json"),
                        "--device-root", bed.path("dev"))
    assert rendered.returncode == 0, rendered.stderr
    cli = parse_gres_conf(rendered.stdout).devices(MIG_NODE)
    running = load_gres_conf(bed.path("etc", "gres.conf")).devices(MIG_NODE)
    assert [(d.type, d.files) for d in cli] == [(d.type, d.files) for d in running]
    # slurmctld's GRES for every node is the count of each type gres.conf gives it.
    plan = load_plan(slurmbed.BED_PLAN)
    conf = load_gres_conf(bed.path("etc", "gres.conf"))
    for name, node in states.items():
        counts = Counter(d.type for d in conf.devices(name))
        want = {f"gpu:{t}:{n}" for t, n in counts.items()}
        have = {g for g in node.gres.split(",") if g.startswith("gpu:")}
        assert have == want, (name, node.gres)
        # slurmctld names a node's mps after its GPU type (mps:h100:800): same total count.
        planned = parse_node_gres(slurm_node_gres(plan.group_of(name)))
        actual = parse_node_gres(node.gres)
        for kind in ("gpu", "mps", "shard"):
            assert {k: v for k, v in actual.items() if k[0] == kind and kind == "gpu"} == \
                {k: v for k, v in planned.items() if k[0] == kind and kind == "gpu"}, name
            assert sum(v for k, v in actual.items() if k[0] == kind) == \
                sum(v for k, v in planned.items() if k[0] == kind), (name, kind)


# --------------------------------------------------------------------------------------------
# 2. healthy jobs run


@pytest.mark.smoke
def test_mig_slice_job_runs_with_its_device(mig_bed):
    script, marker = marker_script(mig_bed, "1g")
    job_id = mig_bed.sbatch(script, "-w", MIG_NODE, "--gres=gpu:1g.10gb:1")
    info = mig_bed.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    assert os.path.exists(marker)
    # Under ConstrainDevices the task counts its devices from 0; without, Slurm's indices
    # (the whole a100 is index 0 on n5, the slices follow).
    expected = "0" if mig_bed.use_cgroup() else "1"
    assert CVD_LINE.search(mig_bed.output(job_id)).group(1) == expected


def test_two_mig_slices_run(mig_bed):
    job_id = mig_bed.sbatch("echo CVD=$CUDA_VISIBLE_DEVICES", "-w", MIG_NODE,
                            "--gres=gpu:1g.10gb:2")
    assert mig_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    expected = "0,1" if mig_bed.use_cgroup() else "1,2"
    assert CVD_LINE.search(mig_bed.output(job_id)).group(1) == expected


def test_whole_gpu_on_the_mig_node_gets_its_device(mig_bed):
    # Slurm 22.05 without AutoDetect splits each MultipleFiles line into one GPU per file;
    # with the whole GPU first and one MIG profile per node, every type keeps its device.
    job_id = mig_bed.sbatch("echo CVD=$CUDA_VISIBLE_DEVICES", "-w", MIG_NODE,
                            "--gres=gpu:a100:1")
    assert mig_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    assert CVD_LINE.search(mig_bed.output(job_id)).group(1) == "0", mig_bed.output(job_id)


def test_kubernetes_slice_cannot_be_asked_from_slurm(mig_bed):
    result = mig_bed.run(["sbatch", "-w", MIG_NODE, "--gres=gpu:3g.40gb:1", "--wrap", "true"],
                         user=slurmbed.TEST_USERS[0], check=False)
    assert result.returncode != 0, result.stdout
    assert "Requested node configuration is not available" in result.stderr, result.stderr


def test_whole_gpu_job_runs(mig_bed):
    job_id = mig_bed.sbatch("echo CVD=$CUDA_VISIBLE_DEVICES", "-w", "n1", "--gres=gpu:h100:2")
    assert mig_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    assert CVD_LINE.search(mig_bed.output(job_id)).group(1) == "0,1"


# --------------------------------------------------------------------------------------------
# 3-5. the prolog stops a job on the wrong device


def _slice_becomes_2g(profile: dict) -> None:
    first = profile["gpus"][0]["mig_devices"][0]
    first["profile"], first["memory_mib"] = "2g.20gb", 19968


def _foreign_process(profile: dict) -> None:
    profile["gpus"][0]["mig_devices"][0]["processes"] = [
        {"pid": 4242, "used_memory_mib": 1024, "kind": "compute"}]


def _assert_refused(bed, tag: str, *words: str) -> str:
    script, marker = marker_script(bed, tag)
    job_id = bed.sbatch(script, "-w", MIG_NODE, "--gres=gpu:1g.10gb:1")
    info = stopped_by_prolog(bed, job_id)
    assert info["JobState"] != "COMPLETED", info
    reason = drain_reason(bed, MIG_NODE)
    assert reason.startswith("gpushare:"), reason
    for word in words:
        assert word in reason, (word, reason)
    assert not os.path.exists(marker), "the job's script ran"
    return reason


def test_slice_of_another_profile_stops_the_job_and_drains(mig_bed):
    with node_profile(mig_bed, _slice_becomes_2g):
        reason = _assert_refused(mig_bed, "2g", "2g.20gb", "1g.10gb")
    assert "MIG-0f9e260d" in reason or "GPU 0" in reason, reason
    # Restored and resumed, the node runs the same request again.
    mig_bed.resume(MIG_NODE)
    mig_bed.run(["scancel", "--quiet", "-u", USER], check=False)
    mig_bed.wait_idle()
    job_id = mig_bed.sbatch("true", "-w", MIG_NODE, "--gres=gpu:1g.10gb:1")
    assert mig_bed.wait_job(job_id)["JobState"] == "COMPLETED"


def _slurmd_log(bed) -> str:
    with open(bed.path("log", f"slurmd-{MIG_NODE}.log"), errors="replace") as handle:
        return handle.read()


def test_verify_warn_runs_the_job_and_logs(mig_bed):
    mig_bed.write_plugstack(mig_bed.plugstack_line().rstrip("\n") + " verify=warn\n")
    with node_profile(mig_bed, _slice_becomes_2g):
        script, marker = marker_script(mig_bed, "warn")
        job_id = mig_bed.sbatch(script, "-w", MIG_NODE, "--gres=gpu:1g.10gb:1")
        assert mig_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    assert os.path.exists(marker)
    assert "DRAIN" not in mig_bed.node_state(MIG_NODE)["State"]
    warned = [line for line in _slurmd_log(mig_bed).splitlines()
              if f"job {job_id}:" in line and "2g.20gb" in line]
    assert warned, mig_bed.logs()


def test_verify_off_skips_the_check(mig_bed):
    mig_bed.write_plugstack(mig_bed.plugstack_line().rstrip("\n") + " verify=off\n")
    with node_profile(mig_bed, _slice_becomes_2g):
        script, marker = marker_script(mig_bed, "off")
        job_id = mig_bed.sbatch(script, "-w", MIG_NODE, "--gres=gpu:1g.10gb:1")
        assert mig_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    assert os.path.exists(marker)
    assert "DRAIN" not in mig_bed.node_state(MIG_NODE)["State"]
    assert not [line for line in _slurmd_log(mig_bed).splitlines()
                if f"job {job_id}:" in line and "2g.20gb" in line]


def test_kubernetes_owned_slice_is_refused(mig_bed):
    with open(slurmbed.BED_PLAN) as handle:
        text = handle.read()
    kube = text.replace("      0:\n        owner: slurm\n", "      0:\n        owner: kubernetes\n")
    assert kube != text
    with plugin_plan(mig_bed, kube):
        _assert_refused(mig_bed, "kube", "kubernetes")


def test_foreign_process_on_the_slice_is_refused(mig_bed):
    with node_profile(mig_bed, _foreign_process):
        _assert_refused(mig_bed, "proc", "4242")


# --------------------------------------------------------------------------------------------
# 7. inventory of a bed node


def test_inventory_of_the_mig_node_matches_the_plan(bed):
    from gpushare.admin.plan import load_plan

    result = gpushare("inventory", "--json", "--source",
                      "sim:" + bed.path("nodes", f"{MIG_NODE}.json"))
    assert result.returncode == 0, result.stderr
    inventory = json.loads(result.stdout)
    group = load_plan(slurmbed.BED_PLAN).group_of(MIG_NODE)
    assert len(inventory["gpus"]) == len(group.gpus)
    for planned, gpu in zip(group.gpus, inventory["gpus"]):
        assert planned.index == gpu["index"]
        assert gpu["mig_current"] == planned.mig, gpu["index"]
        assert Counter(m["profile"] for m in gpu["mig_devices"]) == \
            Counter(s.profile for s in planned.slices), gpu["index"]
    # Every device file slurmd was given for n5 is one NVML reports (re-rooted to the bed).
    from gpushare.gpu.gresconf import load_gres_conf

    reported = {os.path.basename(path) for gpu in inventory["gpus"]
                for path in [gpu["device_dir"] + f"/nvidia{gpu['minor']}"]
                + [f for mig in gpu["mig_devices"] for f in mig["caps_files"]]}
    slurm_files = {os.path.basename(f)
                   for d in load_gres_conf(bed.path("etc", "gres.conf")).devices(MIG_NODE)
                   for f in d.files}
    assert slurm_files and slurm_files <= reported, slurm_files - reported


# --------------------------------------------------------------------------------------------
# 8. Slurm 26.05's gres.conf Flags=env_uuid: jobs' GPUs named by UUID

UUID_NODE = "uu1"
UUID_PLAN = f"""\
version: 1
slurm: {{env_uuid: true, mps_units_per_gpu: 100, sharing_flag: all_sharing}}
node_groups:
  - name: train
    nodes: {UUID_NODE}
    gpu_model: h100-80gb
    gpus: 8
    layout:
      all: {{owner: slurm, mps: 100}}
"""
ENV_LINES = ("for v in SLURM_JOB_GPUS CUDA_VISIBLE_DEVICES GPUSHARE_GPUS GPUSHARE_GPU_UUIDS "
             "CUDA_MPS_PIPE_DIRECTORY; do echo \"$v=${!v}\"; done; sleep 2")


@pytest.fixture(scope="module")
def uuid_bed(tmp_path_factory):
    """One node of 8 simulated H100s whose UUIDs slurmd takes from fake_gpus.conf, with the
    plan's gres.conf (Flags=env_uuid); its own root, ports (+260) and node name."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    if slurmbed.slurm_release() < (26, 5):
        pytest.skip(f"Slurm {slurmbed.slurm_release()} has no gres.conf Flags=env_uuid")
    root = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed") + "-uuid"
    plan = tmp_path_factory.mktemp("plan") / "uuid.yaml"
    plan.write_text(UUID_PLAN)
    cluster = slurmbed.plan_bed(
        root=root, port_base=int(os.environ.get("GPUSHARE_BED_PORT", "17200")) + 260,
        plan_path=str(plan), profiles={"train": slurmbed.PROFILES["train"]}, fake_gpus=True)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def uuid_of_minor() -> dict[str, str]:
    with open(slurmbed.PROFILES["train"]) as handle:
        return {str(gpu["minor"]): gpu["uuid"] for gpu in json.load(handle)["gpus"]}


def job_env(bed, job_id: int) -> dict[str, str]:
    info = bed.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", (info, bed.output(job_id, ""), bed.logs(30))
    prologs = [line for line in bed.debug_lines()
               if f"job={job_id} cb=job_prolog" in line and " rc=" in line]
    assert all(line.endswith(" rc=0") for line in prologs), prologs
    assert "DRAIN" not in bed.node_state(UUID_NODE)["State"]
    return dict(line.split("=", 1) for line in bed.output(job_id).splitlines() if "=" in line)


def test_env_uuid_gives_gpu_jobs_uuids_the_check_and_the_daemon_follow(uuid_bed):
    """Slurm names a gpu job's GPUs by UUID and keeps SLURM_JOB_GPUS as indices: the
    prolog's check passes, and a private MPS job's daemon and tasks get those very GPUs,
    the tasks keeping Slurm's UUIDs (which name the daemon's devices) instead of 0,1."""
    uuids = uuid_of_minor()
    whole = job_env(uuid_bed, uuid_bed.sbatch(ENV_LINES, "--gres=gpu:h100:2"))
    named = [uuids[index] for index in whole["SLURM_JOB_GPUS"].split(",")]
    assert whole["CUDA_VISIBLE_DEVICES"].split(",") == named, whole
    private = job_env(uuid_bed, uuid_bed.sbatch(ENV_LINES, "--gres=gpu:h100:2", "--gpu-mps"))
    named = [uuids[index] for index in private["GPUSHARE_GPUS"].split(",")]
    assert private["GPUSHARE_GPU_UUIDS"].split(",") == named, private
    assert private["CUDA_VISIBLE_DEVICES"].split(",") == named, private
    assert private["CUDA_MPS_PIPE_DIRECTORY"], private
    # gres/mps still names its GPU by index: the shared job's task sees the daemon's 0.
    shared = job_env(uuid_bed, uuid_bed.sbatch(ENV_LINES, "--gres=mps:25"))
    assert shared["CUDA_VISIBLE_DEVICES"] == "0", shared
    assert shared["GPUSHARE_GPU_UUIDS"] == uuids[shared["GPUSHARE_GPUS"]], shared
