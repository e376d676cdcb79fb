# SPDX-License-Identifier: GPL-2.0-or-later
"""The C glue's parsers fuzzed under ASan and UBSan (tests/c/fuzz_*.c): every file of the
committed seed corpus whole, then a bounded number of mutated inputs, with libFuzzer where
clang has it and with the plain loop of tests/c/fuzz_main.c always. Any report fails."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

C_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "c")
_spec = importlib.util.spec_from_file_location("gpushare_ctests",
                                               os.path.join(C_DIR, "ctests.py"))
assert _spec is not None and _spec.loader is not None
ctests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ctests)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="needs a C compiler (make deps installs gcc)")


def test_every_parser_has_a_harness_and_a_seed_corpus():
    targets = ctests.fuzz_targets()
    assert {"ticket", "envfile", "share", "proc_stat", "gpu_list", "percent"} <= set(targets)
    for target in targets:
        names = os.listdir(os.path.join(ctests.CORPUS, target))
        assert any(name.startswith("nasty-") for name in names), target


def test_the_seed_corpus_is_what_the_python_renders_now():
    result = subprocess.run([sys.executable, os.path.join(C_DIR, "make_corpus.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, (
        f"{result.stdout}{result.stderr}\nrun python3 tests/c/make_corpus.py and commit")


@pytest.mark.parametrize("driver", ctests.fuzz_drivers())
@pytest.mark.parametrize("target", ctests.fuzz_targets())
def test_fuzzing_finds_nothing(target, driver, tmp_path):
    built = ctests.build_fuzzer(target, str(tmp_path), driver)
    for result in ctests.run_fuzzer(built, target, str(tmp_path)):
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(("crash-", "leak-"))]


PLANTED = """/* links: gs_parse.c */
#include "gs_fuzz.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = gs_fuzz_text(data, size);
    volatile char last = 0;
    if (strstr(text, "@GPUSHARE_JOB_ID@"))
        last = text[size + 1]; /* one past the copy and its NUL */
    free(text);
    return last;
}
"""


@pytest.mark.parametrize("driver", ctests.fuzz_drivers())
def test_an_overflow_in_a_harness_is_reported(driver, tmp_path):
    source = tmp_path / "fuzz_planted.c"
    source.write_text(PLANTED)
    built = ctests.build_fuzzer("planted", str(tmp_path), driver, str(source))
    # the ticket corpus holds the mark: its first run reads past the input
    first = ctests.run_fuzzer(built, "ticket", str(tmp_path), runs=10)[0]
    assert first.returncode != 0
    # ASan, or UBSan's object-size check where it sees the read first (gcc 14)
    assert ("ERROR: AddressSanitizer: heap-buffer-overflow" in first.stderr
            or "insufficient space" in first.stderr), first.stderr[-4000:]
