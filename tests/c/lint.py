# SPDX-License-Identifier: GPL-2.0-or-later
"""`make lint` for the C: every C file of the project compiled with strict warnings as
errors, then gcc's static analyzer, then cppcheck; any finding fails.

    python3 tests/c/lint.py

The files: the SPANK plugin (spank/*.c, with the constants header spank/build.py
generates, against the installed Slurm headers), the two cffi glue files (compiled alone
against Python.h; the functions their cdef names are called by cffi's generated code, so
an unused static function is not a finding there), the job_submit plugin's, the MPS
stand-in and the C tests themselves. A finding that is deliberate is suppressed where it
is, with its reason (``cppcheck-suppress`` comments).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SPANK = os.path.join(REPO, "spank")
WARNINGS = ["-std=gnu11", "-Wall", "-Wextra", "-Wformat=2", "-Wshadow", "-Werror"]
# The build's optimisation and fortification: some warnings only show with them.
BUILD_LIKE = ["-O2", "-fPIC", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2"]
# readdir_r, which cppcheck's portability check would have instead, is deprecated by glibc.
CPPCHECK = ["cppcheck", "--enable=warning,performance,portability", "--error-exitcode=1",
            "--inline-suppr", "--quiet", "--std=c11", "--library=posix",
            "--suppress=readdirCalled", "--suppress=missingIncludeSystem"]
# What the cffi glue files are given by their builds (only the names matter here).
EMBED_DEFINES = ['-DGS_LIBPYTHON="libpython3.so"', '-DGS_PYTHONHOME="/usr"',
                 '-DGS_MODULE_PATHS=L"/usr/lib/python3"', '-DGS_PYTHONPATH="/usr/lib64/gpushare"']


class Unit(NamedTuple):
    path: str
    flags: list[str]  # include paths and defines, for gcc and cppcheck alike
    gcc_only: list[str]  # flags cppcheck does not take


def units(constants_header: str) -> list[Unit]:
    """Every C file with what it is compiled with."""
    python_include = sysconfig.get_paths()["include"]
    embedded = [os.path.join(SPANK, "gpushare_core.c"),
                os.path.join(REPO, "submit_hooks", "job_submit_gpushare.c")]
    found = [Unit(path, ["-I", SPANK], ["-include", constants_header])
             for path in sorted(glob.glob(os.path.join(SPANK, "*.c"))) if path not in embedded]
    found += [Unit(path, ["-I", os.path.dirname(path), "-I", SPANK, "-I", python_include,
                          *EMBED_DEFINES], ["-include", "Python.h", "-Wno-unused-function"])
              for path in embedded]
    found += [Unit(path, [], []) for path in
              sorted(glob.glob(os.path.join(REPO, "scripts", "mps_standin", "*.c")))]
    found += [Unit(path, ["-I", SPANK, "-I", HERE], ["-include", constants_header])
              for path in sorted(glob.glob(os.path.join(HERE, "*.c")))]
    return found


def write_constants_header(path: str) -> None:
    """spank/build.py's generated header, by the system python3 the build uses."""
    subprocess.run(["/usr/bin/python3", os.path.join(SPANK, "build.py"), "--header", path],
                   check=True, stdout=subprocess.DEVNULL)


def _run(argv: list[str]) -> str:
    """``argv``'s findings: its output when it fails, else ""."""
    result = subprocess.run(argv, capture_output=True, text=True)
    return "" if result.returncode == 0 else (result.stdout + result.stderr).strip() or \
        f"`{' '.join(argv)}` exited {result.returncode}"


def findings(unit: Unit, cc: str, cppcheck: bool) -> list[str]:
    """What the compiler, its analyzer and cppcheck find in one file."""
    compile_flags = [*WARNINGS, *BUILD_LIKE, *unit.flags, *unit.gcc_only, "-c", "-o", os.devnull]
    found = [_run([cc, *compile_flags, unit.path]),
             _run([cc, "-fanalyzer", *compile_flags, unit.path])]
    if cppcheck:
        headers = [flag for flag in unit.gcc_only if flag.endswith(".h")]
        found.append(_run([*CPPCHECK, *unit.flags, *(f"--include={h}" for h in headers
                                                       if os.path.isabs(h)), unit.path]))
    return [text for text in found if text]


def main() -> int:
    cc = shutil.which("gcc")
    if cc is None:
        print("lint: gcc is missing (make deps)")
        return 1
    has_cppcheck = shutil.which("cppcheck") is not None
    if not has_cppcheck:
        print("lint: cppcheck is missing (make deps installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        header = os.path.join(tmp, "gs_constants.h")
        write_constants_header(header)
        checked = units(header)
        failed = 0
        for unit in checked:
            for text in findings(unit, cc, has_cppcheck):
                print(f"{os.path.relpath(unit.path, REPO)}:\n{text}\n")
                failed += 1
    print(f"lint: {len(checked)} C files, gcc {' '.join(WARNINGS[1:])}, -fanalyzer"
          f"{', cppcheck' if has_cppcheck else ''}: "
          + (f"{failed} with findings" if failed else "clean"))
    return 1 if failed or not has_cppcheck else 0


if __name__ == "__main__":
    sys.exit(main())
