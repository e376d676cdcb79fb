# SPDX-License-Identifier: GPL-2.0-or-later
"""Who caused a failure decides what happens: a user's fails their job and leaves the node
in service; a node's drains it with the cause and requeues the job as Slurm would."""

from __future__ import annotations

import errno
import os

import pytest
from spank_fakes import FakeFfi, FakeHost

from gpushare.common import log as gslog
from gpushare.common.safefs import UnsafePathError
from gpushare.node import counters, drain, faults, job, spank_adapter
from gpushare.node.mps import MpsError, MpsUserError
from gpushare.node.state import JobStore, StateError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="state_dir= must be root's")


@pytest.mark.parametrize("err, who, brief", [
    (job.UserError("--gpu-share=0 is invalid"), faults.USER, ""),
    (MpsUserError("the job's user left a control that is not a socket"), faults.USER, ""),
    (job.NodeError("cannot verify the job's GPUs: NVML is gone", brief="NVML is gone"),
     faults.NODE, "NVML is gone"),
    (MpsError("cannot start MPS on GPU 0", brief="MPS start failed: exit 1"), faults.NODE,
     "MPS start failed: exit 1"),
    (StateError("job record 5 has version 9"), faults.NODE,
     "state_dir= unusable: job record 5 has version 9"),
    (UnsafePathError("/run/gpushare is not owned by root"), faults.NODE,
     "unsafe path in state_dir=: /run/gpushare is not owned by root"),
    (OSError(errno.ENOSPC, "No space left on device", "/run/gpushare/jobs/5.json"),
     faults.NODE, "state_dir= full: /run/gpushare"),
    (OSError(errno.EIO, "Input/output error", "/run/gpushare/jobs"), faults.NODE,
     "job_epilog failed: Input/output error (/run/gpushare/jobs)"),
    (KeyError("oops"), faults.NODE, "internal error in job_epilog: KeyError: 'oops'"),
    (RuntimeError(), faults.NODE, "internal error in job_epilog: RuntimeError"),
])
def test_every_error_of_the_node_path_is_sorted_with_its_cause(err, who, brief):
    fault = faults.classify("job_epilog", err, "/run/gpushare")
    assert (fault.who, fault.brief) == (who, brief)
    assert fault.detail


@pytest.fixture
def adapter(monkeypatch):
    drained: list[str] = []
    requeued: list[int] = []
    monkeypatch.setattr(spank_adapter, "_ffi", FakeFfi)
    monkeypatch.setattr(spank_adapter, "_config", None)
    monkeypatch.setattr(spank_adapter, "_drain", lambda reason, config: drained.append(reason))
    monkeypatch.setattr(spank_adapter, "_requeue",
                        lambda job_id, config: (requeued.append(job_id), ("", "test"))[1])
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    yield drained, requeued
    gslog.uninstall()


@needs_root
def test_a_users_fault_fails_only_the_job_and_leaves_the_node_in_service(
        adapter, tmp_path, monkeypatch):
    drained, requeued = adapter
    os.chmod(tmp_path, 0o755)
    state_dir = str(tmp_path / "state")

    def prolog(config, request, phases=None):
        raise MpsUserError("the job's user replaced the daemon's control socket; end "
                           "your processes using it and submit again")

    monkeypatch.setattr(job, "prolog", prolog)
    counters.begin()
    args = [f"state_dir={state_dir}", "inventory=sim:/nonexistent/%n.json"]
    assert spank_adapter.dispatch("job_prolog", FakeHost(7, {"gpu-share": "30"}), args) == 0
    assert drained == [] and requeued == []
    record = JobStore(state_dir).read(7)
    assert record is not None
    assert record.error == ("this job cannot run on node n1: the job's user replaced the "
                            "daemon's control socket; end your processes using it and "
                            "submit again")
    assert counters.read(state_dir)["refusals_total:user_daemon"] == 1


@needs_root
def test_a_node_fault_in_an_epilog_drains_without_requeueing(adapter, tmp_path,
                                                            monkeypatch):
    drained, requeued = adapter
    os.chmod(tmp_path, 0o755)
    state_dir = str(tmp_path / "state")

    def epilog(config, job_id, phases=None):
        raise ValueError("bad share")

    monkeypatch.setattr(job, "epilog", epilog)
    assert spank_adapter.dispatch("job_epilog", FakeHost(8, {}), [f"state_dir={state_dir}"]) \
        == -1
    assert drained == ["internal error in job_epilog: ValueError: bad share"]
    assert requeued == []


def fake_scontrol(tmp_path, config_line: str, requeue_rc: int = 0) -> tuple[str, str]:
    """A root-owned scontrol that logs its arguments, shows ``config_line`` as its config
    and answers requeue with ``requeue_rc``."""
    os.chmod(tmp_path, 0o755)
    log = tmp_path / "calls"
    program = tmp_path / "scontrol"
    program.write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" >> {log}\n"
        "case \"$1\" in\n"
        f"  show) echo 'PrologFlags             = Alloc'; echo '{config_line}' ;;\n"
        f"  requeue*) [ {requeue_rc} = 0 ] || {{ echo 'scontrol: error: Requested "
        "operation is presently disabled for job 9' >&2; exit 1; } ;;\n"
        "esac\n")
    os.chmod(program, 0o755)
    return str(program), str(log)


@needs_root
@pytest.mark.parametrize("line, command, done", [
    ("SchedulerParameters     = (null)", "requeuehold 9", "held"),
    ("SchedulerParameters     = bf_continue,nohold_on_prolog_fail", "requeue 9", "requeued"),
])
def test_a_failed_prologs_job_is_requeued_held_unless_nohold_on_prolog_fail(
        tmp_path, line, command, done):
    program, log = fake_scontrol(tmp_path, line)
    assert drain.requeue_job(9, scontrol=program) == (done, None)
    with open(log) as handle:
        assert handle.read().splitlines() == ["show config", command]


@needs_root
def test_a_job_slurmctld_will_not_requeue_says_why(tmp_path):
    program, _log = fake_scontrol(tmp_path, "SchedulerParameters     = (null)", requeue_rc=1)
    done, why = drain.requeue_job(9, scontrol=program)
    assert done == ""
    assert why is not None and "presently disabled" in why
