# SPDX-License-Identifier: GPL-2.0-or-later
"""Python side of the SPANK plugin's core, run once per process on the first callback.

It only puts the gpushare package on sys.path (from ``pythonpath=``) and hands every
callback, with the host calls the plugin lends, to ``gpushare.node.spank_adapter``; anything
that goes wrong is logged through the plugin, never raised.
"""
import sys

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
        from gpushare.node import spank_adapter

        spank_adapter.bind(ffi, lib)
        _adapter = spank_adapter
    return _adapter


@ffi.def_extern()
def gpushare_py_alive():
    return 42


@ffi.def_extern(error=-1)
def gpushare_py_dispatch(callback, host_ptr, ac, av):
    host = ffi.cast("struct gs_host *", host_ptr)
    name = "?"
    try:
        name = ffi.string(callback).decode()
        args = [ffi.string(av[i]).decode("utf-8", "replace") for i in range(ac)]
        return int(_load_adapter(args).dispatch(name, host, args))
    except BaseException:
        import traceback  # only here: every prolog and epilog starts a fresh interpreter

        text = f"gpushare: {name}: internal error:\n{traceback.format_exc()}"
        for line in text.rstrip().splitlines():
            host.log(0, line.encode("utf-8", "replace"))
        return -1
