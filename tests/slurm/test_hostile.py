# SPDX-License-Identifier: GPL-2.0-or-later
"""What a hostile or careless user does to their own MPS directories, and what a node fault
does to their job, inside the real local Slurm. For each attack: the node stays in service
where the user caused it, the job gets the right message, the next job of the same user
and of another user runs, and nothing stays behind. A node fault drains the node with its
cause and requeues the job as Slurm does after a failing prolog."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal

import pytest
from tests.slurm.test_mps import (
    FAULT_NODE,
    NODE,
    U1,
    U2,
    assert_nothing_left,
    job_records,
    mps_records,
    set_fault,
    slurmd_log,
    wait_drained,
)
from tests.slurm.test_mps import mps_bed as _mps_bed  # noqa: F401  (a fixture)

from mps_standin.harness import running as alive
from slurmbed import WORKER_STARTED, eligible_in, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def hostile_bed(_mps_bed):  # noqa: F811  (the fixture imported above)
    """test_mps.py's bed: no fault set, no MPS state, checked clean after the test."""
    return _mps_bed


def run_shared(bed, script: str, node: str = NODE, user: str = U1,
               *args: str) -> tuple[dict[str, str], str]:
    """A shared job's end state and output."""
    job_id = bed.sbatch(script, "--gres=mps:25", "-w", node, "-c1", *args, user=user)
    info = bed.wait_job(job_id, timeout=180)
    return info, bed.output(job_id)


def assert_in_service_and_clean(bed, node: str = NODE) -> None:
    """The node is not drained, the same user's next shared job and another user's run
    there, and no daemon, directory, record or trash is left."""
    assert "DRAIN" not in bed.node_state(node)["State"], bed.node_state(node)
    for user in (U1, U2):
        info, output = run_shared(bed, "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY", node, user)
        assert info["JobState"] == "COMPLETED", (user, info, output)
        assert f"PIPE={bed.state_of(node)}/mps/u" in output, (user, output)
    assert "DRAIN" not in bed.node_state(node)["State"], bed.node_state(node)
    assert_nothing_left(bed)


def test_a_70_deep_tree_in_the_users_log_directory(hostile_bed):
    bed = hostile_bed
    info, output = run_shared(
        bed, "cd \"$CUDA_MPS_LOG_DIRECTORY\" && mkdir -p $(printf 'd/%.0s' $(seq 70)) && "
        "cd \"$CUDA_MPS_PIPE_DIRECTORY\" && mkdir -p $(printf 'p/%.0s' $(seq 300)) && "
        "echo MADE")
    assert info["JobState"] == "COMPLETED" and "MADE" in output, (info, output)
    assert_in_service_and_clean(bed)


@pytest.mark.parametrize("mps_space", ["16M,4096", "shared"])
def test_many_files_fifos_sockets_and_links_in_the_users_mps_directories(hostile_bed,
                                                                         mps_space):
    """FIFOs, sockets, links of every kind, then 12,000 files. With the default space of
    its own (4096 inodes) the user gets as many as their limit allows, ENOSPC after, and
    all of it goes with one unmount; with ``mps_space=shared`` they get all 12,000 and the
    tree goes through the trash made beforehand. Either way nothing is left."""
    bed = hostile_bed
    line = bed.plugstack_line()
    bed.write_plugstack(line.rstrip("\n") + f" mps_space={mps_space}\n")
    script = (
        "set -e\n"
        "cd \"$CUDA_MPS_LOG_DIRECTORY\"\n"
        "mkfifo fifo \"$CUDA_MPS_PIPE_DIRECTORY/fifo\"\n"
        "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'\n"
        "ln -s / rootlink; ln -s /etc/passwd \"$CUDA_MPS_PIPE_DIRECTORY/passwd\"\n"
        "ln -s \"$CUDA_MPS_LOG_DIRECTORY\" loop; ln -s /nonexistent dangling\n"
        "mkdir -p deep/a/b && ln -s / deep/a/b/up\n"
        "mkdir many && (cd many && seq 1 12000 | sed 's/^/f/' | xargs touch 2>/dev/null "
        "|| echo ENOSPC)\n"
        "echo MADE $(ls many | wc -l)\n")
    try:
        info, output = run_shared(bed, script)
        assert info["JobState"] == "COMPLETED" and "MADE" in output, (info, output)
        made = int(output.split("MADE ")[1].split()[0])
        if mps_space == "shared":
            assert made == 12000 and "ENOSPC" not in output, output
        else:  # the user's own inode limit held: 4096 less what the daemon and links took
            assert 4000 < made < 4096 and "ENOSPC" in output, output
        assert_in_service_and_clean(bed)
    finally:
        bed.write_plugstack(line)


def test_a_requeued_job_starts_clean(hostile_bed):
    """A job that comes back with the same id gets its own new setup: its earlier run's
    lock, record and environment file decide nothing."""
    bed = hostile_bed
    job_id = bed.sbatch("echo RUN=$SLURM_RESTART_COUNT PIPE=$CUDA_MPS_PIPE_DIRECTORY "
                        "SHARE=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; sleep 4", "--gres=mps:25",
                        "-w", NODE, "-c1", "--open-mode=append", user=U1)
    bed.wait_job(job_id, states={"RUNNING"}, timeout=120)
    wait_until("the first run's output", lambda: "RUN=" in bed.output(job_id, ""), 60)
    bed.run(["scontrol", "requeue", str(job_id)])
    info = bed.wait_job(job_id, timeout=240)
    assert info["JobState"] == "COMPLETED", info
    assert info.get("Restarts") == "1", info
    runs = [line for line in bed.output(job_id).splitlines() if line.startswith("RUN=")]
    assert len(runs) == 2, bed.output(job_id)
    # The second run has its own daemon, set up afresh, with the same share.
    assert runs[1].startswith("RUN=1 PIPE=" + bed.state_of(NODE) + "/mps/u"), runs
    assert runs[1].endswith("SHARE=25"), runs
    assert_in_service_and_clean(bed)


def test_a_tasks_file_an_earlier_run_left_is_never_applied(hostile_bed):
    """An earlier run of the same job id whose epilog was lost left its tasks' file: the
    new run's tasks get their own environment, never that one."""
    bed = hostile_bed
    job_id = bed.sbatch("echo PIPE=$CUDA_MPS_PIPE_DIRECTORY STALE=$GPUSHARE_STALE",
                        "--gres=mps:25", "-w", NODE, "-c1", "--hold", user=U1)
    jobs_dir = os.path.join(bed.state_of(NODE), "jobs")
    os.makedirs(jobs_dir, exist_ok=True)
    with open(os.path.join(jobs_dir, f"{job_id}.env"), "w") as handle:
        handle.write("CUDA_MPS_PIPE_DIRECTORY=/tmp/earlier-run\nGPUSHARE_STALE=yes\n")
    bed.run(["scontrol", "release", str(job_id)])
    info = bed.wait_job(job_id, timeout=180)
    output = bed.output(job_id)
    assert info["JobState"] == "COMPLETED", (info, output)
    assert f"PIPE={bed.state_of(NODE)}/mps/u" in output and "STALE=yes" not in output, output
    assert_in_service_and_clean(bed)


def clear_faults(bed) -> None:
    os.unlink(bed.path("bin", "faults"))


@pytest.mark.smoke
def test_a_node_fault_drains_the_node_and_requeues_the_job_held(hostile_bed):
    """The MPS program fails at start: the node's fault. The node is drained with the
    cause, and the batch job is requeued held (no nohold_on_prolog_fail on the bed), as
    Slurm does for a failing prolog; released once the node is fixed, it runs."""
    bed = hostile_bed
    set_fault(bed, "die_start")
    job_id = bed.sbatch("echo RAN=$SLURM_RESTART_COUNT", "--gres=mps:25", "-w", FAULT_NODE,
                        "-c1", user=U1)
    reason = wait_drained(bed, FAULT_NODE)
    assert reason.startswith("gpushare: MPS start failed: nvidia-cuda-mps-control -d exit 1"), \
        reason
    bed.wait_requeued_held(job_id)
    lines = [line for line in slurmd_log(bed, FAULT_NODE).splitlines()
             if f"gpushare: job {job_id}:" in line and "cannot start MPS" in line]
    assert lines, slurmd_log(bed, FAULT_NODE)[-3000:]
    clear_faults(bed)
    release_and_run(bed, job_id)


def test_a_node_fault_never_requeues_a_job_that_asked_not_to_be(hostile_bed):
    bed = hostile_bed
    set_fault(bed, "die_start")
    job_id = bed.sbatch("echo RAN", "--gres=mps:25", "-w", FAULT_NODE, "-c1", "--no-requeue",
                        user=U1)
    wait_drained(bed, FAULT_NODE)
    info = bed.wait_job(job_id, timeout=120)
    assert info["JobState"] != "COMPLETED" and info.get("Restarts") == "0", info
    output = bed.output(job_id)
    assert "RAN" not in output, output
    assert (f"could not set up this job on node {FAULT_NODE}: " in output
            and "The node was drained; submit the job again" in output), output
    clear_faults(bed)
    bed.resume(FAULT_NODE)
    assert_in_service_and_clean(bed, FAULT_NODE)


# ---------------------------------------------------------------------------- one deadline

def set_nvml_hang(bed, node: str, calls: list[str], freeze: str = "") -> None:
    """Make the node's simulated NVML never return from ``calls`` (none: answer again);
    ``freeze``: a cgroup v1 freezer the hung process freezes itself in (unkillable)."""
    path = bed.path("nodes", f"{node}.json")
    with open(path) as handle:
        profile = json.load(handle)
    profile.pop("freeze", None)
    if calls:
        profile["hang"] = calls
        if freeze:
            profile["freeze"] = freeze
    else:
        profile.pop("hang", None)
    with open(path + ".tmp", "w") as handle:
        json.dump(profile, handle, indent=1)
    os.replace(path + ".tmp", path)


def with_timeout(bed, seconds: int) -> str:
    """The bed's plugstack line with ``timeout=seconds`` (and every job checking NVML);
    returns the line to put back."""
    line = bed.plugstack_line()
    assert " timeout=" in line, line
    changed = re.sub(r" timeout=\S+", f" timeout={seconds}", line)
    bed.write_plugstack(changed.rstrip("\n") + " verify_reuse=0\n")
    return line


def _worker_started(bed, job_id: int) -> str:
    return str(wait_until(f"job {job_id}'s worker", lambda: next(
        (line for line in bed.debug_lines()
         if f"job={job_id} " in line and WORKER_STARTED.search(line)), None), 60))


def worker_pid(bed, job_id: int) -> int:
    """The job's worker: the process Slurm's prolog supervises."""
    return int(WORKER_STARTED.search(_worker_started(bed, job_id))[1])  # type: ignore[index]


def python_pid(bed, job_id: int) -> int:
    """The process running the job's Python: the worker, or its child in the node's
    prefork server (prefork=yes, the default, after the node's first worker)."""
    started = _worker_started(bed, job_id)
    child = re.search(r" prefork child=(\d+)", started)
    return int((child or WORKER_STARTED.search(started))[1])  # type: ignore[index]


def release_and_run(bed, job_id: int) -> None:
    """The node fixed and resumed, the held job released: it runs there, once requeued."""
    bed.resume(FAULT_NODE)
    bed.run(["scontrol", "release", str(job_id)])
    # Three minutes from when Slurm lets the requeued job start, not from its release.
    info = bed.wait_job(job_id, timeout=180 + eligible_in(bed.job(job_id)))
    assert info["JobState"] == "COMPLETED", info
    assert "RAN=1" in bed.output(job_id), bed.output(job_id)
    assert_in_service_and_clean(bed, FAULT_NODE)


def test_a_hung_nvml_meets_the_workers_one_deadline(hostile_bed):
    """NVML stuck in the driver never returns: the worker is killed at its deadline (4 x
    timeout= + 5 s, here 13 s), the node drained with what the worker waited for, and the
    batch job requeued held, as for any node fault. Released once the node is fixed, the
    job runs; nothing of the killed worker stays."""
    bed = hostile_bed
    line = with_timeout(bed, 2)
    set_nvml_hang(bed, FAULT_NODE, ["nvmlInit", "nvmlInitWithFlags"])
    try:
        job_id = bed.sbatch("echo RAN=$SLURM_RESTART_COUNT", "--gres=mps:25", "-w",
                            FAULT_NODE, "-c1", user=U1)
        pid = python_pid(bed, job_id)
        reason = wait_drained(bed, FAULT_NODE, timeout=120)
        assert reason.startswith("gpushare: prolog worker timed out after 13 s while "
                                 "checking the GPUs (NVML)"), reason
        bed.wait_requeued_held(job_id)
        assert not alive(pid), f"the worker {pid} still runs"
        log = slurmd_log(bed, FAULT_NODE)
        assert "job_prolog: prolog worker timed out after 13 s" in log, log[-3000:]
        assert "RAN" not in bed.output(job_id, "")
    finally:
        set_nvml_hang(bed, FAULT_NODE, [])
        bed.write_plugstack(line)
    release_and_run(bed, job_id)


FREEZER = "/sys/fs/cgroup/freezer"


def _cgroup_pids(path: str) -> list[int]:
    with open(os.path.join(path, "cgroup.procs")) as handle:
        return [int(pid) for pid in handle.read().split()]


@pytest.fixture
def freezer(hostile_bed):
    """A cgroup v1 freezer of the bed's own: a process frozen there does not die of SIGKILL
    until it is thawed, as one in uninterruptible sleep in the driver. Thawed and removed
    afterwards, whatever the test did: a killed process in it dies then."""
    if not os.path.isfile(os.path.join(FREEZER, "cgroup.procs")):
        pytest.skip(f"no cgroup v1 freezer at {FREEZER}: an unkillable process cannot be made")
    path = os.path.join(FREEZER, f"gpushare-{os.path.basename(hostile_bed.root)}-{os.getpid()}")
    os.mkdir(path)
    try:
        yield path
    finally:
        with open(os.path.join(path, "freezer.state"), "w") as state:
            state.write("THAWED")
        for pid in _cgroup_pids(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until("the freezer empty", lambda: not _cgroup_pids(path), 60)
        os.rmdir(path)


def test_an_unkillable_prolog_worker_is_waited_for_with_a_bound(hostile_bed, freezer):
    """NVML stuck in the driver for real: the worker freezes itself in a cgroup v1 freezer,
    where SIGKILL does not end it (the state of uninterruptible sleep). At its deadline (13 s
    here) the supervisor kills it and waits for it a bounded time, then runs the fault path
    all the same: the node drained with a reason naming the stuck worker, the batch job
    requeued held. The epilog undoes the job at once, while the stuck worker lives on: it
    never waits out its bound on the job's lock that worker still holds. Thawed, the worker
    dies, and the job, released, runs."""
    bed = hostile_bed
    line = with_timeout(bed, 2)
    set_nvml_hang(bed, FAULT_NODE, ["nvmlInit", "nvmlInitWithFlags"], freeze=freezer)
    try:
        job_id = bed.sbatch("echo RAN=$SLURM_RESTART_COUNT", "--gres=mps:25", "-w",
                            FAULT_NODE, "-c1", user=U1)
        pid = python_pid(bed, job_id)
        wait_until("the worker frozen", lambda: _cgroup_pids(freezer), 60)
        set_nvml_hang(bed, FAULT_NODE, [])  # the epilog's worker and the next jobs' answer
        reason = wait_drained(bed, FAULT_NODE, timeout=120)
        assert reason.startswith(f"gpushare: prolog worker stuck unkillable (pid {pid}) after "
                                 "13 s while checking the GPUs"), reason
        bed.wait_requeued_held(job_id)
        wait_until("the job undone by its epilog", lambda: not job_records(bed), 60)
        # Undone while the killed worker still lives, frozen: really unkillable.
        assert alive(pid) and _cgroup_pids(freezer), f"the worker {pid} died of its kill"
        log = slurmd_log(bed, FAULT_NODE)
        assert re.search(rf"worker {pid} (\(in the prefork server\) )?does not die when killed",
                         log), log[-3000:]
        assert "job_prolog: prolog worker stuck unkillable" in log, log[-3000:]
        assert f"job {job_id}: epilog: the job's prolog worker still runs" not in log, \
            log[-3000:]
        assert bed.node_state(FAULT_NODE).get("Reason", "") == reason
        assert "RAN" not in bed.output(job_id, "")
        with open(os.path.join(freezer, "freezer.state"), "w") as state:
            state.write("THAWED")
        wait_until("the thawed worker dead of its kill", lambda: not alive(pid), 60)
    finally:
        set_nvml_hang(bed, FAULT_NODE, [])
        bed.write_plugstack(line)
    release_and_run(bed, job_id)


def test_a_killed_prolog_worker_is_a_node_fault_its_supervisor_reports(hostile_bed):
    """The OOM killer ends the worker while it starts the job's daemon: its supervisor
    drains the node with the signal and what the worker did, and requeues the job held;
    what the worker had set up is undone by the job's epilog."""
    bed = hostile_bed
    set_fault(bed, "slow_start")
    job_id = bed.sbatch("echo RAN=$SLURM_RESTART_COUNT", "--gres=mps:25", "-w", FAULT_NODE,
                        "-c1", user=U1)
    pid = python_pid(bed, job_id)
    wait_until("the daemon's record names the job", lambda: any(
        str(job_id) in record["jobs"] for record in mps_records(bed)), 60)
    os.kill(pid, signal.SIGKILL)
    reason = wait_drained(bed, FAULT_NODE)
    assert reason.startswith("gpushare: prolog worker killed by signal 9 (OOM?) while "
                             "starting or joining the MPS daemon"), reason
    bed.wait_requeued_held(job_id)
    assert "RAN" not in bed.output(job_id, "")
    clear_faults(bed)
    release_and_run(bed, job_id)
