# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check`` on a node of the real local Slurm and against its slurmctld."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import slurmbed

pytestmark = pytest.mark.slurm

NODE = "n5"
SCONTROL = shutil.which("scontrol") or "/usr/bin/scontrol"
SINFO = shutil.which("sinfo") or "/usr/bin/sinfo"

# A node's cgroup v2 hierarchy, as /proc/self/mountinfo lists it (the fake proc roots' own).
CGROUP2_MOUNTINFO = ("35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - "
                     "cgroup2 cgroup2 rw,nsdelegate\n")


def proc_root(bed, ptrace_scope: str = "1") -> str:
    """A proc root whose kernel.yama.ptrace_scope is ``ptrace_scope`` and which mounts
    cgroup v2: 1 and a cgroup for each daemon, as a node running gpushare should have them,
    whatever this host's kernel says (it may have no Yama, a release root no cgroup v2)."""
    root = bed.path(f"proc-ptrace-{ptrace_scope}")
    os.makedirs(os.path.join(root, "sys", "kernel", "yama"), exist_ok=True)
    os.makedirs(os.path.join(root, "self"), exist_ok=True)
    with open(os.path.join(root, "sys", "kernel", "yama", "ptrace_scope"), "w") as handle:
        handle.write(ptrace_scope + "\n")
    with open(os.path.join(root, "self", "mountinfo"), "w") as handle:
        handle.write(CGROUP2_MOUNTINFO)
    return root


def check(bed, *args: str, profile: str = "",
          ptrace_scope: str = "1") -> subprocess.CompletedProcess[str]:
    env = dict(bed.env, PYTHONPATH=os.path.join(slurmbed.REPO, "src"))
    argv = [sys.executable, "-m", "gpushare.cli", "check", "--plan", slurmbed.BED_PLAN,
            "--scontrol", SCONTROL, "--sinfo", SINFO, *args]
    if "--cluster" not in args:
        argv += ["--node", NODE, "--gres-conf", bed.path("etc", "gres.conf"),
                 "--device-root", bed.path("dev"),
                 "--source", "sim:" + (profile or bed.path("nodes", f"{NODE}.json")),
                 "--proc-root", proc_root(bed, ptrace_scope)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def mps_dir(bed) -> str:
    return os.path.join(bed.state_of(NODE), "mps")


def mount_mps_dir(bed) -> None:
    """The node's MPS directories on a small tmpfs of their own, as a site sets them up."""
    os.makedirs(mps_dir(bed), mode=0o755, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=8m,nr_inodes=4096",
                    "gpushare-test-mps", mps_dir(bed)], check=True)


@pytest.fixture(autouse=True)
def own_mps_mount(request, bed):
    """Every test here but the one about it sees the MPS directories set up as they should
    be: on a file system apart from root's state."""
    if request.node.name.startswith("test_mps_dirs_beside_roots_state"):
        yield
        return
    mount_mps_dir(bed)
    try:
        yield
    finally:
        subprocess.run(["umount", mps_dir(bed)], check=True)


def test_mps_dirs_beside_roots_state_are_a_warning_until_mounted_apart(clean_bed):
    """What users write in their MPS directories must not fill root's records. Each daemon
    on a tmpfs of its own (the default ``mps_space=``), no user writes beside root's state:
    nothing to warn of. With ``mps_space=shared``, check warns while the users' directories
    share a file system with root's, and, as root, reports a nearly full one."""
    os.makedirs(mps_dir(clean_bed), mode=0o755, exist_ok=True)
    report = json.loads(check(clean_bed, "--json").stdout)
    assert [f for f in report["findings"] if f["where"] == mps_dir(clean_bed)] == [], report
    line = clean_bed.plugstack_line()
    clean_bed.write_plugstack(line.rstrip("\n") + " mps_space=shared\n")
    try:
        _shared_mps_dir_findings(clean_bed)
    finally:
        clean_bed.write_plugstack(line)


def _shared_mps_dir_findings(clean_bed) -> None:
    report = json.loads(check(clean_bed, "--json").stdout)
    shared = [f for f in report["findings"] if f["where"] == mps_dir(clean_bed)]
    assert len(shared) == 1 and shared[0]["severity"] == "warning", report
    assert "share a file system with root's job records" in shared[0]["what"]
    assert "run-gpushare-mps.mount" in shared[0]["fix"]
    mount_mps_dir(clean_bed)
    try:
        report = json.loads(check(clean_bed, "--json").stdout)
        assert [f for f in report["findings"] if f["where"] == mps_dir(clean_bed)] == []
        filler = os.path.join(mps_dir(clean_bed), "filler")
        with open(filler, "wb") as handle:
            handle.write(b"\0" * ((8 << 20) - (1 << 19)))  # all but 512 KiB of 8 MiB
        report = json.loads(check(clean_bed, "--json").stdout)
        (low,) = [f for f in report["findings"] if f["where"] == mps_dir(clean_bed)]
        assert "less than 10% of its space free" in low["what"], low
    finally:
        subprocess.run(["umount", mps_dir(clean_bed)], check=True)


@pytest.fixture
def wrong_profile(clean_bed, tmp_path):
    """n5's profile with one of GPU 0's 1g.10gb slices (Slurm's) recreated as 2g.20gb."""
    with open(clean_bed.path("nodes", f"{NODE}.json")) as handle:
        profile = json.load(handle)
    mig = profile["gpus"][0]["mig_devices"][0]
    mig["profile"], mig["memory_mib"] = "2g.20gb", 19968
    mig.pop("name", None)
    path = tmp_path / "n5-wrong.json"
    path.write_text(json.dumps(profile))
    yield str(path)
    clean_bed.resume(NODE)
    clean_bed.wait_idle()


def test_bed_node_warns_of_its_pending_mig_change(bed):
    """The A100 profile has MIG enable pending on GPU 3 (Kubernetes'): a warning, exit 1."""
    result = check(bed, "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["status"] == 1, result.stdout
    (finding,) = report["findings"]
    assert finding["severity"] == "warning" and "GPU 3" in finding["what"], finding


def test_healthy_node_is_clean(bed, tmp_path):
    with open(bed.path("nodes", f"{NODE}.json")) as handle:
        profile = json.load(handle)
    for gpu in profile["gpus"]:
        gpu["mig"]["pending"] = gpu["mig"]["current"]
    path = tmp_path / "n5-settled.json"
    path.write_text(json.dumps(profile))
    result = check(bed, profile=str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all well" in result.stdout
    as_json = json.loads(check(bed, "--json", profile=str(path)).stdout)
    assert as_json["status"] == 0 and as_json["findings"] == []


def test_ptrace_scope_0_is_a_warning_on_a_node_running_the_plugin(bed):
    """A job could take over its user's MPS daemon, outside the job's cgroup."""
    result = check(bed, "--json", ptrace_scope="0")
    report = json.loads(result.stdout)
    (finding,) = [f for f in report["findings"] if f["where"].endswith("ptrace_scope")]
    assert finding["severity"] == "warning" and "ptrace_scope is 0" in finding["what"]
    assert result.returncode >= 1 and report["status"] >= 1, result.stdout
    assert "DRAIN" not in bed.node_state(NODE)["State"]  # a warning drains nothing


def test_disagreeing_inventory_is_reported(bed, wrong_profile):
    result = check(bed, "--json", profile=wrong_profile)
    assert result.returncode == 2, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == 2 and report["node"] == NODE
    whats = [f["what"] for f in report["findings"] if f["severity"] == "error"]
    assert any("2g.20gb" in w and "1g.10gb" in w for w in whats), whats
    assert all(f["where"] and f["fix"] for f in report["findings"])
    text = check(bed, profile=wrong_profile)
    assert text.returncode == 2 and "ERROR" in text.stdout and "fix:" in text.stdout


@pytest.mark.smoke
def test_drain_names_the_problem_in_slurm(bed, wrong_profile):
    result = check(bed, "--drain", profile=wrong_profile)
    assert result.returncode == 2, result.stdout + result.stderr
    state = bed.node_state(NODE)
    assert "DRAIN" in state["State"], state
    assert state["Reason"].startswith("gpushare: "), state
    assert "2g.20gb" in state["Reason"] or "1g.10gb" in state["Reason"], state
    # slurmctld's view now shows the node drained by gpushare.
    cluster = check(bed, "--cluster", "--backend", "sinfo", "--json")
    report = json.loads(cluster.stdout)
    drained = [f for f in report["findings"] if f["where"] == f"slurmctld node {NODE}"]
    assert drained and "gpushare:" in drained[0]["what"], report
    assert cluster.returncode == 1, cluster.stdout  # a drained node is a warning


def test_cluster_view_is_clean_when_healthy(clean_bed):
    clean_bed.wait_idle()
    result = check(clean_bed, "--cluster", "--backend", "sinfo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all well" in result.stdout
    auto = json.loads(check(clean_bed, "--cluster", "--json").stdout)
    assert auto["status"] == 0 and auto["findings"] == [], auto
