# SPDX-License-Identifier: GPL-2.0-or-later
"""prefork=yes inside the real local Slurm: the first worker starts the node's prefork
server and runs in place; the jobs after it are set up and undone by the server's children,
with the same outcome; a server whose code changed on disk is never used again; a user
cannot reach it; and a worker of the server's that passes its deadline is killed with its
child there, the node drained and the job requeued as without prefork."""

from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest
from tests.slurm.test_hostile import release_and_run, set_nvml_hang
from tests.slurm.test_mps import (
    FAULT_NODE,
    NODE,
    U1,
    U2,
    assert_nothing_left,
    standin_pids,
    wait_drained,
)
from tests.slurm.test_mps import mps_bed as _mps_bed  # noqa: F401  (a fixture)

from mps_standin.harness import running as alive
from slurmbed import wait_until, worker_ended

pytestmark = pytest.mark.slurm

SOCKET = "prefork.sock"
LOCK = "prefork.lock"


def server_running(bed, node: str) -> bool:
    """The node's server takes jobs (not merely holds its lock: it listens after its
    imports, and a job before that runs in place)."""
    return bed.prefork_serving(node)


def server_pids(bed, node: str) -> list[int]:
    """The processes that hold the node's prefork lock open."""
    lock = os.path.join(bed.state_of(node), LOCK)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == lock:
                    found.append(int(pid))
                    break
            except OSError:
                continue
    return found


@pytest.fixture
def prefork_bed(_mps_bed):  # noqa: F811  (the fixture imported above)
    """The MPS bed as it is (prefork=yes is the default), every job asking NVML (so that
    each is set up by a worker), and no server running at first (earlier tests' jobs may
    have left one); the line and no server left afterwards."""
    bed = _mps_bed
    line = bed.plugstack_line()
    assert "prefork=" not in line, line
    bed.write_plugstack(line.rstrip("\n") + " verify_reuse=0\n")
    bed.stop_prefork()
    try:
        yield bed
    finally:
        bed.write_plugstack(line)
        bed.stop_prefork()


def job_lines(bed, job_id: int) -> list[str]:
    return [line for line in bed.debug_lines() if f" job={job_id} " in line]


def run_shared(bed, user: str = U1, node: str = NODE) -> tuple[int, str]:
    job_id = bed.sbatch("echo PIPE=$CUDA_MPS_PIPE_DIRECTORY PCT=$CUDA_MPS_ACTIVE_THREAD_"
                        "PERCENTAGE", "--gres=mps:25", "-w", node, "-c1", user=user)
    info = bed.wait_job(job_id, timeout=180)
    assert info["JobState"] == "COMPLETED", info
    return job_id, bed.output(job_id)


def test_jobs_after_the_first_are_set_up_and_undone_by_the_prefork_server(prefork_bed):
    bed = prefork_bed
    first, output = run_shared(bed)
    assert "PCT=25" in output, output
    assert any("python=start" in line for line in job_lines(bed, first)), job_lines(bed, first)
    wait_until("the prefork server", lambda: server_running(bed, NODE), 60)
    info = os.lstat(os.path.join(bed.state_of(NODE), SOCKET))
    assert stat.S_ISSOCK(info.st_mode) and info.st_uid == 0
    assert stat.S_IMODE(info.st_mode) == 0o600
    # A server a second worker started while the first imported ends at once: one is left.
    wait_until("one server", lambda: len(server_pids(bed, NODE)) == 1, 60)
    (server,) = server_pids(bed, NODE)
    assert os.stat(f"/proc/{server}").st_uid == 0
    assert_nothing_left(bed)
    for user in (U1, U2):
        job_id, output = run_shared(bed, user)
        assert f"PIPE={bed.state_of(NODE)}/mps/u" in output and "PCT=25" in output, output
        # The epilog's worker runs after Slurm has the job completed: its line is waited for.
        wait_until(f"job {job_id}'s epilog done", lambda job_id=job_id: any(
            worker_ended(line, "job_epilog", "") for line in job_lines(bed, job_id)), 60)
        lines = job_lines(bed, job_id)
        # Both the prolog and the epilog went to the server; no worker started Python.
        assert sum("cb=job_prolog prefork rc=0" in line for line in lines) == 1, lines
        assert sum("cb=job_epilog prefork rc=0" in line for line in lines) == 1, lines
        assert not any("python=start" in line for line in lines), lines
        assert_nothing_left(bed)
    assert server_pids(bed, NODE) == [server]


def test_prefork_no_runs_every_worker_in_place_and_starts_no_server(prefork_bed):
    """The site's way out: with prefork=no on the line, each worker starts its own
    interpreter, none leaves a server behind, and the job's outcome is the same."""
    bed = prefork_bed
    line = bed.plugstack_line()
    bed.write_plugstack(line.rstrip("\n") + " verify_reuse=0 prefork=no\n")
    try:
        for _ in range(2):
            job_id, output = run_shared(bed)
            assert "PCT=25" in output, output
            wait_until(f"job {job_id}'s epilog done", lambda job_id=job_id: any(
                "cb=job_epilog python rc=0" in line for line in job_lines(bed, job_id)), 60)
            lines = job_lines(bed, job_id)
            assert sum("python=start" in line for line in lines) == 2, lines
            assert not any("prefork" in line for line in lines), lines
            assert not bed.prefork_running(NODE)  # no lock held, let alone a socket
            assert not os.path.exists(os.path.join(bed.state_of(NODE), SOCKET))
        assert_nothing_left(bed)
    finally:
        bed.write_plugstack(line.rstrip("\n") + " verify_reuse=0\n")


def test_a_server_whose_code_changed_is_not_used_again(prefork_bed):
    """A package upgrade (here: one file of the bed's pythonpath= touched) makes the running
    server refuse and end; the job runs in place, and a server of the new code follows."""
    bed = prefork_bed
    run_shared(bed)
    wait_until("the prefork server", lambda: server_running(bed, NODE), 60)
    wait_until("one server", lambda: len(server_pids(bed, NODE)) == 1, 60)
    (old,) = server_pids(bed, NODE)
    os.utime(os.path.join(bed.path("lib", "python"), "gpushare", "node", "job.py"))
    job_id, output = run_shared(bed)
    assert "PCT=25" in output, output
    lines = job_lines(bed, job_id)
    assert any("prefork refused: the code on disk changed" in line for line in lines), lines
    assert any("python=start" in line for line in lines), lines
    wait_until("the old server gone", lambda: not alive(old), 60)

    def new_server_listens() -> bool:
        pids = server_pids(bed, NODE)
        return len(pids) == 1 and pids != [old] and server_running(bed, NODE)
    wait_until("a server of the new code", new_server_listens, 60)
    job_id, _output = run_shared(bed)
    assert any("cb=job_prolog prefork rc=0" in line for line in job_lines(bed, job_id))
    assert_nothing_left(bed)


def test_a_user_cannot_reach_the_server(prefork_bed):
    bed = prefork_bed
    run_shared(bed)
    wait_until("the prefork server", lambda: server_running(bed, NODE), 60)
    path = os.path.join(bed.state_of(NODE), SOCKET)
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
             "try:\n s.connect(sys.argv[1]); print('CONNECTED')\n"
             "except OSError as e: print('REFUSED', e.errno)\n")
    result = subprocess.run(["runuser", "-u", U1, "--", "/usr/bin/python3", "-c", probe, path],
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("REFUSED 13"), (result.stdout, result.stderr)


def fd_targets(pid: int) -> set[str]:
    """What the process's descriptors point at (``socket:[inode]``, paths)."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found


def test_a_users_daemon_holds_nothing_of_the_server(prefork_bed):
    """A user's MPS daemon started by the server's child (a root process forked off the
    server) holds none of the server's descriptors: not its socket, not its lock, not the
    connection its worker talks through."""
    bed = prefork_bed
    run_shared(bed)
    # The first job's epilog stops its user's daemon after the job is COMPLETED: until then
    # that daemon would stand for the next job's, whose prolog may not have run yet.
    assert_nothing_left(bed)
    wait_until("the prefork server", lambda: server_running(bed, NODE), 60)
    wait_until("one server", lambda: len(server_pids(bed, NODE)) == 1, 60)
    (server,) = server_pids(bed, NODE)
    job_id = bed.sbatch("sleep 60", "--gres=mps:25", "-w", NODE, "-c1", user=U2)
    bed.wait_job(job_id, states={"RUNNING"})
    # RUNNING comes before the prolog (slurmd runs it as the batch step starts): its end.
    prolog = wait_until("its prolog's end", lambda: [
        line for line in job_lines(bed, job_id) if "cb=job_prolog" in line and " rc=" in line],
        60)
    assert any("cb=job_prolog prefork rc=0" in line for line in prolog), prolog
    wait_until("its daemon", lambda: standin_pids(bed), 60)
    theirs = {t for t in fd_targets(server) if t.startswith("socket:") or "prefork" in t}
    assert theirs, fd_targets(server)
    for pid in standin_pids(bed):
        assert not fd_targets(pid) & theirs, (pid, fd_targets(pid), theirs)
        assert not any("prefork" in target for target in fd_targets(pid)), fd_targets(pid)
    bed.run(["scancel", str(job_id)])
    bed.wait_job(job_id)
    assert_nothing_left(bed)


def test_a_prefork_worker_past_its_deadline_goes_with_its_child(prefork_bed):
    """NVML hangs in the server's child: at the worker's deadline (13 s here) the supervisor
    kills the worker and that child, drains the node with the cause and requeues the batch
    job held, as for a worker of its own."""
    bed = prefork_bed
    run_shared(bed, node=FAULT_NODE)
    wait_until("the prefork server", lambda: server_running(bed, FAULT_NODE), 60)
    line = bed.plugstack_line().rstrip("\n") + " prefork=yes verify_reuse=0\n"
    bed.write_plugstack(re.sub(r" timeout=\S+", " timeout=2", line))
    set_nvml_hang(bed, FAULT_NODE, ["nvmlInit", "nvmlInitWithFlags"])
    try:
        job_id = bed.sbatch("echo RAN=$SLURM_RESTART_COUNT", "--gres=mps:25", "-w",
                            FAULT_NODE, "-c1", user=U1)
        child_line = wait_until("the server's child", lambda: next(
            (x for x in job_lines(bed, job_id) if "cb=job_prolog prefork child=" in x), None),
            60)
        child = int(re.search(r"prefork child=(\d+)", str(child_line))[1])  # type: ignore
        reason = wait_drained(bed, FAULT_NODE, timeout=120)
        assert reason.startswith("gpushare: prolog worker timed out after 13 s while "
                                 "checking the GPUs"), reason
        bed.wait_requeued_held(job_id)
        assert not alive(child), f"the server's child {child} outlived its worker"
    finally:
        set_nvml_hang(bed, FAULT_NODE, [])
        bed.write_plugstack(line)
    release_and_run(bed, job_id)
