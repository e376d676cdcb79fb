# SPDX-License-Identifier: GPL-2.0-or-later
"""Relayout's floors and ``--suggest`` read a real slurmdbd through Slurm's own sacct: the
relayout bed (``test_relayout``) gains MariaDB and slurmdbd for this module.

sacct shows a job's GPUs only where slurmctld records their GRES (slurm.conf's
``AccountingStorageTRES``; by default none): without them a MIG job's ``ReqTRES`` names no
GPU, the history would read as empty and the floors let every slice go. So relayout keeps
the plan's floors and says which TRES to record; once they are recorded (the line `gpushare
render slurm-conf` prints), the floors are what the jobs held.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time

import pytest
from tests.slurm.test_relayout import (  # noqa: F401  (bed, fresh: fixtures)
    NODE,
    bed,
    fresh,
    gpushare,
    gres_of,
    queue_large,
    relayout,
    shows,
    sim_layout,
)

import slurmbed
import slurmdbd_bed

pytestmark = pytest.mark.slurm
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200")) + 320


@pytest.fixture(scope="module")
def accounting(bed):  # noqa: F811
    """MariaDB and slurmdbd for the relayout bed, slurmctld restarted to use them."""
    reason = slurmdbd_bed.unusable_reason()
    if reason:
        # make deps installs the packages on Debian 12 (slurmdbd_bed.RELEASES); every
        # release root of `make test` has them, with the client library its slurmdbd needs.
        pytest.skip(reason)
    with slurmdbd_bed.accounting_for(bed, PORT + 90, PORT + 91, lambda: back(bed),
                                     slurmbed.TEST_USERS) as acct:
        yield acct


def back(cluster) -> None:
    slurmbed.wait_until("rl1 in service", lambda: cluster.node_state(NODE)["State"] == "IDLE")


def dry_run(cluster, *extra: str) -> dict:
    done = gpushare("relayout", "--plan", cluster.path("etc", "plan.yaml"), "--backend", "scontrol",
                    "--hysteresis", "0.2", "--lookback", "0", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def hold_at_once(cluster, jobs: int, slices: int) -> list[int]:
    """``jobs`` jobs of ``slices`` 1g.10gb slices each, all running at once on rl1, then
    ended; returned once sacct lists every one of them."""
    token = time.monotonic_ns()  # this call's own files: a job id may come again
    release = os.path.join(cluster.out_dir, f"release-{token}")
    started = [cluster.sbatch(f"touch {cluster.out_dir}/held-{token}-$SLURM_JOB_ID; "
                          f"while [ ! -e {release} ]; do sleep 0.2; done", "-w", NODE,
                          f"--gres=gpu:1g.10gb:{slices}", "--time=2") for _ in range(jobs)]
    try:
        slurmbed.wait_until("every job runs at once", lambda: all(
            os.path.exists(os.path.join(cluster.out_dir, f"held-{token}-{job}"))
            for job in started))
    finally:
        with open(release, "w"):
            pass
    for job in started:
        cluster.wait_job(job)
    os.unlink(release)
    slurmbed.wait_until("sacct lists the jobs", lambda: all(
        re.search(rf"^{job}\|", sacct(cluster), re.MULTILINE) for job in started), 60)
    return started


def seen_by_relayout(cluster) -> str:
    """sacct's answer to relayout's own question, for a failing assertion's message."""
    from gpushare.admin.relayout.history import sacct_argv

    argv = sacct_argv("sacct", 1.0, datetime.datetime.now())
    return " ".join(argv) + "\n" + cluster.run(argv).stdout


def sacct(cluster) -> str:
    return cluster.run(["sacct", "--parsable2", "--allocations", "--allusers", "--starttime",
                    "now-1hours", "--format", "JobID,Start,End,ReqTRES"]).stdout


def record_gres(cluster) -> None:
    """slurm.conf gains the AccountingStorageTRES line `gpushare render slurm-conf` prints,
    and slurmctld restarts to record them."""
    rendered = gpushare("render", "slurm-conf", "--plan", cluster.path("etc", "plan.yaml"))
    assert rendered.returncode == 0, rendered.stderr
    [tres] = re.findall(r"^#\s+(AccountingStorageTRES=\S+)$", rendered.stdout, re.MULTILINE)
    assert "gres/gpu:1g.10gb" in tres and "gres/gpu:3g.40gb" in tres, tres
    with open(cluster.conf, "a") as conf:
        conf.write(tres + "\n")
    cluster.restart_slurmctld()
    back(cluster)


def job_before_the_window(cluster) -> int:
    """A job whose start a window beginning after it (:func:`after`) shows accounting
    reaches back past (a bed's slurmdbd is minutes old: a day's window is not covered)."""
    first = cluster.sbatch("true", "-w", NODE, "--time=1")
    cluster.wait_job(first)
    slurmbed.wait_until("sacct lists the first job", lambda: re.search(
        rf"^{first}\|[^|]+\|[^|]+\|", sacct(cluster), re.MULTILINE), 60)
    time.sleep(20)  # the jobs after it start well after the window's start, however slow
    return first


def after(cluster, first: int) -> str:
    """--keep-hours for a window that begins 3 s after ``first`` started."""
    [start] = re.findall(rf"^{first}\|([^|]+)\|", sacct(cluster), re.MULTILINE)
    since = (datetime.datetime.now() - datetime.datetime.fromisoformat(start)).total_seconds()
    return f"{(since - 3) / 3600:.6f}"


def test_unrecorded_mig_gres_keep_the_plans_slices_and_say_what_to_record(
        fresh, accounting):  # noqa: F811
    """Slurm's default AccountingStorageTRES: sacct lists the MIG jobs with no GPU. The
    floors are the plan's (no 1g.10gb slice goes for the waiting 3g.40gb jobs) and the
    decision names the TRES to record; --suggest refuses to learn from that history."""
    cluster = fresh
    held = hold_at_once(cluster, 1, 2)
    listed = sacct(cluster)
    assert "gres/gpu" not in listed, listed  # what the floors must not read as "none held"
    queue_large(cluster)
    out = dry_run(cluster)
    assert out["demand"] == {"3g.40gb": 4}, out
    assert not [c for c in out["changes"] if "1g.10gb" in c["from"]], out
    assert out["floors"]["from_history"] is False, out["floors"]
    [line] = [why for why in out["why"] if why.startswith("kept:")]
    assert "every MIG profile and MPS keeps what the plan's layouts give it" in line, line
    assert "slurmctld does not record gres/gpu:1g.10gb" in line, line
    assert "AccountingStorageTRES" in line and "--keep-hours 0" in line, line
    refused = gpushare("relayout", "--plan", cluster.path("etc", "plan.yaml"), "--suggest",
                       "--days", "1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "slurmctld does not record" in refused.stderr, refused.stderr
    assert held and sim_layout(cluster, 2) == ["1g.10gb"] * 7  # dry runs: nothing changed


def test_recorded_mig_gres_make_the_floors_what_the_jobs_held(fresh, accounting):  # noqa: F811
    """slurm.conf gains the AccountingStorageTRES line `gpushare render slurm-conf` prints:
    sacct shows the 1g.10gb slices two jobs held at once (8, however short they ran:
    sacct's whole seconds count jobs within one second as at once), so no change takes a
    GPU of 7 of rl1's 14 for the waiting 3g.40gb jobs (without floors one is taken), and
    --suggest learns from the same history. A day's window on a slurmdbd minutes old keeps
    the plan's floors; a window that a job before it shows covered reads the history."""
    cluster = fresh
    record_gres(cluster)
    checked = gpushare("check", "--plan", cluster.path("etc", "plan.yaml"), "--cluster",
                       "--backend", "scontrol", "--json")
    findings = json.loads(checked.stdout)["findings"]
    assert not [f for f in findings if "AccountingStorageTRES" in f["where"]], findings
    first = job_before_the_window(cluster)
    hold_at_once(cluster, 2, 4)  # rl1 has 2 CPUs: two jobs at once
    assert "gres/gpu:1g.10gb=4" in sacct(cluster)
    queue_large(cluster)
    young = dry_run(cluster)
    assert young["floors"]["from_history"] is False, young["floors"]
    [line] = [why for why in young["why"] if why.startswith("kept:")]
    assert "sacct shows no job that started before the last 24 h" in line, line
    assert not [c for c in young["changes"] if "1g.10gb" in c["from"]], young["why"]
    window = after(cluster, first)
    kept = dry_run(cluster, "--keep-hours", window)
    assert kept["floors"]["from_history"] is True and kept["floors"]["unseen"] == [], kept
    assert kept["floors"]["by_kind"].get("1g.10gb") == 8, (kept["floors"],
                                                           seen_by_relayout(cluster))
    # The forecast's recurring submissions: the held jobs ended minutes ago, and sacct
    # shows them however long ago (squeue, only for MinJobAge after their end).
    recurring = dry_run(cluster, "--keep-hours", window, "--lookback", "3600")
    [line] = [why for why in recurring["why"] if why.startswith("forecast:")]
    found = re.search(r"the last 1 h's (\d+) GPU requests recur \((\d+) still waiting, "
                      r"(\d+) started per sacct, (\d+) per squeue\)", line)
    assert found, line
    total, waiting, accounted, listed = (int(n) for n in found.groups())
    assert accounted >= 2 and total == waiting + accounted + listed, line
    free = dry_run(cluster, "--keep-hours", "0")
    taken = [c for c in free["changes"] if "1g.10gb" in c["from"]]
    # Without floors, one or both of rl1's 1g.10gb GPUs (before 23.11 a node keeps one MIG
    # profile, so both change at once); with them, neither: 7 would be under the floor.
    assert taken, free
    assert not [c for c in kept["changes"] if "1g.10gb" in c["from"]], kept["why"]
    if not kept["changes"]:  # the whole GPU may still go, from 23.11; else it says why not
        assert any(re.search(r"1g\.10gb would keep \d+ of its 14, under its floor 8", why)
                   for why in kept["why"]), kept["why"]
    suggested = gpushare("relayout", "--plan", cluster.path("etc", "plan.yaml"), "--suggest",
                         "--days", "1", "--json")
    assert suggested.returncode == 0, suggested.stderr
    assert json.loads(suggested.stdout)["jobs"] >= 2, suggested.stdout


def test_what_a_change_took_comes_back_once_no_job_needs_it(fresh, accounting):  # noqa: F811
    """The plan gives rl1's GPUs 2 and 3 seven 1g.10gb slices each, and two 1g.10gb jobs
    held 8 at once. A round without floors (--keep-hours 0) turns both into 2x3g.40gb for
    waiting 3g.40gb jobs (GPU 1 busy with a whole-GPU job). Once those have run, a round
    with the window finds 1g.10gb short of what its jobs held and, no job waiting, gives
    both GPUs back, through the same drain, node step, Gres= and resume as any change
    (before 23.11 both at once: a node keeps one MIG profile)."""
    cluster = fresh
    record_gres(cluster)
    planned = gres_of(cluster)
    first = job_before_the_window(cluster)
    hold_at_once(cluster, 2, 4)
    marker = os.path.join(cluster.out_dir, f"whole-{time.monotonic_ns()}")
    whole = cluster.sbatch(f"touch {marker}; sleep 10", "-w", NODE, "--gres=gpu:h100:1",
                           "--time=2")
    slurmbed.wait_until("the whole-GPU job runs", lambda: os.path.exists(marker))
    waiting = queue_large(cluster)
    taken = relayout(cluster, "--keep-hours", "0")
    assert taken.returncode == 0, (taken.stdout[-3000:], taken.stderr)
    [node] = json.loads(taken.stdout)["nodes"]
    assert sorted(node["applied"]) == [[2, "2x3g.40gb"], [3, "2x3g.40gb"]], node
    for job in (whole, *waiting):
        assert cluster.wait_job(job)["JobState"] == "COMPLETED"
    back(cluster)
    given = relayout(cluster, "--keep-hours", after(cluster, first))
    assert given.returncode == 0, (given.stdout[-3000:], given.stderr)
    out = json.loads(given.stdout)
    [node] = out["nodes"]
    assert node["failed"] is None and sorted(node["applied"]) == [
        [2, "7x1g.10gb"], [3, "7x1g.10gb"]], (node, out["why"])
    assert [p["back"] for p in out["predictions"]] == [True], out["predictions"]
    assert any("made (back to the plan's layouts" in why for why in out["why"]), out["why"]
    assert out["floors"]["wanted"]["1g.10gb"] == 8, out["floors"]
    assert sim_layout(cluster, 2) == sim_layout(cluster, 3) == ["1g.10gb"] * 7
    slurmbed.wait_until("slurmctld shows the plan's GRES", lambda: shows(cluster, planned))
    back(cluster)
    # The plan's mix again: nothing is short, the next round changes nothing.
    again = relayout(cluster, "--keep-hours", after(cluster, first))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["changes"] == [], again.stdout


def test_trial_replays_the_real_history_with_each_jobs_own_time_limit(fresh,  # noqa: F811
                                                                      accounting):
    """--trial reads the real sacct (Timelimit too: the forecast's only view of a run) and
    replays its second half from the plan's layouts and the first half's best static
    layout, left alone and with relayout; it changes nothing on the cluster."""
    from gpushare.admin.relayout.history import SACCT_FIELDS, parse_sacct

    cluster = fresh
    record_gres(cluster)
    early = hold_at_once(cluster, 1, 2)
    time.sleep(3)  # the second half's jobs are submitted after the history's middle
    late = hold_at_once(cluster, 1, 3)
    listed = cluster.run(["sacct", "--parsable2", "--allocations", "--allusers", "--starttime",
                          "now-1hours", "--format", ",".join(SACCT_FIELDS)]).stdout
    limits = {job.count: job.limit for job in parse_sacct(listed).jobs
              if job.kind == "1g.10gb"}
    assert limits.get(2) == limits.get(3) == 120.0, listed  # --time=2
    tried = gpushare("relayout", "--plan", cluster.path("etc", "plan.yaml"), "--trial",
                     "--days", "1", "--json")
    assert tried.returncode == 0, tried.stderr
    report = json.loads(tried.stdout)
    assert report["learned_on"] >= 1 and report["replayed"] >= 1, report
    assert report["jobs"] >= len(early) + len(late), report
    assert [s["start"] for s in report["starts"]] == [
        "the plan's layouts", "the first half's best static layout"], report
    assert isinstance(report["no_harm"], bool)
    assert sim_layout(cluster, 2) == sim_layout(cluster, 3) == ["1g.10gb"] * 7  # unchanged
