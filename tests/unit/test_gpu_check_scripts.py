# SPDX-License-Identifier: GPL-2.0-or-later
"""The real-GPU MPS check runs end to end in its dry-run mode (stand-in daemon, emulated
client), so the script that answers the hardware questions is known to work before a
machine with a GPU is lent to run it for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mps_standin.harness import unusable_reason

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(unusable_reason() is not None, reason=str(unusable_reason()))
def test_check_mps_dry_run_answers_every_question(tmp_path):
    results = tmp_path / "mps.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"))
    run = subprocess.run([sys.executable, os.path.join(REPO, "tests", "gpu", "check_mps.py"),
                          str(results), "--dry-run"], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(results.read_text())
    assert report["machine"]["dry_run"] is True
    verdicts = {r["check"]: r["ok"] for r in report["results"]}
    assert verdicts, report
    assert all(ok is not False for ok in verdicts.values()), verdicts
    assert any("side by side" in name for name in verdicts), verdicts
    assert any("pinned" in name for name in verdicts), verdicts
    assert any("index" in name for name in verdicts), verdicts
    assert "device by UUID" in verdicts, verdicts
    assert "RESULT" in run.stdout  # the table a person reads


def test_check_relayout_dry_run_lays_two_layouts_and_back(tmp_path):
    results = tmp_path / "relayout.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"))
    run = subprocess.run([sys.executable, os.path.join(REPO, "tests", "gpu",
                                                       "check_relayout.py"),
                          str(results), "--dry-run"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(results.read_text())
    assert report["machine"]["dry_run"] is True and report["machine"]["first_layout"] == "whole"
    details = {r["check"]: r for r in report["results"]}
    assert list(details) == ["busy refused", "first layout", "second layout", "back"]
    assert all(r["ok"] for r in report["results"]), report
    assert "-> 7x1g.18gb" in details["first layout"]["detail"]
    assert "7x1g.18gb -> 2x3g.71gb" in details["second layout"]["detail"]
    assert "2x3g.71gb -> whole" in details["back"]["detail"]
    assert all(details[c]["seconds"] is not None for c in ("first layout", "second layout",
                                                           "back"))


def test_check_usage_dry_run_compares_shared_estimates_with_solo_runs(tmp_path):
    results = tmp_path / "usage.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"))
    run = subprocess.run([sys.executable, os.path.join(REPO, "tests", "gpu", "check_usage.py"),
                          str(results), "--dry-run", "--seconds", "2"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(results.read_text())
    assert report["dry_run"] is True
    verdicts = {r["check"]: r["ok"] for r in report["results"]}
    assert set(verdicts) == {"calls", "clients seen", "solo bw bw", "solo bw sm",
                             "solo memUtil bw", "solo memUtil sm", "shared split bw",
                             "shared split sm"}, verdicts
    assert all(verdicts.values()), verdicts
    # The simulated H200's 72 % split 70:4 by memory-controller time against 68 % and 4 %.
    assert report["shared_bw_estimate"] == pytest.approx(72 * 70 / 74)
    assert report["solo_bw_bw"] == 68.0 and report["solo_sm_bw"] == 4.0
