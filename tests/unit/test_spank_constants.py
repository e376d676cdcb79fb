# SPDX-License-Identifier: GPL-2.0-or-later
"""The names and numbers the C glue shares with the Python core are generated from the
Python (spank/build.py writes them into the header every C file is compiled with): what the
C builds from them is what the Python builds."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from typing import Any

import pytest

from gpushare.node import counters, faults, job, phases, state, ticket
from gpushare.node.config import ARG_SPECS, PluginConfig
from gpushare.node.usage.store import UsageStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEM_PYTHON = "/usr/bin/python3"
_DEFINE = re.compile(r"^#define (GS_[A-Z_]+) (.*)$")


def _has_cffi() -> bool:
    return os.access(SYSTEM_PYTHON, os.X_OK) and subprocess.run(
        [SYSTEM_PYTHON, "-c", "import cffi"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _has_cffi(), reason="the build needs python3-cffi")


@pytest.fixture(scope="module")
def header(tmp_path_factory) -> dict[str, str]:
    """``spank/build.py --header``: each macro with its C value."""
    path = tmp_path_factory.mktemp("spank") / "gs_constants.h"
    subprocess.run([SYSTEM_PYTHON, os.path.join(REPO, "spank", "build.py"), "--header",
                    str(path)], check=True)
    defines = {}
    for line in path.read_text().splitlines():
        match = _DEFINE.match(line)
        if match:
            defines[match[1]] = match[2]
    return defines


def c_value(text: str) -> Any:
    """A macro's value as Python reads it: a string, a number, or a list of strings."""
    return ast.literal_eval(text)


def c_printf(c_format: str, *values: object) -> str:
    return c_format.replace("%ld", "%d") % values


def test_the_names_c_builds_are_the_pythons(header):
    env = {"SLURM_JOB_GPUS": "0,3", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    assert c_printf(c_value(header["GS_TICKET_NAME_FMT"]).replace("%u", "%d"), 1001, "0_3",
                    "25") == ticket.name(1001, env)
    assert c_printf(c_value(header["GS_GPU_EPILOGS_LOCK_FMT"]), 7) == (
        job.GPU_EPILOGS_LOCK.format(7))
    assert c_value(header["GS_EPILOGS_LOCK"]) == job.EPILOGS_LOCK
    store = state.JobStore("/state")
    for suffix in ("GS_RECORD_SUFFIX", "GS_ENV_SUFFIX", "GS_LOCK_SUFFIX"):
        assert store.path(12, c_value(header[suffix])) == os.path.join(
            "/state", c_value(header["GS_JOBS_DIR"]), "12" + c_value(header[suffix]))
    assert store.path(12) == f"/state/jobs/12{c_value(header['GS_RECORD_SUFFIX'])}"
    assert UsageStore("/state").directory == os.path.join("/state",
                                                           c_value(header["GS_USAGE_DIR"]))
    assert os.path.join("/state", c_value(header["GS_DAEMONS_DIR"])) == PluginConfig(
        state_dir="/state").daemons_dir
    assert c_value(header["GS_TICKET_FORMAT"]) == ticket.FORMAT
    assert c_value(header["GS_STATE_DIR_FULL_FMT"]).replace("%s", "/state") == \
        faults.classify("job_prolog", OSError(28, "No space left on device"), "/state").brief
    assert (c_value(header["GS_JOB_ID_MARK"]), c_value(header["GS_CREATED_MARK"])) == (
        ticket.JOB_ID_MARK, ticket.CREATED_MARK)
    assert (c_value(header["GS_COUNTERS_FILE"]), c_value(header["GS_COUNTERS_FAST_FILE"])) == (
        counters.FILE, counters.FAST_FILE)


@pytest.mark.parametrize("timeout", [0.1, 10.0, 600.0])
def test_the_deadline_and_wait_limit_c_computes_are_the_pythons(header, timeout):
    """spank/gs_deadline.c: gs_worker_deadline and gs_wait_limit, from the header."""
    margin = c_value(header["GS_WORKER_DEADLINE_MARGIN"])
    c_deadline = c_value(header["GS_WORKER_DEADLINE_TIMEOUTS"]) * timeout + margin
    c_wait = c_deadline + c_value(header["GS_FAULT_TIMEOUTS"]) * timeout + margin
    config = PluginConfig(timeout=timeout)
    assert c_deadline == job.worker_deadline(config)
    assert c_wait == job.wait_limit(config)
    assert job.wait_limit(config) > job.worker_deadline(config)
    assert c_value(header["GS_BOARD_SIZE"]) == phases.BOARD_SIZE
    assert c_value(header["GS_DEFAULT_TIMEOUT"]) == PluginConfig().timeout


def test_the_plugstack_keys_and_defaults_are_the_configs(header):
    assert list(c_value(header["GS_KNOWN_KEYS"])) == [spec.key for spec in ARG_SPECS]
    assert c_value(header["GS_DEFAULT_STATE_DIR"]) == PluginConfig().state_dir
