# SPDX-License-Identifier: GPL-2.0-or-later
"""Build the SPANK plugin: spank_gpushare.so and, next to it, spank_gpushare_core.so.

The plugin is plain C and does not link libpython; the core is a cffi embedding module
that it loads only for jobs that use gpushare. Run this with the distribution's python3 and
python3-cffi (the interpreter the core will embed), never a venv or pyenv one:

    /usr/bin/python3 spank/build.py --out build/spank_gpushare.so

The plugstack keys and default state directory are taken from gpushare.node.config, so the C
glue and the Python core agree on them. The flags, the embedded Python and the cffi
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
from gpushare.node.config import ARG_SPECS, PluginConfig  # noqa: E402


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

EMBEDDING_API = """
int gpushare_py_alive(void);
int gpushare_py_dispatch(const char *callback, void *host, int ac, char **av);
"""


def build_plugin(out: str) -> str:
    """The plain C plugin, compiled against the installed Slurm headers."""
    keys = [spec.key for spec in ARG_SPECS]
    defines = {
        "GS_CORE_NAME": embedbuild.c_string(CORE_NAME),
        "GS_DEFAULT_STATE_DIR": embedbuild.c_string(PluginConfig().state_dir),
        "GS_KNOWN_KEYS": ", ".join(embedbuild.c_string(k) for k in keys),
        "GS_KNOWN_KEYS_TEXT": embedbuild.c_string(", ".join(k + "=" for k in keys)),
        "GS_VERSION": embedbuild.c_string(gpushare.__version__),
    }
    cflags, ldflags = embedbuild.build_flags()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".h") as header:
        header.write("".join(f"#define {k} {v}\n" for k, v in defines.items()))
        header.flush()
        subprocess.run(
            [(sysconfig.get_config_var("CC") or "cc").split()[0], "-shared", "-O2", *cflags,
             "-fvisibility=hidden", *ldflags, "-include", header.name, "-I", HERE, "-o", out,
             os.path.join(HERE, "gpushare_spank.c"), "-ldl", "-Wl,-z,nodelete",
             "-Wl,--version-script=" + os.path.join(HERE, "exports.map")],
            check=True)
    os.chmod(out, 0o755)
    return out


def build(out: str) -> list[str]:
    """Both halves: the plugin at ``out`` and the core next to it."""
    init_code = embedbuild.init_code(CFFI_MODULE, ADAPTER, os.path.join(HERE, "_embedded.py"))
    core = os.path.join(os.path.dirname(os.path.abspath(out)), CORE_NAME)
    cdef = embedbuild.header_struct(os.path.join(HERE, "gs_host.h"), "gs_host")
    embedbuild.compile_embedded(CFFI_MODULE, EMBEDDING_API, cdef, init_code,
                                os.path.join(HERE, "gpushare_core.c"),
                                embedbuild.python_defines(),
                                os.path.join(HERE, "core_exports.map"), core)
    return [build_plugin(out), core]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/spank_gpushare.so")
    print("\n".join(build(parser.parse_args().out)))


if __name__ == "__main__":
    main()
