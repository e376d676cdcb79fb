# SPDX-License-Identifier: GPL-2.0-or-later
"""The C glue's unit tests (tests/c/test_*.c): its pure parsers, built with ASan and UBSan
and run here, so that `make test` runs them on both Slurm releases."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

CTESTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "c", "ctests.py")
_spec = importlib.util.spec_from_file_location("gpushare_ctests", CTESTS_PATH)
assert _spec is not None and _spec.loader is not None
ctests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ctests)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="needs a C compiler (make deps installs gcc)")


def test_every_c_test_file_is_found():
    assert {"test_parse", "test_ticket", "test_envfile", "test_args"} <= set(ctests.unit_tests())


@pytest.mark.parametrize("name", ctests.unit_tests())
def test_c_unit_test_passes_under_the_sanitizers(name, tmp_path):
    result = ctests.run_unit(ctests.build_unit(name, str(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert ", 0 failed" in result.stderr  # it ran its checks and reported them


def test_a_failing_check_fails_the_test(tmp_path):
    source = tmp_path / "test_planted.c"
    source.write_text('/* links: gs_parse.c */\n#include "gs_check.h"\n#include "gs_parse.h"\n'
                      "int main(void) { CHECK_INT(gs_parse_percent(\"50\"), 51);"
                      ' return gs_check_done("planted"); }\n')
    out = str(tmp_path / "planted")
    ctests._compile(ctests.c_compiler(), [str(source), *ctests.links(str(source))], out, [])
    result = ctests.run_unit(ctests.Built(out, ""))
    assert result.returncode == 1
    assert "gs_parse_percent(\"50\") is 50, want 51" in result.stderr


def test_a_memory_error_in_a_test_is_a_sanitizer_report(tmp_path):
    source = tmp_path / "test_overflow.c"
    source.write_text('/* links: gs_parse.c */\n#include <stdlib.h>\n#include "gs_check.h"\n'
                      '#include "gs_parse.h"\nint main(void) { char *t = malloc(2);'
                      ' memcpy(t, "25", 2); t[2] = 0; /* one past */'
                      ' CHECK_INT(gs_parse_percent(t), 25); free(t);'
                      ' return gs_check_done("overflow"); }\n')
    out = str(tmp_path / "overflow")
    ctests._compile(ctests.c_compiler(), [str(source), *ctests.links(str(source))], out, [])
    result = ctests.run_unit(ctests.Built(out, ""))
    # UBSan's object-size check or ASan, whichever sees it first: their exit codes
    assert result.returncode in (86, 87), result.stderr
    assert "insufficient space" in result.stderr or "heap-buffer-overflow" in result.stderr
