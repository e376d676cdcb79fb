# SPDX-License-Identifier: GPL-2.0-or-later
"""`make test`'s runner (tests/release_root.py): which roots it tests beside the machine's
own release, and that suites run at once yet each reports its own status, summary and log."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "release_root", os.path.join(HERE, "..", "release_root.py"))
assert spec is not None and spec.loader is not None
release_root = importlib.util.module_from_spec(spec)
sys.modules["release_root"] = release_root
spec.loader.exec_module(release_root)


def test_every_release_but_the_machines_own_gets_a_root():
    assert release_root.other_codenames("bookworm") == ["trixie", "forky"]
    assert release_root.other_codenames("trixie") == ["bookworm", "forky"]
    assert release_root.SLURM_OF["forky"] == "26.05"


def test_an_unsupported_machine_is_told_which_releases_are():
    with pytest.raises(release_root.RootError, match="bookworm, forky, trixie"):
        release_root.other_codenames("bullseye")


def test_roots_beds_never_share_a_port():
    spans = sorted((port, port + release_root.SANITIZED_PORT_OFFSET + 10)
                   for port in release_root.BED_PORT.values())
    # The machine's own suite uses 17200 up to its sanitized bed at 17600.
    assert spans[0][0] > 17700
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end < start


def test_suites_run_at_once_and_each_keeps_its_status_and_summary(tmp_path, capsys):
    marker = tmp_path / "first-ran"
    suites = [
        release_root.Suite("passes", [sys.executable, "-c",
                                      f"import time, os; time.sleep(1); "
                                      f"assert os.path.exists({str(marker)!r}); "
                                      "print('== 3 passed in 1.00s ==')"],
                           str(tmp_path / "a.log")),
        release_root.Suite("fails", [sys.executable, "-c",
                                     f"open({str(marker)!r}, 'w'); "
                                     "print('== 1 failed, 2 passed in 0.10s ==');"
                                     "raise SystemExit(1)"],
                           str(tmp_path / "b.log")),
    ]
    # The first suite passes only if the second started while it ran.
    assert release_root.run_suites(suites) == 1
    assert [suite.rc for suite in suites] == [0, 1]
    out = capsys.readouterr().out
    assert "passes: ok: 3 passed in 1.00s" in out
    assert "fails: FAILED (exit 1): 1 failed, 2 passed in 0.10s" in out
    assert out.count("==== fails: ended") == out.count("==== passes: ended") == 1
