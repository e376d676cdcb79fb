# SPDX-License-Identifier: GPL-2.0-or-later
"""One deadline for a prolog's or epilog's worker, and for the fault path after it: the C
glue hands it over (struct gs_host's ``deadline``), and every inner wait takes only the time
left of it, never a fixed ``timeout=`` of its own."""

import os
import time
from types import SimpleNamespace

import pytest
from spank_fakes import FakeFfi, FakeHost

from gpushare.common import log as gslog
from gpushare.common import proc
from gpushare.node import drain, job, phases, spank_adapter
from gpushare.node.config import PluginConfig
from gpushare.node.mps import control
from gpushare.node.mps.manager import MpsManager
from gpushare.node.state import JobStore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory is root's")


class DeadlineHost(FakeHost):
    """The plugin's struct gs_host with the deadline the supervisor set."""

    def __init__(self, job_id: int, deadline: float) -> None:
        super().__init__(job_id, {})
        self.deadline = deadline


def test_the_hosts_deadline_is_the_time_left():
    now = time.monotonic()
    assert spank_adapter.host_seconds_left(DeadlineHost(1, now + 30.0), 45.0) <= 30.0
    assert spank_adapter.host_seconds_left(DeadlineHost(1, now - 5.0), 45.0) == 0.0
    # A callback the supervisor did not start (an in-place epilog of an old plugin): its own.
    assert spank_adapter.host_seconds_left(FakeHost(1, {}), 45.0) == 45.0
    assert spank_adapter.host_seconds_left(DeadlineHost(1, 0.0), 45.0) == 45.0


@needs_root
def test_a_prolog_worker_takes_the_supervisors_deadline(monkeypatch, tmp_path):
    os.chmod(tmp_path, 0o755)
    state_dir = str(tmp_path / "state")
    monkeypatch.setattr(spank_adapter, "_ffi", FakeFfi)
    monkeypatch.setattr(spank_adapter, "_config", None)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", job.SHARE_ENV):
        monkeypatch.delenv(name, raising=False)
    JobStore(state_dir)
    try:
        host = DeadlineHost(21, time.monotonic() + 4.0)
        assert spank_adapter.dispatch("job_prolog", host, [f"state_dir={state_dir}",
                                                           "verify=off"]) == 0
    finally:
        gslog.uninstall()
    # Well below the worker's own 45 s (4 x timeout=10 + 5): what the supervisor left it.
    assert phases.time_left(600.0) <= 4.0 - job.DEADLINE_SLACK


@needs_root
def test_the_fault_path_drains_and_requeues_within_the_time_left(monkeypatch, tmp_path):
    os.chmod(tmp_path, 0o755)
    state_dir = str(tmp_path / "state")
    monkeypatch.setattr(spank_adapter, "_ffi", FakeFfi)
    monkeypatch.setattr(spank_adapter, "_config", None)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setattr(drain, "SCONTROL", "/bin/true")
    given: list[float] = []

    def run(argv, *, timeout, env):
        given.append(timeout)
        return proc.Result(tuple(argv), 0, "", "")

    monkeypatch.setattr(drain.proc, "run", run)
    monkeypatch.setattr(spank_adapter, "_drain", lambda reason, config: drain.drain_node(
        "n1", reason, scontrol="/bin/true", timeout=config.timeout))
    monkeypatch.setattr(spank_adapter, "_requeue", lambda job_id, config: drain.requeue_job(
        job_id, scontrol="/bin/true", timeout=config.timeout))
    board = JobStore(state_dir).path(22, ".lock")  # the job's lock, where the cause is
    os.makedirs(os.path.dirname(board), mode=0o700, exist_ok=True)
    with open(board, "w") as handle:
        handle.write("prolog worker stuck unkillable (pid 7) after 13 s".ljust(
            phases.BOARD_SIZE))
    try:
        host = DeadlineHost(22, time.monotonic() + 3.0)
        assert spank_adapter.dispatch("job_prolog_worker_lost", host,
                                      [f"state_dir={state_dir}"]) == 0
    finally:
        gslog.uninstall()
    # drain, show config, requeue: each within what is left, not timeout=10 each.
    assert len(given) == 3, given
    assert all(0.0 <= seconds <= 3.0 - job.DEADLINE_SLACK for seconds in given), given


def test_a_drain_without_a_deadline_takes_its_own_timeout(monkeypatch):
    given: list[float] = []
    monkeypatch.setattr(drain.proc, "run", lambda argv, *, timeout, env: given.append(
        timeout) or proc.Result(tuple(argv), 0, "", ""))
    assert drain.drain_node("n1", "why", scontrol="/bin/true", timeout=10.0) is None
    assert given == [10.0]


def test_an_mps_control_command_takes_the_time_left(monkeypatch, tmp_path):
    program = "/bin/true"
    manager = MpsManager(PluginConfig(state_dir=str(tmp_path), mps_control=program,
                                      timeout=10.0), lock_timeout=60)
    given: list[float] = []
    monkeypatch.setattr(control, "send", lambda prog, rec, commands, timeout: given.append(
        timeout) or proc.Result((prog,), 0, "", ""))
    phases.start(2.5)
    manager.daemons.control(SimpleNamespace(), ["get_server_list"])  # type: ignore[arg-type]
    assert given and given[0] <= 2.5, given
    phases.start(60.0)
    manager.daemons.control(SimpleNamespace(), ["get_server_list"])  # type: ignore[arg-type]
    assert given[1] == 10.0, given


def test_the_kill_wait_fits_in_the_fault_paths_time():
    """The supervisor's wait for a killed worker comes out of the fault path's time: with
    the smallest timeout= the fault path still has its margin left."""
    smallest = 0.1
    fault = job.FAULT_TIMEOUTS * smallest + job.WORKER_DEADLINE_MARGIN
    assert fault - job.DEADLINE_SLACK > job.KILL_WAIT


def test_the_admin_guide_gives_the_worst_cases_the_constants_make():
    """docs/admin.md's table of worst cases, at the default timeout=, is what the
    constants give (a change of a constant changes the table, or this fails)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "admin.md").read_text()
    config = PluginConfig()
    t = config.timeout
    worker = job.worker_deadline(config)
    fault = job.FAULT_TIMEOUTS * t + job.WORKER_DEADLINE_MARGIN
    rows = {
        "4T + 5 s": worker,
        "3T + 5 s": fault,
        "7T + 10 s": job.wait_limit(config),
        "9T + 10 s": job.wait_limit(config) + 2 * t,
        "10T + 10 s": job.wait_limit(config) + 3 * t,
        "13T + 15 s": job.wait_limit(config) + 2 * t + worker,
    }
    for formula, seconds in rows.items():
        assert f"| {formula} | {seconds:g} s |" in text, (formula, seconds)
    assert f"| {job.KILL_WAIT:g} s | {job.KILL_WAIT:g} s |" in text
