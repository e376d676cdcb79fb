# SPDX-License-Identifier: GPL-2.0-or-later
# ruff: noqa: F821 - ffi, load_adapter and traceback_lines come from embed/loader.py,
# DEFAULT_PYTHONPATH and IMPORT_FAILED from build.py (core_names)
"""The SPANK plugin's core: its extern "Python" functions, after spank/embed/loader.py.

Every callback, with the host calls the plugin lends, goes to the adapter (build.py names
it), once the gpushare package is on sys.path (from ``pythonpath=``, else the package's
own directory the build names, DEFAULT_PYTHONPATH); anything that goes wrong is logged
through the plugin, never raised. A package that cannot be imported returns IMPORT_FAILED:
the node's fault, which the C glue drains the node for (spank/gs_core.c).
"""


def _pythonpath(args):
    """The plugstack's ``pythonpath=`` directories, unless empty or ``none``; without the
    argument, the build's default (as the C glue checks it, gs_args.c)."""
    paths = [arg[len("pythonpath="):] for arg in args if arg.startswith("pythonpath=")]
    if not paths:
        paths = [DEFAULT_PYTHONPATH]
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
    except BaseException:
        for line in [f"gpushare: {name}: internal error:", *traceback_lines()]:
            host.log(0, line.encode("utf-8", "replace"))
        return -1
    try:
        adapter = load_adapter(_pythonpath(args))
    except BaseException:
        for line in [f"gpushare: {name}: cannot import the gpushare package:",
                     *traceback_lines()]:
            host.log(0, line.encode("utf-8", "replace"))
        return IMPORT_FAILED
    try:
        return int(adapter.dispatch(name, host, args))
    except BaseException:
        for line in [f"gpushare: {name}: internal error:", *traceback_lines()]:
            host.log(0, line.encode("utf-8", "replace"))
        return -1


@ffi.def_extern()
def gpushare_py_prefork(state_dir, code, ac, av):
    """prefork=yes: fork the node's prefork server off this interpreter, once the core is
    imported; a failure leaves this worker and the next ones running in place."""
    try:
        args = [ffi.string(av[i]).decode("utf-8", "replace") for i in range(ac)]
        adapter = load_adapter(_pythonpath(args))
        adapter.spawn_prefork(ffi.string(state_dir).decode(), ffi.string(code).decode())
    except BaseException:
        pass
