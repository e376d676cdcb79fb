# SPDX-License-Identifier: GPL-2.0-or-later
"""scripts/slurm_testsuite.py's parsing, comparison and table: no Slurm, no testsuite."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "slurm_testsuite.py")
_spec = importlib.util.spec_from_file_location("slurm_testsuite", SCRIPT)
ts = importlib.util.module_from_spec(_spec)
sys.modules["slurm_testsuite"] = ts  # dataclasses look their module up by name
_spec.loader.exec_module(ts)

BAR = "=" * 78

PASSED = f"""spawn /usr/bin/srun -N1 --gres=gpu:1 job_script
{BAR}
SUCCESS             : test1.62
{BAR}
"""

FAILED_SUBTESTS = f"""[2026-11-30 17:45:32.834] Error   Subtest  3 failed  : job 12 wrong
{BAR}
FAILURE             : test39.5
  Subtests failed   :   2 ( 50%)
  Subtests skipped  :   0 (  0%)
  Subtests passed   :   2 ( 50%)
  Subtests total    :   4 COMPLETE
{BAR}
SUBTESTS DETAILS     : test39.5
  Subtest  3 failed  : Verify slurm-47.out has 2 GPUs (srun: error: no step for job 47)
  Subtest  4 failed  : Verify 2 steps were delayed
{BAR}
"""

SKIPPED = f"""[2026-11-30 17:45:33.058] Warning This test requires 2 sockets (skip@globals:459)
{BAR}
SKIPPED             : test39.6
{BAR}
"""

FATAL = f"""[2026-11-30 17:45:33.058] Fatal   Expected 1 GPUs, but was allocated 0 (fail@x)
{BAR}
FAILURE             : test1.62
{BAR}
"""

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.features.gres.test_mps_options" name="test_environment_vars" time="1.5"/>
<testcase classname="x" name="test_two" time="0.2">
 <failure message="assert 0 == 1">trace</failure></testcase>
<testcase classname="x" name="test_sudo" time="0">
 <skipped message="needs sudo rights">...</skipped></testcase>
<testcase classname="x" name="test_err" time="0"><error message="fixture broke">t</error></testcase>
</testsuite></testsuites>"""


def test_parse_expect_success():
    assert ts.parse_expect_log(PASSED, "test1.62") == ts.Outcome("PASS")


def test_parse_expect_failed_subtests_are_normalised():
    outcome = ts.parse_expect_log(FAILED_SUBTESTS, "test39.5")
    assert outcome.result == "FAIL"
    # only the summary's details count (the same subtest logged earlier is not doubled);
    # job ids become N so that two runs compare equal
    assert outcome.failed == [
        "subtest 3: Verify slurm-N.out has 2 GPUs (srun: error: no step for job N)",
        "subtest 4: Verify 2 steps were delayed"]


def test_parse_expect_skip_and_fatal_reasons():
    skipped = ts.parse_expect_log(SKIPPED, "test39.6")
    assert (skipped.result, skipped.reason) == (
        "SKIP", "Warning This test requires 2 sockets (skip@globals:N)")
    fatal = ts.parse_expect_log(FATAL, "test1.62")
    assert fatal.result == "FAIL" and fatal.reason.startswith("Fatal Expected 1 GPUs")


def test_parse_expect_without_summary_is_an_error():
    outcome = ts.parse_expect_log("spawn srun\nsrun: error: cannot connect\n", "test1.62")
    assert outcome.result == "ERROR"
    # another test's summary does not count for this one
    assert ts.parse_expect_log(PASSED, "test39.1").result == "ERROR"


def test_parse_junit():
    found = ts.parse_junit(JUNIT, "tests/features/gres/test_mps_options.py@tty0")
    prefix = "tests/features/gres/test_mps_options.py@tty0::"
    assert {k.removeprefix(prefix): (v.result, v.reason) for k, v in found.items()} == {
        "test_environment_vars": ("PASS", ""), "test_two": ("FAIL", "assert 0 == 1"),
        "test_sudo": ("SKIP", "needs sudo rights"), "test_err": ("ERROR", "fixture broke")}
    assert all(outcome.failed == [] for outcome in found.values())  # the result says it
    assert found[prefix + "test_environment_vars"].seconds == 1.5


def rows_by_test(rows):
    return {r.test: (r.a, r.b, r.verdict) for r in rows}


def test_compare_same_differs_missing():
    a = {"t1": ts.Outcome("PASS", seconds=1.0), "t2": ts.Outcome("FAIL", ["subtest 3: x"]),
         "t3": ts.Outcome("FAIL", ["subtest 3: x"]), "t4": ts.Outcome("PASS"),
         "only_a": ts.Outcome("PASS")}
    b = {"t1": ts.Outcome("PASS", seconds=9.0),  # time is not a result
         "t2": ts.Outcome("FAIL", ["subtest 3: x"]),
         "t3": ts.Outcome("FAIL", ["subtest 3: x", "subtest 7: y"]),  # same result, more fails
         "t4": ts.Outcome("PASS", drains=["sts1: gpushare: broken"]),  # a drain is a change
         "only_b": ts.Outcome("SKIP")}
    rows = ts.compare(a, b, allowed={})
    assert rows_by_test(rows) == {
        "t1": ("PASS", "PASS", "same"), "t2": ("FAIL", "FAIL", "same"),
        "t3": ("FAIL", "FAIL", "differs"), "t4": ("PASS", "PASS", "differs"),
        "only_a": ("PASS", "-", "missing"), "only_b": ("-", "SKIP", "missing")}
    notes = {r.test: r.note for r in rows}
    assert notes["t3"] == "failed only in B: subtest 7: y"
    b["t4"] = ts.Outcome("FAIL", reason="gpushare: refused")
    assert ts.compare(a, b, allowed={})[3].note == "B: gpushare: refused"
    assert notes["t4"] == "drained: A none; B sts1: gpushare: broken"
    assert ts.verdict_exit(rows) == 1


def test_allowed_difference_needs_the_named_b_result():
    a = {"x.py@tty0::test_one": ts.Outcome("PASS"), "x.py@tty0::test_two": ts.Outcome("PASS"),
         "t9": ts.Outcome("PASS")}
    b = {"x.py@tty0::test_one": ts.Outcome("FAIL"),
         "x.py@tty0::test_two": ts.Outcome("ERROR"), "t9": ts.Outcome("PASS")}
    allowed = {"x.py@tty0::*": ("FAIL", "MPS cannot run on /dev/tty0")}
    rows = ts.compare(a, b, allowed=allowed)
    assert rows_by_test(rows) == {"x.py@tty0::test_one": ("PASS", "FAIL", "allowed"),
                                  "x.py@tty0::test_two": ("PASS", "ERROR", "differs"),
                                  "t9": ("PASS", "PASS", "same")}
    assert rows[0].note == "MPS cannot run on /dev/tty0"
    assert ts.verdict_exit(rows) == 1
    assert ts.verdict_exit(rows[:1] + rows[2:]) == 0


def test_every_allowed_difference_has_a_reason_and_a_result():
    for pattern, (result, reason) in ts.ALLOWED.items():
        assert result in ts.RESULTS and len(reason) > 20, pattern
        assert any(ts.fnmatch.fnmatchcase(i.key, pattern.split("::")[0]) for i in ts.ITEMS), \
            f"{pattern} names no test of the list"


def test_table_and_summary():
    rows = [ts.Row("test1.62", "PASS", "PASS", "same"),
            ts.Row("test40.2", "PASS", "FAIL", "differs", "B: a | b")]
    text = ts.format_table(rows)
    assert text.splitlines()[2] == "| test1.62 | PASS | PASS | same |  |"
    assert text.splitlines()[3] == "| test40.2 | PASS | FAIL | differs | B: a / b |"
    assert text.splitlines()[-1] == ("2 tests: 1 same, 0 allowed difference(s), 1 unexplained "
                                     "difference(s), 0 on one side only")


def test_json_round_trip():
    outcomes = {"t": ts.Outcome("FAIL", ["subtest 1: x"], "why", 2.5, ["sts1: r"])}
    assert ts.outcomes_from_json(ts.outcomes_to_json(outcomes)) == outcomes


@pytest.mark.parametrize("version, tag", [("22.05.8", "slurm-22-05-8-1"),
                                          ("23.11.10", "slurm-23-11-10-1")])
def test_release_tag(version, tag):
    assert ts.release_tag(version) == tag


def test_item_keys_are_unique():
    keys = [i.key for i in ts.ITEMS]
    assert len(keys) == len(set(keys))


def test_plugin_activity_counts_jobs_and_mps_jobs():
    lines = ["1 pid=2 uid=0 py job=7 warning GRES gpu index 0 (/dev/tty0) is not an NVIDIA GPU",
             "1 pid=2 uid=0 py job=8 info shared MPS, 50% of GPU 0, daemon u1-GPU-x",
             "1 pid=2 uid=0 py job=8 debug record written",
             "1 pid=3 uid=0 c job=9 no GPU, core not loaded"]
    assert ts.plugin_activity(lines) == "its core ran for 2 job(s) and gave 1 of them an MPS daemon"


def test_the_bed_finds_the_core_without_the_venv():
    """make runs the script with the system Python, where nothing installed gpushare: the
    script's own path must let the bed read the installed release through the core."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import slurm_testsuite; "
            "slurm_testsuite._bed_module(); import gpushare.admin.slurm_client")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, os.path.dirname(SCRIPT)],
                          capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
