# SPDX-License-Identifier: GPL-2.0-or-later
"""The start of both plugins' embedded Python, run once per process on the first call.

embedbuild.init_code() puts three names before it: CFFI_MODULE, the cffi module this code
initialises; ADAPTER, the gpushare module every call is handed to; PYTHONPATH, directories
put first on sys.path before ADAPTER is imported (the embedded interpreter is isolated and
reads no PYTHON* variable). After it comes the plugin's own ``_embedded.py``: its extern
"Python" functions, which call load_adapter() and report failures with traceback_lines().
"""
import gc
import sys

_cffi_module = __import__(CFFI_MODULE)  # noqa: F821 - put before this code by the build
ffi, lib = _cffi_module.ffi, _cffi_module.lib
_adapter = None


def load_adapter(paths=()):
    """ADAPTER, imported and bound on the first call, with PYTHONPATH and then ``paths``
    put first on sys.path (those not already there)."""
    global _adapter
    if _adapter is None:
        for path in (*PYTHONPATH, *paths):  # noqa: F821 - put before this code by the build
            if path not in sys.path:
                sys.path.insert(0, path)
        # No cyclic collection while the adapter's imports run: they make no garbage
        # worth it, and collections would cost a tenth of a worker's start.
        collecting = gc.isenabled()
        gc.disable()
        try:
            adapter = __import__(ADAPTER, fromlist=["bind"])  # noqa: F821 - as PYTHONPATH
        finally:
            if collecting:
                gc.enable()
        adapter.bind(ffi, lib)
        _adapter = adapter
    return _adapter


def traceback_lines():
    """The exception being handled, as lines of text."""
    import traceback  # only here: every prolog and epilog starts a fresh interpreter

    return traceback.format_exc().rstrip().splitlines()
