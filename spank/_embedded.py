"""Python side of the SPANK plugin, run once per process when C first calls into Python.

It only puts the gpushare package on sys.path (from ``pythonpath=``) and hands every
callback to ``gpushare.spank_adapter``; anything that goes wrong is logged, never raised.
"""
import sys
import traceback

from _gpushare_spank import ffi, lib

_adapter = None


def _load_adapter(args):
    global _adapter
    if _adapter is None:
        for arg in args:
            if arg.startswith("pythonpath=") and arg[len("pythonpath="):] not in ("", "none"):
                path = arg[len("pythonpath="):]
                if path not in sys.path:
                    sys.path.insert(0, path)
        from gpushare import spank_adapter

        spank_adapter.bind(ffi, lib)
        _adapter = spank_adapter
    return _adapter


@ffi.def_extern()
def gpushare_py_alive():
    return 42


@ffi.def_extern(error=-1)
def gpushare_py_dispatch(callback, sp, ac, av):
    name = "?"
    try:
        name = ffi.string(callback).decode()
        args = [ffi.string(av[i]).decode("utf-8", "replace") for i in range(ac)]
        return int(_load_adapter(args).dispatch(name, sp, args))
    except BaseException:
        text = f"gpushare: {name}: internal error:\n{traceback.format_exc()}"
        for line in text.rstrip().splitlines():
            lib.gs_log(0, line.encode("utf-8", "replace"))
        return -1
