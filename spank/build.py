# SPDX-License-Identifier: GPL-2.0-or-later
"""Build the SPANK plugin: spank_gpushare.so and, next to it, spank_gpushare_core.so.

The plugin is plain C and does not link libpython; the core is a cffi embedding module
that it loads only for jobs that use gpushare. Run this with the distribution's python3 and
python3-cffi (the interpreter the core will embed), never a venv or pyenv one:

    /usr/bin/python3 spank/build.py --out build/spank_gpushare.so

A package passes ``--pythonpath DIR``, where it installs the gpushare Python: the plugin takes
it when the plugstack line has no ``pythonpath=`` (GS_DEFAULT_PYTHONPATH in C,
DEFAULT_PYTHONPATH in the core), and checks it as a given one.

The plugin is one entry file (gpushare_spank.c) and one file per concern (PLUGIN_SOURCES),
compiled together with the same flags. What C and Python must agree on (the plugstack keys,
the defaults, lock names, the wait limit's constants) is generated from the Python into a
header (constants_header(); ``--header PATH`` writes it for a test build), so each is written
once. The flags, the embedded Python and the cffi
compilation are those of embed/embedbuild.py, shared with the job_submit plugin's build
(submit_hooks/build.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import gpushare  # noqa: E402
from gpushare.node import counters, drain, faults, job, phases, prefork, state, ticket  # noqa: E402
from gpushare.node.config import ARG_SPECS, PluginConfig  # noqa: E402
from gpushare.node.mps import record  # noqa: E402


def _load_embedbuild():
    """spank/embed/embedbuild.py, by its path."""
    spec = importlib.util.spec_from_file_location(
        "embedbuild", os.path.join(HERE, "embed", "embedbuild.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


embedbuild = _load_embedbuild()

CORE_NAME = "spank_gpushare_core.so"
CFFI_MODULE = "_gpushare_spank"
ADAPTER = "gpushare.node.spank_adapter"  # the module every callback goes to

# What the core's dispatch returns when the gpushare package cannot be imported (a node
# fault: the C glue drains the node for it), apart from a callback's own failure (-1).
IMPORT_FAILED = -2

EMBEDDING_API = """
int gpushare_py_alive(void);
int gpushare_py_dispatch(const char *callback, void *host, int ac, char **av);
void gpushare_py_prefork(const char *state_dir, const char *code, int ac, char **av);
"""


# The plugin's files: the entry file with the SPANK symbols, then one per concern. The pure
# parsers (gs_ticket.c, gs_envfile.c, gs_parse.c) include no Slurm header.
PLUGIN_SOURCES = ("gpushare_spank.c", "gs_args.c", "gs_core.c", "gs_worker.c", "gs_fastpath.c",
                  "gs_taskenv.c", "gs_safefs.c", "gs_log.c", "gs_ticket.c", "gs_envfile.c",
                  "gs_parse.c", "gs_drain.c", "gs_deadline.c", "gs_prefork.c")


def _printf_format(python_format: str, *fields: tuple[str, str]) -> str:
    """A Python format with ``{}`` (an integer) or the named ``fields`` as a C printf format
    (each field's C conversion given with it)."""
    if "%" in python_format:
        raise ValueError(f"cannot turn {python_format!r} into a C format")
    if not fields:
        if python_format.count("{}") != 1:
            raise ValueError(f"cannot turn {python_format!r} into a C format")
        return python_format.replace("{}", "%ld")
    converted = python_format
    for name, conversion in fields:
        if converted.count("{" + name + "}") != 1:
            raise ValueError(f"{python_format!r} must name {{{name}}} once")
        converted = converted.replace("{" + name + "}", conversion)
    if "{" in converted or "}" in converted:
        raise ValueError(f"{python_format!r} has fields the C glue does not fill")
    return converted


def constants(pythonpath: str = "") -> dict[str, str]:
    """What the C glue shares with the Python core, as C macro values, taken from the Python
    that owns each; ``pythonpath`` is the default of ``pythonpath=`` (``--pythonpath``)."""
    keys = [spec.key for spec in ARG_SPECS]
    return {
        "GS_CORE_NAME": embedbuild.c_string(CORE_NAME),
        "GS_DEFAULT_PYTHONPATH": embedbuild.c_string(pythonpath),
        "GS_CORE_IMPORT_FAILED": str(IMPORT_FAILED),
        "GS_DEFAULT_STATE_DIR": embedbuild.c_string(PluginConfig().state_dir),
        "GS_DEFAULT_TIMEOUT": repr(float(PluginConfig().timeout)),
        "GS_KNOWN_KEYS": ", ".join(embedbuild.c_string(k) for k in keys),
        "GS_KNOWN_KEYS_TEXT": embedbuild.c_string(", ".join(k + "=" for k in keys)),
        "GS_VERSION": embedbuild.c_string(gpushare.__version__),
        "GS_WORKER_DEADLINE_TIMEOUTS": repr(float(job.WORKER_DEADLINE_TIMEOUTS)),
        "GS_WORKER_DEADLINE_MARGIN": repr(float(job.WORKER_DEADLINE_MARGIN)),
        "GS_FAULT_TIMEOUTS": repr(float(job.FAULT_TIMEOUTS)),
        "GS_KILL_WAIT": repr(float(job.KILL_WAIT)),
        "GS_BOARD_SIZE": str(phases.BOARD_SIZE),
        "GS_EPILOGS_LOCK": embedbuild.c_string(job.EPILOGS_LOCK),
        "GS_GPU_EPILOGS_LOCK_FMT": embedbuild.c_string(_printf_format(job.GPU_EPILOGS_LOCK)),
        "GS_JOBS_DIR": embedbuild.c_string(state.JOBS_DIR),
        "GS_RECORD_SUFFIX": embedbuild.c_string(state.RECORD_SUFFIX),
        "GS_ENV_SUFFIX": embedbuild.c_string(state.ENV_SUFFIX),
        "GS_LOCK_SUFFIX": embedbuild.c_string(state.LOCK_SUFFIX),
        "GS_USAGE_DIR": embedbuild.c_string(state.USAGE_DIR),
        "GS_DAEMONS_DIR": embedbuild.c_string(os.path.basename(PluginConfig().daemons_dir)),
        "GS_TICKETS_DIR": embedbuild.c_string(record.TICKETS),
        "GS_DAEMON_JOBS_SUFFIX": embedbuild.c_string(record.JOBS_SUFFIX),
        "GS_TICKET_FORMAT": embedbuild.c_string(ticket.FORMAT),
        "GS_TICKET_NAME_FMT": embedbuild.c_string(_printf_format(
            ticket.NAME_FORMAT, ("uid", "%u"), ("gpus", "%s"), ("share", "%s"))),
        "GS_JOB_ID_MARK": embedbuild.c_string(ticket.JOB_ID_MARK),
        "GS_CREATED_MARK": embedbuild.c_string(ticket.CREATED_MARK),
        "GS_COUNTERS_FILE": embedbuild.c_string(counters.FILE),
        "GS_COUNTERS_FAST_FILE": embedbuild.c_string(counters.FAST_FILE),
        "GS_SCONTROL": embedbuild.c_string(drain.SCONTROL),
        "GS_DRAIN_PREFIX": embedbuild.c_string(drain.PREFIX),
        "GS_DRAIN_REASON_MAX": str(drain.DRAIN_REASON_MAX),
        "GS_PREFORK_SOCKET": embedbuild.c_string(prefork.SOCKET),
        "GS_PREFORK_PROTOCOL": embedbuild.c_string(prefork.PROTOCOL.decode()),
        "GS_STATE_DIR_FULL_FMT": embedbuild.c_string(_printf_format(
            faults.STATE_DIR_FULL, ("state_dir", "%s"))),
    }


def constants_header(pythonpath: str = "") -> str:
    """The header every file of the plugin is compiled with (``-include``)."""
    lines = ["/* Generated by spank/build.py from the Python core: do not edit. */",
             "#ifndef GS_CONSTANTS_H", "#define GS_CONSTANTS_H"]
    lines += [f"#define {name} {value}" for name, value in constants(pythonpath).items()]
    return "\n".join([*lines, "#endif", ""])


def build_plugin(out: str, pythonpath: str = "") -> str:
    """The plain C plugin, compiled against the installed Slurm headers."""
    cflags, ldflags = embedbuild.build_flags()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".h") as header:
        header.write(constants_header(pythonpath))
        header.flush()
        subprocess.run(
            [(sysconfig.get_config_var("CC") or "cc").split()[0], "-shared", "-O2", *cflags,
             "-fvisibility=hidden", *ldflags, "-include", header.name, "-I", HERE, "-o", out,
             *(os.path.join(HERE, name) for name in PLUGIN_SOURCES), "-ldl",
             "-Wl,-z,nodelete", "-Wl,--version-script=" + os.path.join(HERE, "exports.map")],
            check=True)
    os.chmod(out, 0o755)
    return out


def core_names(pythonpath: str) -> str:
    """The names _embedded.py takes from the build: both halves agree on them."""
    return f"DEFAULT_PYTHONPATH = {pythonpath!r}\nIMPORT_FAILED = {IMPORT_FAILED!r}\n"


def build(out: str, pythonpath: str = "") -> list[str]:
    """Both halves: the plugin at ``out`` and the core next to it. ``pythonpath``: where
    the package installs the gpushare Python, taken when the plugstack line has no
    ``pythonpath=`` ("" for none: the interpreter's own path only)."""
    if pythonpath and not pythonpath.startswith("/"):
        raise SystemExit(f"--pythonpath {pythonpath}: expected an absolute directory")
    init_code = core_names(pythonpath) + embedbuild.init_code(
        CFFI_MODULE, ADAPTER, os.path.join(HERE, "_embedded.py"))
    core = os.path.join(os.path.dirname(os.path.abspath(out)), CORE_NAME)
    cdef = embedbuild.header_struct(os.path.join(HERE, "gs_host.h"), "gs_host")
    embedbuild.compile_embedded(CFFI_MODULE, EMBEDDING_API, cdef, init_code,
                                os.path.join(HERE, "gpushare_core.c"),
                                embedbuild.python_defines(),
                                os.path.join(HERE, "core_exports.map"), core)
    return [build_plugin(out, pythonpath), core]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/spank_gpushare.so")
    parser.add_argument("--pythonpath", default="", metavar="DIR",
                        help="the default of the plugstack argument pythonpath=: the "
                        "package's own install directory of the gpushare Python (default: "
                        "none)")
    parser.add_argument("--header", metavar="PATH",
                        help="only write the generated constants header to PATH")
    options = parser.parse_args()
    if options.header:
        with open(options.header, "w") as header:
            header.write(constants_header(options.pythonpath))
        return
    print("\n".join(build(options.out, options.pythonpath)))


if __name__ == "__main__":
    main()
