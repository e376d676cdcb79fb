# SPDX-License-Identifier: GPL-2.0-or-later
"""Unit tests never reach a Slurm of the machine they run on."""

import pytest


@pytest.fixture(autouse=True)
def no_host_slurm(monkeypatch, tmp_path_factory):
    """``squeue``/``scontrol`` find no slurm.conf: a controller that happens to run on this
    machine (its /etc/slurm) cannot change what a unit test sees."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path_factory.getbasetemp() / "no-slurm.conf"))
    # Nor its release (22.05 on one test machine, 24.11 on the other): no Slurm here, unless
    # a test says otherwise.
    from gpushare.admin import slurm_client

    monkeypatch.setattr(slurm_client, "installed_release", lambda *args, **kwargs: None)
    monkeypatch.setenv("GPUSHARE_SLURMCTLD", "/nonexistent/slurmctld")  # job_submit.lua's


@pytest.fixture(autouse=True)
def no_worker_deadline(monkeypatch):
    """A worker's deadline (gpushare.node.phases) is its process's: one test's callback
    never bounds the waits of the tests after it, which run in the same process."""
    import contextlib
    import os

    from gpushare.node import phases

    monkeypatch.setattr(phases, "_deadline", None)
    monkeypatch.setattr(phases, "_board", None)
    yield
    if phases._board is not None:
        with contextlib.suppress(OSError):  # closed by the test's own fixture
            os.close(phases._board)
        phases._board = None
