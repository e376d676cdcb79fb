# SPDX-License-Identifier: GPL-2.0-or-later
"""What the builds of both plugins share: the hardening and distribution flags, the Python
to embed, and the compilation of a cffi embedding module.

spank/build.py and submit_hooks/build.py load this file by its path (``load()`` in each),
run by the distribution's python3 with python3-cffi, never a venv or pyenv one.

Both plugins get pyxis's hardening (stack protector, FORTIFY, full RELRO, no executable
stack) and then the distribution's CPPFLAGS, CFLAGS and LDFLAGS from the environment; the
RPM spec sets those to %{optflags} and %{build_ldflags}.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Sequence

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))

# The hardening NVIDIA's pyxis builds its SPANK plugin with, in every build of both plugins.
HARDENING_CFLAGS = ["-fPIC", "-fstack-protector-strong", "-Wall", "-Wformat",
                    "-Werror=format-security", "-Werror=implicit-function-declaration"]
HARDENING_FORTIFY = ["-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2"]
HARDENING_LDFLAGS = ["-Wl,-z,relro", "-Wl,-z,now", "-Wl,-z,noexecstack"]
# The distribution's flags, as rpmbuild's %{optflags} and %{build_ldflags} (the spec exports
# them) or dpkg-buildflags would give them.
DISTRIBUTION_FLAG_VARS = ("CPPFLAGS", "CFLAGS", "LDFLAGS")
# GPUSHARE_SANITIZE=1: a test build with AddressSanitizer and UndefinedBehaviorSanitizer
# (tests/slurm/test_c_sanitized.py runs real jobs through it); never a build to install.
SANITIZE_VAR = "GPUSHARE_SANITIZE"
SANITIZE_CFLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
SANITIZE_LDFLAGS = ["-fsanitize=address,undefined"]


def c_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def c_wide_string(value: str) -> str:
    """A C wide string literal (L"..."): escapes for quote and backslash, octal for control
    characters, universal character names for the rest outside ASCII."""
    out = []
    for ch in value:
        if ch in '\\"':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return 'L"' + "".join(out) + '"'


def header_struct(header: str, name: str) -> str:
    """``struct name { ... };`` as ``header`` declares it, for a cdef: the C code and cffi
    read the one declaration."""
    with open(header) as handle:
        text = handle.read()
    match = re.search(r"^struct " + re.escape(name) + r" \{\n.*?^\};$", text, re.M | re.S)
    if match is None:
        raise SystemExit(f"build: {header} declares no struct {name}")
    return match.group(0)


def isolated_module_paths() -> list[str]:
    """sys.path of this interpreter started isolated, as ``site`` would leave it."""
    out = subprocess.run([sys.executable, "-I", "-c", "import json, sys; print(json.dumps("
                          "[p for p in sys.path if p]))"], capture_output=True, text=True,
                         check=True).stdout
    return [str(path) for path in json.loads(out)]


def python_defines() -> dict[str, str]:
    """Which libpython to promote, its home and module path: this (system) interpreter's."""
    if sys.prefix != sys.base_prefix:
        raise SystemExit("build: run it with the system python3, not a virtual environment")
    libpython = sysconfig.get_config_var("INSTSONAME")
    if not libpython or not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise SystemExit(f"build: {sys.executable} has no shared libpython to embed")
    return {"GS_LIBPYTHON": c_string(libpython), "GS_PYTHONHOME": c_string(sys.base_prefix),
            "GS_MODULE_PATHS": ", ".join(c_wide_string(p) for p in isolated_module_paths())}


def build_flags() -> tuple[list[str], list[str]]:
    """Compiler and linker flags for both plugins: the hardening, the sanitizers when
    ``GPUSHARE_SANITIZE=1``, then the distribution's CPPFLAGS, CFLAGS and LDFLAGS from the
    environment, last so that their choices (the optimisation level, a FORTIFY level of
    their own) win."""
    dist_c = shlex.split(os.environ.get("CPPFLAGS", "")) + shlex.split(os.environ.get("CFLAGS", ""))
    dist_ld = shlex.split(os.environ.get("LDFLAGS", ""))
    fortify = [] if any("_FORTIFY_SOURCE" in flag for flag in dist_c) else HARDENING_FORTIFY
    sanitize = os.environ.get(SANITIZE_VAR) == "1"
    return (HARDENING_CFLAGS + fortify + (SANITIZE_CFLAGS if sanitize else []) + dist_c,
            HARDENING_LDFLAGS + (SANITIZE_LDFLAGS if sanitize else []) + dist_ld)


@contextlib.contextmanager
def without_distribution_flags():
    """Hide CPPFLAGS/CFLAGS/LDFLAGS from setuptools while cffi compiles: build_flags() passes
    them explicitly, in the same order as for the plain plugin, and only once."""
    saved = {name: os.environ.pop(name) for name in DISTRIBUTION_FLAG_VARS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def init_code(cffi_module: str, adapter: str, externs: str,
              pythonpath: Sequence[str] = ()) -> str:
    """A core's Python: the names loader.py expects (``cffi_module``, the gpushare module
    ``adapter`` every call goes to, ``pythonpath``), loader.py, then the plugin's extern
    "Python" functions from the file ``externs``."""
    parts = [f"CFFI_MODULE = {cffi_module!r}\nADAPTER = {adapter!r}\n"
             f"PYTHONPATH = {list(pythonpath)!r}\n"]
    for path in (os.path.join(HERE, "loader.py"), externs):
        with open(path) as src:
            parts.append(src.read())
    return "\n".join(parts)


def compile_embedded(module: str, api: str, cdef: str, init_code: str, glue_path: str,
                     defines: dict[str, str], exports: str, out: str) -> str:
    """Compile one cffi embedding module whose C glue is ``glue_path``; copy it to ``out``.

    The glue's own directory is the include path: its quoted includes are relative to it."""
    preamble = "\n".join(f"#define {k} {v}" for k, v in defines.items())
    with open(glue_path) as src:
        glue = src.read()
    ffi = cffi.FFI()
    ffi.embedding_api(api)
    ffi.cdef(cdef)
    ffi.embedding_init_code(init_code)
    cflags, ldflags = build_flags()
    ffi.set_source(
        module,
        preamble + "\n" + glue,
        include_dirs=[os.path.dirname(os.path.abspath(glue_path))],
        extra_compile_args=["-fvisibility=hidden", *cflags],
        extra_link_args=["-Wl,-z,nodelete", "-Wl,--version-script=" + exports, *ldflags],
    )
    with tempfile.TemporaryDirectory() as tmp, without_distribution_flags():
        built = ffi.compile(tmpdir=tmp, target=f"{module}.*", verbose=False)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        shutil.copyfile(built, out)
    os.chmod(out, 0o755)
    return out
