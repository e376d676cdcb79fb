"""Build spank_gpushare.so: the SPANK plugin, cffi embedding mode.

Run it with the distribution's python3 and python3-cffi (the interpreter the plugin will
embed), never a venv or pyenv one:

    /usr/bin/python3 spank/build.py --out build/spank_gpushare.so

The plugstack keys and default state directory are taken from gpushare.config, so the C
glue and the Python core agree on them.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import cffi  # noqa: E402

from gpushare.config import ARG_SPECS, PluginConfig  # noqa: E402

CDEF = """
int gs_context(void);
void gs_log(int level, const char *msg);
int gs_job_ids(void *sp, uint32_t *job_id, uint32_t *uid, uint32_t *gid);
const char *gs_getopt(void *sp, const char *name);
"""

EMBEDDING_API = """
int gpushare_py_alive(void);
int gpushare_py_dispatch(const char *callback, void *sp, int ac, char **av);
"""


def c_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def build(out: str) -> str:
    if sys.prefix != sys.base_prefix:
        raise SystemExit("build.py: run it with the system python3, not a virtual environment")
    libpython = sysconfig.get_config_var("INSTSONAME")
    if not libpython or not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise SystemExit(f"build.py: {sys.executable} has no shared libpython to embed")
    keys = [spec.key for spec in ARG_SPECS]
    defines = {
        "GS_LIBPYTHON": c_string(libpython),
        "GS_PYTHONHOME": c_string(sys.base_prefix),
        "GS_DEFAULT_STATE_DIR": c_string(PluginConfig().state_dir),
        "GS_KNOWN_KEYS": ", ".join(c_string(k) for k in keys),
        "GS_KNOWN_KEYS_TEXT": c_string(", ".join(k + "=" for k in keys)),
    }
    preamble = "\n".join(f"#define {k} {v}" for k, v in defines.items())
    with open(os.path.join(HERE, "gpushare_spank.c")) as src:
        glue = src.read()
    with open(os.path.join(HERE, "_embedded.py")) as src:
        init_code = src.read()

    ffi = cffi.FFI()
    ffi.embedding_api(EMBEDDING_API)
    ffi.cdef(CDEF)
    ffi.embedding_init_code(init_code)
    ffi.set_source(
        "_gpushare_spank",
        preamble + "\n" + glue,
        extra_compile_args=["-Wall", "-Werror=implicit-function-declaration",
                            "-fvisibility=hidden"],
        extra_link_args=[
            "-Wl,-z,nodelete",
            "-Wl,--version-script=" + os.path.join(HERE, "exports.map"),
        ],
    )
    with tempfile.TemporaryDirectory() as tmp:
        built = ffi.compile(tmpdir=tmp, target="_gpushare_spank.*", verbose=False)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        shutil.copyfile(built, out)
    os.chmod(out, 0o755)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/spank_gpushare.so")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
