# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare metrics after real jobs on the local Slurm (the counts are what ran), and
gpushare status --cluster against its real slurmctld (22.05)."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

import slurmbed
from slurmbed import wait_until

pytestmark = pytest.mark.slurm

U1, U2 = slurmbed.TEST_USERS[0], slurmbed.TEST_USERS[1]
SCONTROL = shutil.which("scontrol") or "/usr/bin/scontrol"
SINFO = shutil.which("sinfo") or "/usr/bin/sinfo"


def gpushare(bed, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(bed.env, PYTHONPATH=os.path.join(slurmbed.REPO, "src"))
    return subprocess.run([sys.executable, "-m", "gpushare.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def scrape(bed, node: str = "n1") -> dict[str, list]:
    """gpushare metrics on the bed (its plugstack line: state_dir, plan), parsed."""
    result = gpushare(bed, "metrics", "--node", node)
    assert result.returncode == 0, result.stderr
    return {f.name: f.samples for f in text_string_to_metric_families(result.stdout)}


def total(samples: dict[str, list], name: str, **labels: str) -> float:
    family = re.sub(r"_(total|bucket|sum|count)$", "", name)
    return sum(s.value for s in samples[family]
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def not_readable_by(bed, user: str, path: str) -> bool:
    """``path`` is root's, with no bit for others, and ``user`` really cannot open it."""
    st = os.stat(path)
    tried = bed.run(["cat", path], user=user, check=False)
    return st.st_uid == 0 and not st.st_mode & 0o007 and tried.returncode != 0


def finished(bed, job_id: int) -> str:
    """The job's end state (its epilog may still run: counts are waited for below)."""
    return bed.wait_job(job_id, timeout=120)["JobState"]


COUNTED = ("gpushare_prologs_total", "gpushare_epilogs_total", "gpushare_refusals_total",
           "gpushare_mps_daemon_starts_total", "gpushare_prolog_duration_seconds_count",
           "gpushare_epilog_duration_seconds_count", "gpushare_drains_total")


def counts(samples) -> dict[tuple, float]:
    found = {}
    for name in COUNTED:
        family = re.sub(r"_(total|count)$", "", name)
        for sample in samples[family]:
            if sample.name == name:
                key = (name, *sorted((k, v) for k, v in sample.labels.items() if k != "node"))
                found[key] = sample.value
    return found


@pytest.mark.smoke
def test_metrics_count_what_ran(clean_bed, tmp_path):
    bed = clean_bed
    before = counts(scrape(bed))
    # A shared job, watched while it runs.
    running = bed.sbatch("sleep 30", "--gres=mps:25", "-w", "n1", "-c1", user=U1)
    bed.wait_job(running, states={"RUNNING"}, timeout=120)

    def live():
        samples = scrape(bed)
        jobs = [s for s in samples["gpushare_gpu_jobs"] if s.value]
        up = [s for s in samples["gpushare_mps_daemon_up"] if s.value]
        return (samples, jobs) if jobs and up else None

    samples, jobs = wait_until("the job's daemon in the metrics", live)
    # What the node keeps of the job (its daemon's record: GPU, job, pid; the counters; the
    # debug log) is root's: another user reads none of it.
    records = glob.glob(os.path.join(bed.state_of("n1"), "daemons", "*.json"))
    kept = [*records, os.path.join(bed.state_of("n1"), "counters.json"), bed.debug_log]
    assert records and all(not_readable_by(bed, U2, path) for path in kept), kept
    (device,) = jobs
    assert device.value == 1 and device.labels["node"] == "n1"
    assert device.labels["uuid"].startswith("GPU-") and device.labels["mig_profile"] == ""
    assert device.labels["owner"] == "slurm"  # the bed's plan: n1's GPUs are Slurm's
    share = [s for s in samples["gpushare_gpu_share_ratio"]
             if s.labels["uuid"] == device.labels["uuid"]]
    assert [s.value for s in share] == [0.25]
    (daemon,) = [s for s in samples["gpushare_mps_daemon_up"] if s.value]
    assert daemon.labels["user"] == U1 and daemon.labels["mode"] == "shared"
    assert total(samples, "gpushare_mps_daemon_thread_limit_ratio", user=U1) == 0.25
    assert total(samples, "gpushare_jobs", mode="shared") == 1
    assert total(samples, "gpushare_mps_daemons", status="running") == 1
    bed.run(["scancel", str(running)])
    assert finished(bed, running) == "CANCELLED"
    # A short shared job, and a share without a GPU (refused: the job fails, the node not).
    short = bed.sbatch("true", "--gres=mps:25", "-w", "n1", "-c1", user=U1)
    assert finished(bed, short) == "COMPLETED"
    refused = bed.sbatch("true", "--gpu-share=30", "-w", "n1", "-c1", user=U1)
    assert finished(bed, refused) == "FAILED"

    expected = {
        ("gpushare_prologs_total", ("result", "ok")): 2,
        ("gpushare_prologs_total", ("result", "refused")): 1,
        ("gpushare_epilogs_total", ("result", "ok")): 3,
        ("gpushare_refusals_total", ("reason", "share_without_gpu")): 1,
        ("gpushare_mps_daemon_starts_total",): 2,  # one job after the other
        ("gpushare_prolog_duration_seconds_count",): 3,
        ("gpushare_epilog_duration_seconds_count",): 3,
    }

    def delta():
        after = counts(scrape(bed))
        changed = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        return changed if changed == expected else None

    try:
        wait_until("counts of the three jobs", delta, 60)
    except AssertionError:
        after = counts(scrape(bed))
        raise AssertionError({k: after[k] - before.get(k, 0) for k in after
                              if after[k] != before.get(k, 0)}) from None
    # The textfile node_exporter reads holds the same.
    collector = tmp_path / "collector"
    collector.mkdir()
    os.chmod(tmp_path, 0o755)
    result = gpushare(bed, "metrics", "--node", "n1", "--textfile",
                      str(collector / "gpushare.prom"))
    assert result.returncode == 0, result.stderr
    written = {f.name: f.samples for f in text_string_to_metric_families(
        (collector / "gpushare.prom").read_text())}
    assert counts(written) == counts(scrape(bed))
    assert total(written, "gpushare_gpu_jobs") == 0  # all gone


def status(bed, *args: str) -> dict:
    result = gpushare(bed, "status", "--cluster", "--json", "--sinfo", SINFO,
                      "--scontrol", SCONTROL, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return {node["name"]: node for node in json.loads(result.stdout)["nodes"]}


def gres_used(bed, node: str) -> str:
    result = bed.run(["scontrol", "-d", "show", "-o", "node", node])
    return re.search(r"GresUsed=(\S+)", result.stdout).group(1)


def running_shares(bed, node: str) -> int:
    """The MPS units the running jobs on ``node`` asked for (squeue's TRES per node)."""
    listed = bed.run(["squeue", "-h", "-t", "R", "-w", node, "-o", "%b"]).stdout
    return sum(int(match) for match in re.findall(r"mps(?::h100)?:(\d+)", listed))


def test_status_cluster_from_the_real_slurmctld(clean_bed):
    bed = clean_bed
    bed.wait_idle()
    whole = bed.sbatch("sleep 60", "--gres=gpu:h100:2", "-w", "n2", "-c1", user=U1)
    shared = bed.sbatch("sleep 60", "--gres=mps:25", "-w", "n1", "-c1", user=U1)
    other = bed.sbatch("sleep 60", "--gres=mps:50", "-w", "n1", "-c1", user=U2)
    mig = bed.sbatch("sleep 60", "--gres=gpu:1g.10gb:3", "-w", "n5", "-c1", user=U1)
    bed.run(["scontrol", "update", "NodeName=n4", "State=DRAIN",
             "Reason=gpushare: MPS daemon could not be stopped"])
    jobs = (whole, shared, other, mig)
    try:
        for job_id in jobs:
            bed.wait_job(job_id, states={"RUNNING"}, timeout=120)
        # Two users' shares on one node: 75 units, whatever GresUsed says (22.05 says
        # mps:h100:1(IDX:0); 24.11 mps:h100:75(75/100,0/100,...)).
        assert running_shares(bed, "n1") == 75, gres_used(bed, "n1")
        for backend in ("sinfo", "scontrol"):
            nodes = status(bed, "--backend", backend)
            assert sorted(nodes) == ["n1", "n2", "n3", "n4", "n5"], backend
            (n2,) = nodes["n2"]["gpus"]
            assert (n2["type"], n2["total"], n2["used"], n2["free"]) == ("h100", 8, 2, 6)
            (n1,) = nodes["n1"]["gpus"]
            assert (n1["mps_used"], n1["mps_total"]) == (75, 800), (
                backend, gres_used(bed, "n1"), [bed.job(j).get("JobState") for j in jobs])
            # all_sharing lets Slurm put the two jobs on one GPU or two: those are taken.
            busy = n1["mps_busy"]
            assert busy in (1, 2) and n1["free"] == 8 - busy
            (slices,) = nodes["n5"]["mig"]
            assert (slices["mig_profile"], slices["free"], slices["total"]) == ("1g.10gb", 4, 7)
            assert nodes["n4"]["drained"] and nodes["n4"]["drained_by_gpushare"]
            assert not nodes["n3"]["drained"]
        table = gpushare(bed, "status", "--cluster", "--sinfo", SINFO, "--scontrol", SCONTROL)
        assert table.returncode == 0, table.stderr
        row = next(line.split() for line in table.stdout.splitlines()
                   if line.startswith("n2 "))
        assert row[2:4] == ["h100", "6/8"], table.stdout
        row = next(line.split() for line in table.stdout.splitlines()
                   if line.startswith("n1 "))
        assert row[4] == "75/800", table.stdout  # the MPS USED column
        assert "n4  gpushare: MPS daemon could not be stopped" in table.stdout
    finally:
        bed.run(["scancel", *map(str, jobs)], check=False)
        bed.resume("n4")
        for job_id in jobs:
            bed.wait_job(job_id)


def test_every_path_counts_each_prolog_and_epilog_once(clean_bed):
    """Each way a job's prolog and epilog end is counted once: the worker (Python), a join
    and a leave in C, a GPU job that shares nothing (its epilog ends in C), a failed prolog,
    and a job without GPUs, which gpushare leaves alone at both ends."""
    bed = clean_bed
    node, u2 = "n1", slurmbed.TEST_USERS[1]
    before = counts(scrape(bed, node))
    ticket = os.path.join(bed.state_of(node), "daemons", "tickets",
                          f"u{slurmbed.uid_of(U1)}.g0.s25")

    def lines(job_id: int, pattern: str) -> list[str]:
        return [line for line in bed.debug_lines()
                if f" job={job_id} " in line and re.search(pattern, line)]

    def submit(script: str, *args: str, user: str = U1) -> int:
        return bed.sbatch(script, "-w", node, "-c1", *args, user=user)

    # The worker: U1's first shared job starts its daemon and leaves a join ticket.
    holder = submit("sleep 60", "--gres=mps:25")
    bed.wait_job(holder, states={"RUNNING"}, timeout=120)
    wait_until("the holder's join ticket", lambda: os.path.exists(ticket), 60)
    # A join in C, and its epilog leaves the daemon to the holder in C.
    joined = submit("true", "--gres=mps:25")
    assert finished(bed, joined) == "COMPLETED"
    assert lines(joined, "cb=job_prolog python=skip reason=joined")
    wait_until("the joined job's leave in C",
               lambda: lines(joined, "cb=job_epilog python=skip reason=left-daemon"), 60)
    # Another user's shared job (a worker at both ends), a whole GPU (a worker, then an
    # epilog in C: nothing to undo) and a job without GPUs.
    other = submit("true", "--gres=mps:25", user=u2)
    whole = submit("true", "--gres=gpu:h100:1")
    plain = submit("true")
    for job_id in (other, whole, plain):
        assert finished(bed, job_id) == "COMPLETED"
    wait_until("the whole-GPU job's epilog",
               lambda: lines(whole, "cb=job_epilog python=skip reason=no-share"), 60)
    assert lines(plain, "cb=job_prolog python=skip reason=no-gpu")
    bed.run(["scancel", str(holder)])
    assert finished(bed, holder) == "CANCELLED"
    # A prolog that fails in C: the core library is writable by others (Slurm drains).
    core = bed.path("lib", "spank_gpushare_core.so")
    mode = os.stat(core).st_mode & 0o7777
    os.chmod(core, 0o777)
    try:
        failed = submit("true", "--gres=gpu:h100:1")
        wait_until("the refused prolog", lambda: lines(failed, "cb=job_prolog begin"), 120)
        wait_until("the node drained", lambda: bed.run(
            ["sinfo", "-h", "-n", node, "-o", "%t"]).stdout.strip().startswith("dr"), 60)
        bed.end_held(failed)  # requeued and held first: a cancel before it can be overtaken
        wait_until("its epilog", lambda: lines(failed, "cb=job_epilog"), 60)
    finally:
        os.chmod(core, mode)
        bed.resume(node)

    expected = {
        # holder, joined, other, whole ok; failed failed. plain: nothing, at either end.
        ("gpushare_prologs_total", ("result", "ok")): 4,
        ("gpushare_prologs_total", ("result", "failed")): 1,
        ("gpushare_epilogs_total", ("result", "ok")): 5,
        ("gpushare_drains_total", ("reason", "other")): 1,
        ("gpushare_mps_daemon_starts_total",): 2,
        ("gpushare_prolog_duration_seconds_count",): 5,
        ("gpushare_epilog_duration_seconds_count",): 5,
    }

    def delta():
        after = counts(scrape(bed, node))
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    try:
        wait_until("every prolog and epilog counted", lambda: delta() == expected, 60)
    except AssertionError:
        raise AssertionError(delta()) from None
