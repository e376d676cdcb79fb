# SPDX-License-Identifier: GPL-2.0-or-later
"""What the detached prolog/epilog worker must do because Slurm no longer waits for it:
drain the node on any failure, fail the job's tasks with the cause, and order itself after
earlier epilogs."""

import errno
import fcntl
import os
import re
import subprocess
import sys
import time

import pytest
from spank_fakes import FakeFfi, FakeHost

from gpushare.common import log as gslog
from gpushare.node import counters, job, phases, spank_adapter
from gpushare.node.config import PluginConfig
from gpushare.node.state import JobRecord, JobStore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory is root's")


@pytest.fixture
def state_dir(tmp_path):
    os.chmod(tmp_path, 0o755)
    return str(tmp_path / "state")


@pytest.fixture
def adapter(monkeypatch):
    drained = []
    monkeypatch.setattr(spank_adapter, "_ffi", FakeFfi)
    monkeypatch.setattr(spank_adapter, "_config", None)
    monkeypatch.setattr(spank_adapter, "_drain", lambda reason, config: drained.append(reason))
    requeued: list[int] = []

    def requeue(job_id, config):
        requeued.append(job_id)
        return "held", None

    monkeypatch.setattr(spank_adapter, "_requeue", requeue)
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", job.SHARE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    spank_adapter.drained = drained  # type: ignore[attr-defined]
    spank_adapter.requeued = requeued  # type: ignore[attr-defined]
    yield spank_adapter
    gslog.uninstall()


def env_file(state_dir: str, job_id: int) -> str:
    with open(JobStore(state_dir).path(job_id, ".env")) as handle:
        return handle.read()


@needs_root
def test_a_node_error_drains_and_fails_the_tasks_with_its_cause(adapter, state_dir,
                                                               monkeypatch):
    def fails(config, request, phases):
        raise job.NodeError("cannot verify the job's GPUs: NVML is gone",
                            brief="NVML is gone")

    monkeypatch.setattr(job, "prolog", fails)
    args = [f"state_dir={state_dir}", "show=no"]
    assert adapter.dispatch("job_prolog", FakeHost(5, {}), args) == -1
    assert adapter.drained == ["NVML is gone"]
    text = env_file(state_dir, 5)
    assert text.startswith("#error=could not set up this job on node n1: cannot verify the "
                           "job's GPUs: NVML is gone. The node was drained; the job was "
                           "requeued and held, as Slurm holds a job whose prolog failed: "
                           "`scontrol release 5` runs it on another node"), text
    assert adapter.requeued == [5]
    record = JobStore(state_dir).read(5)
    assert record is not None and record.mode == "error"
    # The epilog finds the record and removes it.
    assert adapter.dispatch("job_epilog", FakeHost(5, {}), args) == 0
    assert JobStore(state_dir).read(5) is None
    assert not os.path.exists(JobStore(state_dir).path(5, ".env"))


@needs_root
def test_an_internal_error_drains_and_keeps_what_the_prolog_recorded(adapter, state_dir,
                                                                    monkeypatch):
    store = JobStore(state_dir)
    started = JobRecord(job_id=6, uid=1000, gid=1000, node="n1", mode="shared",
                        share_percent=25, mps={"key": "u1000-GPU-x"})

    def breaks(config, request, phases):
        store.write(started, tasks=False)  # as the prolog does before the daemon
        raise KeyError("oops")

    monkeypatch.setattr(job, "prolog", breaks)
    assert adapter.dispatch("job_prolog", FakeHost(6, {}), [f"state_dir={state_dir}"]) == -1
    # The cause is named even for what gpushare did not expect.
    assert adapter.drained == ["internal error in job_prolog: KeyError: 'oops'"]
    record = store.read(6)
    assert record is not None
    assert record.mps == {"key": "u1000-GPU-x"}  # the epilog still finds the daemon
    assert ("an internal error in job_prolog (KeyError: 'oops'; slurmd's log has the "
            "details)") in record.error
    assert env_file(state_dir, 6).startswith("#error=could not set up this job")


@needs_root
def test_a_failing_epilog_drains_but_writes_no_record(adapter, state_dir, monkeypatch):
    def fails(config, job_id, phases):
        raise job.NodeError("MPS daemon u1 survives quit", brief="MPS stop failed")

    monkeypatch.setattr(job, "epilog", fails)
    assert adapter.dispatch("job_epilog", FakeHost(8, {}), [f"state_dir={state_dir}"]) == -1
    assert adapter.drained == ["MPS stop failed"]
    assert JobStore(state_dir).read(8) is None
    assert adapter.requeued == []  # only a prolog's job is requeued


def test_a_bad_plugstack_line_drains_too(adapter):
    assert adapter.dispatch("job_prolog", FakeHost(9, {}), ["bogus=1"]) == -1
    assert adapter.drained == ["bad gpushare line in plugstack.conf"]


@needs_root
def test_the_first_record_write_leaves_the_tasks_waiting(state_dir):
    store = JobStore(state_dir)
    record = JobRecord(job_id=3, uid=1000, gid=1000, node="n1", mode="shared",
                       share_percent=50)
    store.write(record, tasks=False)
    assert store.read(3) == record
    assert not os.path.exists(store.path(3, ".env"))  # the tasks' signal is not given yet
    store.write(record)
    assert os.path.exists(store.path(3, ".env"))


def released(path: str) -> str:
    return path + ".released"


def hold_shared(path: str, seconds: float) -> subprocess.Popen:
    """Another process holding ``path`` shared, as an epilog worker does; it leaves
    ``released(path)`` just before it lets go."""
    code = ("import fcntl, os, sys, time\n"
            f"fd = os.open({path!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)\n"
            "print('held', flush=True)\n"
            f"time.sleep({seconds})\n"
            f"open({released(path)!r}, 'w').close()\n"
            "fcntl.flock(fd, fcntl.LOCK_UN)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_prolog_waits_for_the_epilogs_before_it(tmp_path):
    config = PluginConfig(state_dir=str(tmp_path))
    job.wait_for_epilogs(config)  # no epilog ever ran: nothing to wait for
    lock = os.path.join(str(tmp_path), job.EPILOGS_LOCK)
    holder = hold_shared(lock, 0.5)
    start = time.monotonic()
    job.wait_for_epilogs(config)
    waited = time.monotonic() - start
    assert os.path.exists(released(lock)), "returned while the epilog still held the lock"
    assert waited > 0.1
    holder.wait()
    # Free again: the wait took the lock exclusively and gave it back.
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


def test_a_prolog_waits_only_for_the_epilogs_of_its_own_gpus(tmp_path):
    config = PluginConfig(state_dir=str(tmp_path))
    other = hold_shared(os.path.join(str(tmp_path), job.GPU_EPILOGS_LOCK.format(1)), 5)
    same_lock = os.path.join(str(tmp_path), job.GPU_EPILOGS_LOCK.format(0))
    same = hold_shared(same_lock, 0.5)
    try:
        start = time.monotonic()
        job.wait_for_epilogs(config, ["0"])
        assert os.path.exists(released(same_lock)), \
            "returned while GPU 0's epilog still held its lock"
        assert time.monotonic() - start > 0.1
        assert other.poll() is None  # GPU 1's epilog still runs: nothing waited for it
        start = time.monotonic()
        job.wait_for_epilogs(config, ["0", "2"])
        assert time.monotonic() - start < 1
    finally:
        other.kill()
        other.wait()
        same.wait()


def test_a_hung_epilog_is_waited_for_only_until_the_workers_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(phases, "_deadline", None)
    lines = []
    gslog.install(lambda level, text: lines.append(text))
    try:
        holder = hold_shared(os.path.join(str(tmp_path), job.EPILOGS_LOCK), 60)
        try:
            phases.start(0.2)  # the worker's deadline, as spank_adapter sets it
            job.wait_for_epilogs(PluginConfig(state_dir=str(tmp_path)))
            assert holder.poll() is None  # it gave up; the epilog still runs
        finally:
            holder.kill()
            holder.wait()
    finally:
        gslog.uninstall()
    # The line names how long it waited: what was left of the worker's 0.2 s (less on a
    # loaded machine, never more).
    waits = [float(m.group(1)) for m in (
        re.search(r"an earlier job's epilog on this node still runs after ([0-9.e-]+) s; "
                  "setting up this job anyway", line) for line in lines) if m]
    assert waits and 0 <= waits[0] <= 0.2, lines


def write_board(state_dir: str, job_id: int, text: str) -> None:
    """What spank/gs_deadline.c writes into the job's lock file before the fault path."""
    path = JobStore(state_dir).path(job_id, ".lock")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text.ljust(phases.BOARD_SIZE))


@needs_root
def test_a_worker_killed_at_its_deadline_drains_requeues_and_tells_the_tasks(adapter,
                                                                             state_dir):
    args = [f"state_dir={state_dir}"]
    JobStore(state_dir)  # the jobs directory, as the prolog made it
    assert adapter.dispatch("job_prolog", FakeHost(11, {}), [*args, "verify=off"]) == 0
    os.unlink(JobStore(state_dir).path(11, ".env"))  # the worker was killed before its word
    why = "prolog worker timed out after 13 s while checking the GPUs (NVML)"
    write_board(state_dir, 11, why)
    assert adapter.dispatch("job_prolog_worker_lost", FakeHost(11, {}), args) == 0
    assert adapter.drained == [why]
    assert adapter.requeued == [11]
    assert env_file(state_dir, 11).startswith(
        f"#error=could not set up this job on node n1: {why}. The node was drained; the "
        "job was requeued and held"), env_file(state_dir, 11)
    counted = counters.read(state_dir)
    assert counted.get(counters.series("drains_total", "worker_timeout")) == 1, counted
    assert counted.get(counters.series("timeouts_total", "worker")) == 1, counted
    assert counted.get(counters.series("prologs_total", "failed")) == 1, counted


@needs_root
def test_a_worker_that_hung_after_the_tasks_word_only_drains(adapter, state_dir):
    args = [f"state_dir={state_dir}", "verify=off"]
    assert adapter.dispatch("job_prolog", FakeHost(12, {}), args) == 0
    told = env_file(state_dir, 12)
    assert not told.startswith("#error=")
    write_board(state_dir, 12, "prolog worker killed by signal 9 (OOM?)")
    assert adapter.dispatch("job_prolog_worker_lost", FakeHost(12, {}), args) == 0
    assert adapter.drained == ["prolog worker killed by signal 9 (OOM?)"]
    assert adapter.requeued == [] and env_file(state_dir, 12) == told


@needs_root
def test_an_epilog_worker_lost_drains_without_a_requeue(adapter, state_dir):
    args = [f"state_dir={state_dir}"]
    JobStore(state_dir)
    write_board(state_dir, 13, "epilog worker timed out after 13 s while leaving or "
                "stopping the job's MPS daemon")
    assert adapter.dispatch("job_epilog_worker_lost", FakeHost(13, {}), args) == 0
    assert adapter.drained == ["epilog worker timed out after 13 s while leaving or stopping "
                               "the job's MPS daemon"]
    assert adapter.requeued == []


# ------------------------------------------------- the epilog after a prolog that failed

def prolog_lock(state_dir: str, job_id: int) -> str:
    """The job's lock file, as the C glue's prolog makes it before its worker starts."""
    path = JobStore(state_dir).path(job_id, ".lock")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    open(path, "a").close()
    return path


def shared_record(job_id: int) -> JobRecord:
    return JobRecord(job_id=job_id, uid=1000, gid=1000, node="n1", mode="shared",
                     share_percent=25, slurm_gpus=["0"])


def failed_prolog(kind: str, adapter, state_dir: str, job_id: int, monkeypatch) -> None:
    """The prolog of ``job_id`` failing as ``kind`` says, and what the C glue does then."""
    args = [f"state_dir={state_dir}", "verify=off"]
    store = JobStore(state_dir)
    prolog_lock(state_dir, job_id)
    if kind in ("node-error", "internal-error"):
        def fails(config, request, phases):
            store.write(shared_record(job_id), tasks=False)  # before the daemon, as prolog
            if kind == "node-error":
                raise job.NodeError("MPS for job: cannot start MPS on GPU 0", drain=True)
            raise KeyError("oops")

        monkeypatch.setattr(job, "prolog", fails)
        assert adapter.dispatch("job_prolog", FakeHost(job_id, {}), args) == -1
    elif kind == "bad-plugstack":
        assert adapter.dispatch("job_prolog", FakeHost(job_id, {}), ["bogus=1"]) == -1
        # The worker's C word for its tasks when its Python left none (gs_fail_tasks).
        with open(store.path(job_id, ".env"), "w") as handle:
            handle.write("#error=could not set up this job on its node\n")
    elif kind in ("killed", "timed-out", "killed-after-its-word"):
        store.write(shared_record(job_id), tasks=kind == "killed-after-its-word")
        write_board(state_dir, job_id, "prolog worker timed out after 13 s while starting "
                    "or joining the MPS daemon" if kind == "timed-out" else
                    "prolog worker killed by signal 9 (OOM?)")
        assert adapter.dispatch("job_prolog_worker_lost", FakeHost(job_id, {}), args) == 0
    else:  # killed with its supervisor: nothing ran after the record's first write
        assert kind == "killed-with-its-supervisor"
        store.write(shared_record(job_id), tasks=False)


@needs_root
@pytest.mark.parametrize("kind", ["node-error", "internal-error", "bad-plugstack", "killed",
                                  "timed-out", "killed-after-its-word",
                                  "killed-with-its-supervisor"])
def test_an_epilog_after_any_failed_prolog_undoes_it_and_succeeds(adapter, state_dir,
                                                                  monkeypatch, kind):
    """Whatever stopped the prolog, its epilog removes what it made and does not fail for
    it: the node fault was the prolog's to report (and was), not the epilog's."""
    failed_prolog(kind, adapter, state_dir, 21, monkeypatch)
    drained = list(adapter.drained)
    assert adapter.dispatch("job_epilog", FakeHost(21, {}), [f"state_dir={state_dir}"]) == 0
    assert adapter.drained == drained
    # Only the job's lock is left: the C glue removes it once the epilog's Python is done.
    assert os.listdir(JobStore(state_dir).jobs_dir) == ["21.lock"]


@needs_root
def test_an_epilog_whose_release_fails_still_removes_the_jobs_files(adapter, state_dir,
                                                                    monkeypatch):
    """An error gpushare did not expect while the epilog leaves the job's daemon is a node
    fault and drains the node, but the job's record and tasks' file go all the same: left,
    they would outlive the job (the next prolog's reap drops a daemon reference whose job
    has no record)."""
    store = JobStore(state_dir)
    store.write(shared_record(22))

    class BrokenManager:
        def __init__(self, config: PluginConfig) -> None:
            self.config = config

        def release(self, job_id: int, hint: object = None) -> list[str]:
            raise OSError(errno.EIO, "Input/output error", "daemons/u1000-GPU-x.json")

    monkeypatch.setattr(job, "MpsManager", BrokenManager)
    assert adapter.dispatch("job_epilog", FakeHost(22, {}), [f"state_dir={state_dir}"]) == -1
    assert adapter.drained == ["job_epilog failed: Input/output error "
                               "(daemons/u1000-GPU-x.json)"]
    assert os.listdir(store.jobs_dir) == []


@needs_root
def test_a_prolog_worker_reported_lost_after_its_epilog_brings_no_record_back(adapter,
                                                                              state_dir):
    """The prolog's supervisor hung, and the job's epilog undid the job without it (the C
    glue then removed the job's lock); the supervisor, resumed, reports its killed worker:
    the node is drained, but a job that is over gets no record and no requeue."""
    args = [f"state_dir={state_dir}"]
    store = JobStore(state_dir)
    lock = prolog_lock(state_dir, 23)
    store.write(shared_record(23), tasks=False)
    assert adapter.dispatch("job_epilog", FakeHost(23, {}), args) == 0
    os.unlink(lock)  # the end of the C glue's epilog (gs_finish)
    assert adapter.dispatch("job_prolog_worker_lost", FakeHost(23, {}), args) == 0
    assert adapter.drained == ["the job prolog's worker was killed"]
    assert adapter.requeued == []
    assert os.listdir(store.jobs_dir) == []
