# SPDX-License-Identifier: GPL-2.0-or-later
# ruff: noqa: F821 - ffi, load_adapter and traceback_lines come from embed/loader.py
"""The SPANK plugin's core: its extern "Python" functions, after spank/embed/loader.py.

Every callback, with the host calls the plugin lends, goes to the adapter (build.py names
it), once the gpushare package is on sys.path (from ``pythonpath=``); anything that goes
wrong is logged through the plugin, never raised.
"""


def _pythonpath(args):
    """The plugstack's ``pythonpath=`` directories, unless empty or ``none``."""
    paths = [arg[len("pythonpath="):] for arg in args if arg.startswith("pythonpath=")]
    return [path for path in paths if path not in ("", "none")]


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
        return int(load_adapter(_pythonpath(args)).dispatch(name, host, args))
    except BaseException:
        for line in [f"gpushare: {name}: internal error:", *traceback_lines()]:
            host.log(0, line.encode("utf-8", "replace"))
        return -1
