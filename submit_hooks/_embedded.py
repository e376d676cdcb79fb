# SPDX-License-Identifier: GPL-2.0-or-later
"""Python side of job_submit/gpushare: find the core, then hand every call to it.

``PYTHONPATH`` (the core's install directory) is prepended by build.py: the embedded
interpreter is isolated and reads no PYTHON* variable of slurmctld's environment.
"""
import sys
import traceback

from _gpushare_job_submit import ffi, lib

_adapter = None


def _load():
    global _adapter
    if _adapter is None:
        for path in PYTHONPATH:  # type: ignore[name-defined]  # noqa: F821 - prepended by build.py
            if path not in sys.path:
                sys.path.insert(0, path)
        from gpushare import jobsubmit_adapter

        jobsubmit_adapter.bind(ffi, lib)
        _adapter = jobsubmit_adapter
    return _adapter


@ffi.def_extern()
def gpushare_submit_alive():
    return 42


@ffi.def_extern(error=0)
def gpushare_submit_call(what, job_desc, uid, err_msg):
    try:
        return int(_load().call(what, job_desc, uid, err_msg))
    except BaseException:
        for line in traceback.format_exc().rstrip().splitlines():
            lib.gs_log(0, ("job_submit/gpushare: " + line).encode("utf-8", "replace"))
        return 0
