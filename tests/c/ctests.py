# SPDX-License-Identifier: GPL-2.0-or-later
"""Build and run the C glue's own tests: unit tests (tests/c/test_*.c) and fuzz harnesses
(tests/c/fuzz_*.c), all under AddressSanitizer and UndefinedBehaviorSanitizer.

Each test or harness names the spank/ files it links in its header comment
(``links: gs_parse.c ...``): only the pure parsers, which need no Slurm. A harness runs
under clang's libFuzzer where clang has it, otherwise built with the C compiler and
tests/c/fuzz_main.c, a plain loop over mutated inputs; either way first over every file of
its committed seed corpus (tests/c/corpus/<parser>/, tests/c/make_corpus.py), then for a
bounded number of runs (``GPUSHARE_FUZZ_RUNS``, default ``FUZZ_RUNS``), never for a time.
Any sanitizer report fails. tests/unit/test_c_units.py and tests/unit/test_c_fuzz.py run
them in `make test`, on both Slurm releases.

    python3 tests/c/ctests.py [--out DIR] [--runs N]    build and run them all
"""

from __future__ import annotations

import argparse
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import NamedTuple, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SPANK = os.path.join(REPO, "spank")
CORPUS = os.path.join(HERE, "corpus")
FUZZ_RUNS = 50000
FUZZ_MAX_LEN = 4096  # mutated inputs; the corpus's files run whole, whatever their size
WARNINGS = ["-std=gnu11", "-Wall", "-Wextra", "-Wshadow", "-Wformat=2", "-Werror"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-g", "-O1"]
# A report ends the run with a failure; leaks count (the C glue runs in long-lived daemons).
SANITIZER_ENV = {
    "ASAN_OPTIONS": "halt_on_error=1:abort_on_error=0:detect_leaks=1:exitcode=86",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
}
_LINKS = re.compile(r"links:((?:\s+[\w.-]+\.c)+)")


class Built(NamedTuple):
    path: str
    fuzzer: str  # "libfuzzer", "loop" or "" for a unit test


def unit_tests() -> list[str]:
    """The unit tests' names (test_parse for tests/c/test_parse.c)."""
    return sorted(os.path.basename(p)[:-2] for p in glob.glob(os.path.join(HERE, "test_*.c")))


def fuzz_targets() -> list[str]:
    """The parsers with a fuzz harness (ticket for tests/c/fuzz_ticket.c)."""
    return sorted(os.path.basename(p)[5:-2] for p in glob.glob(os.path.join(HERE, "fuzz_*.c"))
                  if os.path.basename(p) != "fuzz_main.c")


def links(source: str) -> list[str]:
    """The spank/ files ``source`` names in its header's ``links:``."""
    with open(source) as handle:
        match = _LINKS.search(handle.read(2000))
    if match is None:
        raise ValueError(f"{source} names no spank/ files to link (a 'links: x.c' comment)")
    return [os.path.join(SPANK, name) for name in match.group(1).split()]


def c_compiler() -> str:
    found = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if found is None:
        raise RuntimeError("no C compiler (cc or gcc): make deps installs gcc")
    return found


def constants_header(out_dir: str) -> str:
    """The header of the names C shares with the Python, as spank/build.py generates it for
    the plugin (by the system python3 the build uses), in ``out_dir``."""
    path = os.path.join(out_dir, "gs_constants.h")
    if not os.path.exists(path):
        subprocess.run(["/usr/bin/python3", os.path.join(SPANK, "build.py"), "--header", path],
                       check=True, stdout=subprocess.DEVNULL)
    return path


def _compile(compiler: str, sources: Sequence[str], out: str, extra: Sequence[str]) -> None:
    header = constants_header(os.path.dirname(os.path.abspath(out)))
    result = subprocess.run([compiler, *WARNINGS, *SANITIZE, *extra, "-include", header,
                             "-I", SPANK, "-I", HERE, "-o", out, *sources],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(result.args)}\n{result.stdout}{result.stderr}")


@functools.cache
def libfuzzer_clang() -> Optional[str]:
    """clang when it can link a libFuzzer harness with both sanitizers (the runtime is
    libclang-rt-<N>-dev on Debian), else None."""
    clang = shutil.which("clang")
    if clang is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.c")
        with open(probe, "w") as handle:
            handle.write("#include <stddef.h>\n#include <stdint.h>\n"
                         "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)"
                         "{ (void)d; (void)n; return 0; }\n")
        result = subprocess.run([clang, "-fsanitize=fuzzer,address,undefined", "-o",
                                 os.path.join(tmp, "probe"), probe], capture_output=True)
    return clang if result.returncode == 0 else None


def build_unit(name: str, out_dir: str) -> Built:
    source = os.path.join(HERE, name + ".c")
    out = os.path.join(out_dir, name)
    _compile(c_compiler(), [source, *links(source)], out, [])
    return Built(out, "")


def fuzz_drivers() -> list[str]:
    """How harnesses can run here: "libfuzzer" (with clang), and always "loop"."""
    return (["libfuzzer"] if libfuzzer_clang() else []) + ["loop"]


def build_fuzzer(parser: str, out_dir: str, driver: Optional[str] = None,
                 source: Optional[str] = None) -> Built:
    """Harness tests/c/fuzz_<parser>.c (or ``source``) with libFuzzer where clang has it,
    else (or for ``driver`` "loop") with fuzz_main.c's loop."""
    source = source or os.path.join(HERE, f"fuzz_{parser}.c")
    driver = driver or fuzz_drivers()[0]
    out = os.path.join(out_dir, f"fuzz_{parser}.{driver}")
    if driver == "libfuzzer":
        clang = libfuzzer_clang()
        if clang is None:
            raise RuntimeError("clang with libFuzzer is not installed (make deps)")
        _compile(clang, [source, *links(source)], out, ["-fsanitize=fuzzer"])
    else:
        _compile(c_compiler(), [source, os.path.join(HERE, "fuzz_main.c"), *links(source)],
                 out, [])
    return Built(out, driver)


def sanitizer_env() -> dict[str, str]:
    return {**os.environ, **SANITIZER_ENV}


def run_unit(built: Built) -> subprocess.CompletedProcess[str]:
    """A unit test, given its parser's corpus directory (test_ticket: corpus/ticket)."""
    corpus = os.path.join(CORPUS, os.path.basename(built.path)[5:])
    return subprocess.run([built.path, corpus], capture_output=True, text=True,
                          env=sanitizer_env(), timeout=300)


def fuzz_runs() -> int:
    return int(os.environ.get("GPUSHARE_FUZZ_RUNS", FUZZ_RUNS))


def run_fuzzer(built: Built, parser: str, work_dir: str, runs: Optional[int] = None
               ) -> list[subprocess.CompletedProcess[str]]:
    """Every corpus file once, whole; then ``runs`` mutated inputs (seed 1: a failure
    reruns the same). New inputs libFuzzer finds go to ``work_dir``, never to the corpus."""
    corpus = os.path.join(CORPUS, parser)
    files = sorted(os.path.join(corpus, name) for name in os.listdir(corpus))
    found = os.path.join(work_dir, "found")
    os.makedirs(found, exist_ok=True)
    common = [f"-artifact_prefix={work_dir}/", "-seed=1"]
    whole = subprocess.run([built.path, *common, *files], capture_output=True, text=True,
                           env=sanitizer_env(), timeout=300)
    if whole.returncode != 0:
        return [whole]
    mutated = subprocess.run(
        [built.path, *common, f"-runs={fuzz_runs() if runs is None else runs}",
         f"-max_len={FUZZ_MAX_LEN}", "-print_final_stats=1", found, corpus],
        capture_output=True, text=True, env=sanitizer_env(), timeout=600)
    return [whole, mutated]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where to build (default: a temporary directory)")
    parser.add_argument("--runs", type=int, help=f"mutated runs per harness ({FUZZ_RUNS})")
    opts = parser.parse_args()
    out = opts.out or tempfile.mkdtemp(prefix="gpushare-ctests.")
    os.makedirs(out, exist_ok=True)
    failed = 0
    for name in unit_tests():
        result = run_unit(build_unit(name, out))
        print(f"{name}: {'ok' if result.returncode == 0 else 'FAILED'}")
        if result.returncode != 0:
            print(result.stdout + result.stderr)
            failed += 1
    for target in fuzz_targets():
        built = build_fuzzer(target, out)
        work = os.path.join(out, f"work_{target}")
        os.makedirs(work, exist_ok=True)
        results = run_fuzzer(built, target, work, opts.runs)
        bad = [r for r in results if r.returncode != 0]
        print(f"fuzz_{target} ({built.fuzzer}): {'FAILED' if bad else 'ok'}")
        for result in bad:
            print(result.stdout[-4000:] + result.stderr[-8000:])
        failed += bool(bad)
    if not opts.out:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
