# SPDX-License-Identifier: GPL-2.0-or-later
"""A full state_dir= is named as the cause: in the drain reason, the job's message and the
drain counter, however deep the write that hit it (a plain OSError, or one a StateError
wraps)."""

from __future__ import annotations

import errno
import os

import pytest
from spank_fakes import FakeFfi, FakeHost

from gpushare.common import log as gslog
from gpushare.node import counters, job, spank_adapter
from gpushare.node.state import JobStore, StateError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory is root's")


@pytest.fixture
def adapter(monkeypatch):
    monkeypatch.setattr(spank_adapter, "_ffi", FakeFfi)
    monkeypatch.setattr(spank_adapter, "_config", None)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    drains: list[str] = []
    monkeypatch.setattr(spank_adapter, "_drain", lambda reason, config: drains.append(reason))
    monkeypatch.setattr(spank_adapter, "_requeue", lambda job_id, config: ("", "not here"))
    yield drains
    gslog.uninstall()


def _full(path: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def _wrapped(path: str) -> StateError:
    try:
        raise _full(path)
    except OSError as err:
        try:
            raise StateError(f"state directory {path}: {err.strerror}") from err
        except StateError as wrapped:
            return wrapped


@pytest.mark.parametrize("make", [_full, _wrapped])
def test_a_full_state_dir_is_the_drain_reason_and_the_jobs_message(
        adapter, tmp_path, monkeypatch, make):
    state_dir = str(tmp_path / "state")
    where = os.path.join(state_dir, "mps", "u1000-GPU-x", "log")

    def prolog(config, request, phases=None):
        raise make(where)

    monkeypatch.setattr(job, "prolog", prolog)
    counters.begin()
    args = [f"state_dir={state_dir}", "inventory=sim:/nonexistent/%n.json"]
    assert spank_adapter.dispatch("job_prolog", FakeHost(5, {"gpu-share": "30"}), args) == -1
    assert adapter == [f"state_dir= full: {state_dir}"]
    record = JobStore(state_dir).read(5)
    assert record is not None
    assert f"no space left in state_dir= {state_dir} ({where}): No space left on device" in (
        record.error)
    assert counters.read(state_dir)["drains_total:state_dir_full"] == 1


def test_other_errors_name_their_cause(adapter, tmp_path, monkeypatch):
    state_dir = str(tmp_path / "state")

    def prolog(config, request, phases=None):
        raise OSError(errno.EIO, os.strerror(errno.EIO), state_dir)

    monkeypatch.setattr(job, "prolog", prolog)
    counters.begin()
    args = [f"state_dir={state_dir}", "inventory=sim:/nonexistent/%n.json"]
    assert spank_adapter.dispatch("job_prolog", FakeHost(6, {"gpu-share": "30"}), args) == -1
    assert adapter == [f"job_prolog failed: Input/output error ({state_dir})"]
