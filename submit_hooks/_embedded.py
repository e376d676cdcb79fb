# SPDX-License-Identifier: GPL-2.0-or-later
# ruff: noqa: F821 - ffi, lib, load_adapter and traceback_lines come from embed/loader.py
"""job_submit/gpushare's extern "Python" functions, after spank/embed/loader.py.

Every call goes to the adapter (build.py names it and compiles in the core's install
directory as PYTHONPATH); a failure is logged and the call returns 0.
"""


@ffi.def_extern()
def gpushare_submit_alive():
    return 42


@ffi.def_extern(error=0)
def gpushare_submit_call(what, job_desc, uid, err_msg):
    try:
        return int(load_adapter().call(what, job_desc, uid, err_msg))
    except BaseException:
        for line in traceback_lines():
            lib.gs_log(0, ("job_submit/gpushare: " + line).encode("utf-8", "replace"))
        return 0
