# SPDX-License-Identifier: GPL-2.0-or-later
"""MPS sharing inside the real local Slurm: daemons shared per user and GPU, isolated between
users, stopped at the last job's end, cleaned up after cancel and slurmd crashes, and every
fault of the control program ending in a defined outcome."""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import slurmbed
from mps_standin.harness import running as alive
from mps_standin.harness import standin_processes
from slurmbed import wait_until

pytestmark = pytest.mark.slurm

U1, U2 = slurmbed.TEST_USERS
NODE = "n1"
FAULT_NODE = "n2"

ENV_SCRIPT = (
    "echo START=$(date +%s.%N)\n"
    "for v in SLURM_JOB_ID SLURM_ARRAY_TASK_ID CUDA_VISIBLE_DEVICES "
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "
    "CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY SLURM_JOB_GPUS; do\n"
    "  echo \"$v=${!v}\"\n"
    "done\n"
    "sleep {sleep}\n"
    "echo END=$(date +%s.%N)\n"
)


# ---------------------------------------------------------------------------- helpers


def mps_dirs(bed) -> list[str]:
    """Every node's daemon records and users' MPS directories (state_dir=<root>/state/%n)."""
    return sorted(glob.glob(os.path.join(bed.state_of("*"), "mps")) +
                  glob.glob(os.path.join(bed.state_of("*"), "daemons")))


def mps_entries(bed) -> list[str]:
    """What every node holds of daemons and their users: the entries of its records'
    directory and of its users' directory, and the join tickets among them (and what
    waits in ``.trash``, which ``mps_space=shared`` makes beforehand and keeps)."""
    entries = []
    for path in mps_dirs(bed):
        node = os.path.basename(os.path.dirname(path))
        where = os.path.basename(path)
        for entry in _listed(path):
            if entry not in ("tickets", ".trash"):
                entries.append(f"{node}:{where}/{entry}")
                continue
            entries += [f"{node}:{where}/{entry}/{name}"
                        for name in _listed(os.path.join(path, entry))]
    return sorted(entries)


def _listed(path: str) -> list[str]:
    """The directory's entries; none once it is gone: an epilog may remove it between one
    read and the next, the cleanup the callers wait for."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def daemon_jobs(record_path: str) -> dict[str, dict]:
    """The jobs referencing a daemon: the files of ``<key>.jobs/`` beside its record, each
    holding the job's share."""
    jobs = {}
    jobs_dir = record_path[:-len(".json")] + ".jobs"
    for name in sorted(os.listdir(jobs_dir)) if os.path.isdir(jobs_dir) else []:
        if not name.isdigit():
            continue  # a temporary file of a write in progress, skipped as record.py does
        try:
            with open(os.path.join(jobs_dir, name)) as handle:
                jobs[name] = {"share_percent": int(handle.read())}
        except (FileNotFoundError, ValueError):
            continue  # dropped under us
    return jobs


def mps_records(bed) -> list[dict]:
    """Every daemon record of the bed, with its ``jobs`` as ``daemon_jobs`` reads them."""
    records = []
    for path in sorted(glob.glob(os.path.join(bed.state_of("*"), "daemons", "*.json"))):
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (FileNotFoundError, ValueError):
            continue  # replaced or removed under us; the next poll sees it
        record["jobs"] = daemon_jobs(path)
        records.append(record)
    return records


def started_records(bed) -> list[dict]:
    """Records of daemons that have started (the record goes down before the start)."""
    return [r for r in mps_records(bed) if r.get("daemon_pid")]


def standin_program(bed) -> str:
    return bed.path("bin", "nvidia-cuda-mps-control")


def standin_pids(bed) -> list[int]:
    """Live processes running the bed's stand-in (daemons and servers)."""
    return standin_processes(standin_program(bed))


def standin_state(record: dict) -> dict:
    with open(os.path.join(record["log_dir"], "standin-state.json")) as handle:
        return json.load(handle)


def job_records(bed) -> list[str]:
    return sorted(glob.glob(os.path.join(bed.state_of("*"), "jobs", "*")))


def assert_nothing_left(bed, timeout: float = 60.0) -> None:
    """No daemon, no MPS directory, record or lock, no job record: everything cleaned."""
    def clean() -> bool:
        return not mps_entries(bed) and not standin_pids(bed) and not job_records(bed)

    try:
        wait_until("MPS state cleaned up", clean, timeout)
    except AssertionError:
        left = job_records(bed)
        # The jobs whose files or daemon references stayed: what the logs say of them.
        jobs = sorted({os.path.basename(path).split(".")[0] for path in left} |
                      {job for record in mps_records(bed) for job in record["jobs"]})
        raise AssertionError(f"left behind: mps={mps_entries(bed)} pids={standin_pids(bed)} "
                             f"jobs={left}\nwhat the logs say of jobs {jobs}:\n"
                             f"{bed.lines_about(jobs)}\n{bed.logs(30)}") from None


def job_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def array_tasks(bed, array_id: int) -> list[dict[str, str]]:
    result = bed.run(["scontrol", "show", "job", "-o", str(array_id)], check=False)
    return [dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", line))
            for line in result.stdout.splitlines() if line.strip()]


def wait_array(bed, array_id: int, count: int, timeout: float = 180.0) -> list[dict[str, str]]:
    def done():
        tasks = array_tasks(bed, array_id)
        finished = [t for t in tasks if t.get("JobState") in slurmbed.TERMINAL_STATES]
        return tasks if len(finished) == count else None

    return wait_until(f"array {array_id} finished", done, timeout)  # type: ignore[return-value]


def wait_running(bed, job_id: int) -> None:
    bed.wait_job(job_id, states={"RUNNING"}, timeout=120)


def wait_drained(bed, node: str, timeout: float = 90.0) -> str:
    wait_until(f"{node} drained", lambda: "DRAIN" in bed.node_state(node)["State"], timeout)
    return bed.node_state(node).get("Reason", "")


def slurmd_log(bed, node: str) -> str:
    with open(bed.path("log", f"slurmd-{node}.log"), errors="replace") as handle:
        return handle.read()


def node_mem_mib(bed, node: str) -> int:
    with open(bed.path("nodes", f"{node}.json")) as handle:
        profile = json.load(handle)
    return int(profile["gpus"][0]["memory_mib"])


@pytest.fixture
def mps_bed(clean_bed):
    """The bed with no fault set and no MPS state, checked clean again after the test."""
    faults = clean_bed.path("bin", "faults")
    if os.path.exists(faults):
        os.unlink(faults)
    # A job an earlier test left running is ended first; then its epilog must clean up.
    for user in ("root", *slurmbed.TEST_USERS):
        clean_bed.run(["scancel", "--quiet", "-u", user], check=False)
    wait_until("the jobs of earlier tests gone", lambda: not clean_bed.run(
        ["squeue", "-h", "-o", "%i"], check=False).stdout.strip(), 120)
    assert_nothing_left(clean_bed)
    yield clean_bed
    if os.path.exists(faults):
        os.unlink(faults)
    for user in slurmbed.TEST_USERS:
        clean_bed.run(["scancel", "-u", user], check=False)


def set_fault(bed, *names: str) -> None:
    path = bed.path("bin", "faults")
    with open(path, "w") as handle:
        handle.write("\n".join(names) + "\n")
    os.chmod(path, 0o644)


# ---------------------------------------------------------------------------- sharing


def test_array_of_one_user_shares_one_daemon_per_gpu_and_runs_at_once(mps_bed):
    bed = mps_bed
    uid = slurmbed.uid_of(U1)
    array_id = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "6"), "--array=1-6", "--gres=mps:25",
                          "-w", NODE, "-c1", f"--output={bed.out_dir}/a%A_%a.out", user=U1)

    def all_referenced():
        recs = started_records(bed)
        return recs if sum(len(r["jobs"]) for r in recs) == 6 else None

    records = wait_until("6 jobs referencing MPS daemons", all_referenced, 120)
    # One daemon per GPU the array landed on, never one per job.
    gpus = [tuple(d["uuid"] for d in r["devices"]) for r in records]
    assert len(set(gpus)) == len(records) < 6, records
    for record in records:
        assert record["uid"] == uid and record["mode"] == "shared"
        assert alive(record["daemon_pid"])
        state = standin_state(record)
        assert state["pid"] == record["daemon_pid"]
        assert state["uid"] == uid  # never root
        assert state["devices"] == [d["uuid"] for d in record["devices"]]
        assert state["env"]["CUDA_MPS_PIPE_DIRECTORY"] == record["pipe_dir"]
        # The daemon's cap is the largest share the user holds on that GPU (applied just
        # after the record names the new job).
        shares = max(j["share_percent"] for j in record["jobs"].values())
        wait_until("daemon cap = the user's largest share", lambda r=record, s=shares:
                   standin_state(r)["default_active_thread_percentage"] == min(100, s), 30)
    daemons = {r["daemon_pid"]: r for r in records}

    tasks = wait_array(bed, array_id, 6)
    assert {t["JobState"] for t in tasks} == {"COMPLETED"}, tasks
    outputs = [job_values(bed.output(f"a{array_id}_{i}")) for i in range(1, 7)]
    # Jobs on one GPU see the same pipe directory, that of their GPU's daemon.
    by_pipe: dict[str, list[dict]] = {}
    for values in outputs:
        assert values["CUDA_VISIBLE_DEVICES"] == "0"
        assert values["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        by_pipe.setdefault(values["CUDA_MPS_PIPE_DIRECTORY"], []).append(values)
    assert set(by_pipe) == {r["pipe_dir"] for r in records}
    for record in records:
        jobs = {v["SLURM_JOB_ID"] for v in by_pipe[record["pipe_dir"]]}
        assert jobs == set(record["jobs"]), (jobs, record["jobs"])
        group = by_pipe[record["pipe_dir"]]
        if len(group) > 1:  # jobs sharing a daemon ran at the same time
            assert max(float(v["START"]) for v in group) < min(float(v["END"]) for v in group)
    # The last job gone: each daemon stopped, its directories and state removed.
    assert_nothing_left(bed)
    assert not any(alive(pid) for pid in daemons)
    for record in records:
        assert not os.path.exists(os.path.dirname(record["pipe_dir"]))


def test_pinned_memory_limit_is_proportional_to_the_share(mps_bed):
    result = mps_bed.run(["srun", "-w", NODE, "--gres=mps:25", "bash", "-c",
                          "echo LIMIT=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], user=U1)
    expected = node_mem_mib(mps_bed, NODE) * 25 // 100
    assert f"LIMIT=0={expected}M" in result.stdout, result.stdout
    assert_nothing_left(mps_bed)


@pytest.mark.smoke
def test_second_user_gets_its_own_daemon_and_neither_blocks(mps_bed):
    bed = mps_bed
    first = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "20"), "--gres=mps:25", "-w", NODE,
                       "-c1", user=U1)
    wait_running(bed, first)
    wait_until("first daemon", lambda: len(started_records(bed)) == 1, 60)
    second = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "1"), "--gres=mps:25", "-w", NODE,
                        "-c1", user=U2)
    # The second user's job finishes while the first user's still runs: no waiting.
    assert bed.wait_job(second, timeout=60)["JobState"] == "COMPLETED"
    assert bed.job(first)["JobState"] == "RUNNING"
    out1 = job_values(bed.output(second))
    # Its epilog's worker runs after the job ended; the second user's daemon goes with it.
    wait_until("the second job's epilog ran", lambda: any(
        f" job={second} " in line and slurmbed.worker_ended(line, "job_epilog")
        for line in bed.debug_lines()))
    records = mps_records(bed)
    assert len(records) == 1 and records[0]["uid"] == slurmbed.uid_of(U1)
    assert out1["CUDA_MPS_PIPE_DIRECTORY"] != records[0]["pipe_dir"]
    # The second user's daemon ran as that user and is already gone.
    assert not os.path.exists(os.path.dirname(out1["CUDA_MPS_PIPE_DIRECTORY"]))
    lines = [line for line in bed.debug_lines() if f" job={second} " in line]
    assert any(slurmbed.worker_ended(line, "job_epilog") for line in lines), lines
    bed.run(["scancel", str(first)])
    bed.wait_job(first)
    assert_nothing_left(bed)


def test_the_workers_say_where_their_time_went(mps_bed):
    """A shared job's prolog and epilog workers each log one timing line (debug_log=): the
    imports, the GPU check's parts, the daemon's start, and a total that covers them."""
    bed = mps_bed
    forget_layout(bed)  # as on a node whose NVML nobody asked yet: this job asks it
    job_id = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "0"), "--gres=mps:25", "-w", NODE,
                        "-c1", user=U1)
    assert bed.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"

    def timings():
        found = [line.split(" debug timing ", 1)[1] for line in bed.debug_lines()
                 if f" job={job_id} debug timing " in line]
        return found if len(found) == 2 else None

    prolog, epilog = ({k: float(v) for k, v in (kv.split("=") for kv in line.split())}
                      for line in wait_until("both timing lines", timings, 60))
    for phase in ("gpu-imports", "nvml", "gres.conf", "verify", "record",
                  "epilogs", "mps", "daemon-start", "daemon-socket", "caps", "env"):
        assert phase in prolog, (phase, prolog)
    assert "verify" not in epilog and {"record", "mps", "remove"} <= set(epilog)
    # A worker that started its own interpreter counts its imports; a prefork server's
    # child (prefork=yes, the default, after the node's first worker) has none to count.
    for callback, timing in (("job_prolog", prolog), ("job_epilog", epilog)):
        wait_until(f"the {callback} worker's end", lambda cb=callback: any(
            f" job={job_id} " in line and slurmbed.worker_ended(line, cb)
            for line in bed.debug_lines()), 60)
        by_server = any(f" job={job_id} cb={callback} prefork rc=0" in line
                        for line in bed.debug_lines())
        assert ("imports" in timing) != by_server, (callback, by_server, timing)
    for timing in (prolog, epilog):
        assert all(value >= 0 for value in timing.values()), timing
        phases = sum(v for k, v in timing.items() if k not in ("imports", "total"))
        # Each phase lies inside the total; every value is rounded to 0.1 ms.
        assert phases <= timing["total"] + 0.05 * len(timing), timing
        assert timing["total"] > 0

    # A job joining a running daemon with a larger share lets its tasks start before the
    # daemon's caps are raised for it (a join never lowers them): its "caps" come after
    # its "env", and its epilog brings the caps back down.
    holder = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "60"), "--gres=mps:25", "-w", NODE,
                        "-c1", user=U1)
    daemon = wait_until("the holder's daemon", lambda: started_records(bed), 60)[0]

    def epilog_done(job: int) -> bool:
        return any(f" job={job} " in line and ((" debug timing " in line and " remove=" in line)
                                              or "cb=job_epilog python=skip" in line)
                   for line in bed.debug_lines())

    def cap_commands() -> list[str]:
        return [c for c in standin_state(daemon)["commands"]
                if c.startswith("set_default_active_thread_percentage")]

    assert cap_commands() == ["set_default_active_thread_percentage 25"]
    joiner = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "0"), "--gres=mps:50", "-w", NODE,
                        "-c1", user=U1)
    assert bed.wait_job(joiner, timeout=60)["JobState"] == "COMPLETED"
    line = wait_until("the joiner's prolog timing", lambda: next(
        (line for line in bed.debug_lines()
         if f" job={joiner} debug timing " in line and " verify=" in line), None), 60)
    order = [kv.split("=")[0] for kv in line.split(" debug timing ", 1)[1].split()]
    assert "daemon-start" not in order and order.index("env") < order.index("caps"), order
    wait_until("the joiner's epilog", lambda: epilog_done(joiner), 60)
    assert cap_commands() == ["set_default_active_thread_percentage 25",
                              "set_default_active_thread_percentage 50",
                              "set_default_active_thread_percentage 25"]
    # A share no larger than the daemon's cap: neither its prolog nor its epilog asks the
    # daemon anything.
    commands = len(standin_state(daemon)["commands"])
    small = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "0"), "--gres=mps:25", "-w", NODE,
                       "-c1", user=U1)
    assert bed.wait_job(small, timeout=60)["JobState"] == "COMPLETED"
    wait_until("the small job's epilog", lambda: epilog_done(small), 60)
    assert len(standin_state(daemon)["commands"]) == commands
    bed.run(["scancel", str(holder)])
    bed.wait_job(holder)
    assert_nothing_left(bed)


def forget_layout(bed) -> None:
    """Remove the GPU layout NVML last gave the node (verify_reuse=)."""
    path = os.path.join(bed.state_of(NODE), "inventory.json")
    if os.path.exists(path):
        os.unlink(path)


def prolog_timing(bed, job_id: int) -> dict[str, float]:
    """The phases of ``job_id``'s prolog worker (its debug timing line)."""
    line = wait_until(f"job {job_id}'s prolog timing", lambda: next(
        (line for line in bed.debug_lines()
         if f" job={job_id} debug timing " in line and " verify=" in line), None), 60)
    return {k: float(v) for k, v in
            (kv.split("=") for kv in line.split(" debug timing ", 1)[1].split())}


def test_a_first_job_checks_its_gpu_on_the_layout_nvml_gave_just_before(mps_bed):
    """The first shared job on a GPU asks NVML, and leaves what it said and its clean check
    in <state_dir>/inventory.json; the first job of another user on that GPU, within
    verify_reuse= seconds, takes that check as it is, without asking NVML or reading
    gres.conf, and still starts its own daemon. A changed gres.conf, or verify_reuse=0,
    makes a job ask NVML."""
    bed = mps_bed
    forget_layout(bed)
    layout = os.path.join(bed.state_of(NODE), "inventory.json")
    gres_conf = os.path.join(os.path.dirname(bed.conf), "gres.conf")

    def run(user: str) -> dict[str, float]:
        job_id = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "0"), "--gres=mps:25", "-w", NODE,
                            "-c1", user=user)
        assert bed.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
        assert "CUDA_MPS_PIPE_DIRECTORY" in job_values(bed.output(job_id))
        timing = prolog_timing(bed, job_id)
        assert "daemon-start" in timing, timing  # each job starts its user's daemon
        assert_nothing_left(bed)
        return timing

    asked = run(U1)
    assert "nvml" in asked and "nvml-reused" not in asked, asked
    st = os.stat(layout)
    assert (st.st_uid, st.st_mode & 0o022) == (0, 0)
    with open(layout) as handle:
        saved = json.load(handle)
    assert saved["format"] == 1 and saved["inventory"]["gpus"], saved
    assert [key.split()[:2] for key in saved["checks"]] == [[NODE, "mps"]], saved["checks"]
    # The second job's worker reuses the first one's check of its GPU.
    reused = run(U2)
    assert "check-reused" in reused, reused
    assert not {"nvml", "nvml-reused", "gres.conf"} & set(reused), reused
    os.utime(gres_conf)
    assert "nvml" in run(U1)
    line = bed.plugstack_line()
    bed.write_plugstack(line.rstrip("\n") + " verify_reuse=0\n")
    try:
        timings = [run(U2), run(U2)]
    finally:
        bed.write_plugstack(line)
    assert all("nvml" in t and "nvml-reused" not in t for t in timings), timings


def test_a_health_check_leaves_nvmls_answer_for_the_next_prolog(mps_bed):
    """``gpushare check`` run as root on the node (as HealthCheckProgram) with the plugin's
    own source leaves NVML's answer, and the node's next shared job checks its GPU on it
    instead of asking NVML."""
    bed = mps_bed
    forget_layout(bed)
    env = dict(bed.env, PYTHONPATH=os.path.join(slurmbed.REPO, "src"))
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.cli", "check", "--plan", slurmbed.BED_PLAN,
         "--node", NODE, "--gres-conf", os.path.join(os.path.dirname(bed.conf), "gres.conf"),
         "--device-root", bed.path("dev"), "--source", "sim:" + bed.path("nodes", f"{NODE}.json")],
        capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert os.path.exists(os.path.join(bed.state_of(NODE), "inventory.json"))
    job_id = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "0"), "--gres=mps:25", "-w", NODE, "-c1",
                        user=U1)
    assert bed.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
    timing = prolog_timing(bed, job_id)
    assert "nvml-reused" in timing and "nvml" not in timing, timing
    assert_nothing_left(bed)


def prolog_lines(bed, job_id: int) -> list[str]:
    """What the prolog of ``job_id`` decided (debug_log=): joined in C, or a worker."""
    return [line for line in bed.debug_lines() if f" job={job_id} " in line and
            ("cb=job_prolog python=" in line or "cb=job_prolog fast=" in line or
             "cb=job_prolog detached" in line)]


def job_record(bed, job_id: int) -> dict:
    with open(os.path.join(bed.state_of(NODE), "jobs", f"{job_id}.json")) as handle:
        return json.load(handle)


def test_a_job_joining_its_users_daemon_is_set_up_without_an_interpreter(mps_bed):
    """A job like the one before it on the same GPU (same user, share, GPU, settings and
    files) joins the running daemon in the C glue with that job's join ticket: the same
    task environment, a record that differs only in its id and time, its reference on the
    daemon, its prolog counted. A changed gres.conf, another share or the daemon's end send
    the next job to the worker again."""
    bed = mps_bed
    gres_conf = os.path.join(os.path.dirname(bed.conf), "gres.conf")
    holder = bed.sbatch("sleep 120", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    daemon = wait_until("the holder's daemon", lambda: started_records(bed), 60)[0]
    jobs_dir = os.path.join(bed.state_of(NODE), "jobs")
    # Without the holder's join ticket, the next job is its worker's to set up.
    join_ticket = os.path.join(bed.state_of(NODE), "daemons", "tickets",
                               f"u{slurmbed.uid_of(U1)}.g0.s25")
    wait_until("the holder's join ticket", lambda: os.path.exists(join_ticket), 30)
    os.unlink(join_ticket)

    def started(job_id: int) -> None:
        def output() -> str:
            try:
                return bed.output(job_id)
            except FileNotFoundError:  # a job joined in C is set up before its output exists
                return ""

        wait_until(f"job {job_id} set up", lambda: os.path.exists(
            os.path.join(jobs_dir, f"{job_id}.env")) and "START=" in output(), 60)

    def submit(share: int = 25, sleep: int = 20) -> int:
        return bed.sbatch(ENV_SCRIPT.replace("{sleep}", str(sleep)), f"--gres=mps:{share}",
                          "-w", NODE, "-c1", user=U1)

    # The first job after the holder is set up by its worker, which looks for lost jobs
    # (the holder runs) and leaves the ticket.
    first = submit()
    started(first)
    assert any("cb=job_prolog detached" in line for line in prolog_lines(bed, first))
    tickets = sorted(os.listdir(os.path.join(bed.state_of(NODE), "daemons", "tickets")))
    assert tickets == [f"u{slurmbed.uid_of(U1)}.g0.s25"], tickets
    ok_before = epilogs_counted(bed, "prologs")[0]
    joined = submit()
    started(joined)
    lines = prolog_lines(bed, joined)
    assert len(lines) == 1, lines
    assert f"python=skip reason=joined daemon={daemon['key']} share=25" in lines[0]
    # What its tasks got is what the job before got, and its record differs in id and time.
    seen = [job_values(bed.output(j)) for j in (first, joined)]
    for values in seen:
        values.pop("SLURM_JOB_ID"), values.pop("START")
    assert seen[0] == seen[1] and seen[1]["CUDA_MPS_PIPE_DIRECTORY"] == daemon["pipe_dir"]
    records = [job_record(bed, j) for j in (first, joined)]
    assert records[1]["job_id"] == records[1]["mps"]["job_id"] == joined
    assert abs(records[1]["created"] - time.time()) < 60
    for record in records:
        for value in (record, record["mps"]):
            value.pop("job_id")
        record.pop("created")
    assert records[0] == records[1]
    (record,) = started_records(bed)
    assert record["jobs"] == {str(j): {"share_percent": 25} for j in (holder, first, joined)}
    assert record["daemon_pid"] == daemon["daemon_pid"]
    assert epilogs_counted(bed, "prologs")[0] == ok_before + 1
    # A changed gres.conf: the worker checks the GPU again, and the next job joins in C.
    os.utime(gres_conf)
    rechecked, after = submit(sleep=0), None
    assert bed.wait_job(rechecked, timeout=60)["JobState"] == "COMPLETED"
    assert "fast=no reason=files" in prolog_lines(bed, rechecked)[0]
    after = submit(sleep=0)
    assert bed.wait_job(after, timeout=60)["JobState"] == "COMPLETED"
    assert "python=skip reason=joined" in prolog_lines(bed, after)[0]
    # Another share has no ticket yet: its worker sets it up.
    other = submit(share=10, sleep=0)
    assert bed.wait_job(other, timeout=60)["JobState"] == "COMPLETED"
    assert "fast=no reason=no-ticket" in prolog_lines(bed, other)[0]
    # verify_reuse=0: every job is checked and set up by its own worker, no ticket written.
    line = bed.plugstack_line()
    bed.write_plugstack(line.rstrip("\n") + " verify_reuse=0\n")
    try:
        for _ in range(2):  # one after the other, each beside the jobs on the holder's GPU
            job_id = submit(sleep=0)
            assert bed.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
            assert "fast=no reason=plugstack" in prolog_lines(bed, job_id)[0]
    finally:
        bed.write_plugstack(line)
    for job_id in (first, joined):
        assert bed.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
    bed.run(["scancel", str(holder)])
    bed.wait_job(holder)
    assert_nothing_left(bed)


def epilog_lines(bed, job_id: int) -> list[str]:
    """What the epilog of ``job_id`` logged (debug_log=): the C glue's decision, and the
    worker's timing line when one ran."""
    return [line for line in bed.debug_lines() if f" job={job_id} " in line and
            ("cb=job_epilog python=" in line or "cb=job_epilog fast=" in line
             or (" debug timing " in line and " remove=" in line))]


def epilogs_counted(bed, callbacks: str = "epilogs") -> tuple[float, float]:
    """``gpushare metrics``: the node's epilogs (or prologs) that ended ok, and how many
    durations their histogram holds (its +Inf bucket)."""
    result = bed.run(["/usr/bin/python3", "-m", "gpushare.cli", "metrics", "--node", NODE],
                     env={"PYTHONPATH": bed.path("lib", "python")}, check=False)
    assert result.returncode == 0, result.stderr

    def value(name: str, *labels: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in result.stdout.splitlines()
                   if line.startswith(name + "{") and all(x in line for x in labels))

    return (value(f"gpushare_{callbacks}_total", 'result="ok"'),
            value(f"gpushare_{callbacks[:-1]}_duration_seconds_bucket", 'le="+Inf"'))


def test_a_job_leaving_others_on_its_daemon_ends_without_an_interpreter(mps_bed):
    """An epilog that only drops its job's reference (others stay on the daemon, one with a
    share at least the job's, so the caps stay) is done by the C glue: no worker, the
    reference, record and task file gone, the daemon untouched, the epilog counted. The
    daemon's last job, and a job holding the largest share, still go to the worker."""
    bed = mps_bed
    holder = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "120"), "--gres=mps:25", "-w", NODE,
                        "-c1", user=U1)
    daemon = wait_until("the holder's daemon", lambda: started_records(bed), 60)[0]
    commands = len(standin_state(daemon)["commands"])
    ok_before, timed_before = epilogs_counted(bed)
    small = []
    for share in (10, 25):  # one after the other, each beside the holder on its GPU
        job_id = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "0"), f"--gres=mps:{share}", "-w",
                            NODE, "-c1", user=U1)
        small.append(job_id)
        assert bed.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
        assert f"SLURM_JOB_ID={job_id}" in bed.output(job_id)
        line = wait_until(f"job {job_id}'s epilog", lambda j=job_id: epilog_lines(bed, j), 60)
        assert len(line) == 1 and "python=skip reason=left-daemon" in line[0], line
        assert f"daemon={daemon['key']}" in line[0]
    time.sleep(1)  # a worker, had one been started, would have logged by now
    assert all(len(epilog_lines(bed, job_id)) == 1 for job_id in small)
    (after,) = started_records(bed)
    assert after["jobs"] == {str(holder): {"share_percent": 25}}, after
    assert after["daemon_pid"] == daemon["daemon_pid"] and alive(after["daemon_pid"])
    assert len(standin_state(daemon)["commands"]) == commands  # the caps stay as they were
    assert not any(os.path.exists(os.path.join(bed.state_of(NODE), "jobs", f"{j}{suffix}"))
                   for j in small for suffix in (".json", ".env", ".lock"))
    # Counted as epilogs that ended ok, with their durations (how fast they were is the
    # benches' business: a loaded machine may take more than a few ms even in C).
    assert epilogs_counted(bed) == (ok_before + 2, timed_before + 2)
    # A larger share than the daemon's other jobs: its leave lowers the caps (the worker).
    larger = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "0"), "--gres=mps:50", "-w", NODE,
                        "-c1", user=U1)
    assert bed.wait_job(larger, timeout=60)["JobState"] == "COMPLETED"
    lines = wait_until("the larger job's epilog", lambda: (x := epilog_lines(bed, larger))
                       and any(" debug timing " in line for line in x) and x, 60)
    assert f"fast=no reason=largest-share daemon={daemon['key']}" in lines[0], lines
    assert [c for c in standin_state(daemon)["commands"][commands:]
            if c.startswith("set_default_active_thread_percentage")] == [
        "set_default_active_thread_percentage 50", "set_default_active_thread_percentage 25"]
    # The last job: the worker stops the daemon.
    bed.run(["scancel", str(holder)])
    bed.wait_job(holder)
    assert_nothing_left(bed)


def test_two_users_on_one_gpu_have_separate_daemons_at_once(mps_bed):
    bed = mps_bed
    jobs = [bed.sbatch(ENV_SCRIPT.replace("{sleep}", "15"), "--gres=mps:25", "-w", NODE,
                       "-c1", user=user) for user in (U1, U2)]
    for job_id in jobs:
        wait_running(bed, job_id)
    records = wait_until("two daemons", lambda: (r := started_records(bed)) and len(r) == 2 and r,
                         60)
    assert {r["uid"] for r in records} == {slurmbed.uid_of(U1), slurmbed.uid_of(U2)}
    assert len({r["pipe_dir"] for r in records}) == 2
    assert len({r["daemon_pid"] for r in records}) == 2
    for record in records:
        assert standin_state(record)["uid"] == record["uid"]
        st = os.stat(record["pipe_dir"])
        assert st.st_uid == record["uid"] and st.st_mode & 0o777 == 0o700
    for job_id in jobs:
        bed.run(["scancel", str(job_id)])
        bed.wait_job(job_id)
    assert_nothing_left(bed)


def test_another_users_pipe_directory_is_refused(mps_bed):
    bed = mps_bed
    owner = bed.sbatch("sleep 30", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    wait_running(bed, owner)
    record = wait_until("daemon", lambda: started_records(bed), 60)[0]  # type: ignore[index]
    pipe = record["pipe_dir"]
    probe = (
        f"ls {pipe} >/dev/null 2>&1 && echo LS=ok || echo LS=refused\n"
        f"/usr/bin/python3 -c \"import socket; s = socket.socket(socket.AF_UNIX, "
        f"socket.SOCK_SEQPACKET); s.connect('{pipe}/control')\" 2>/dev/null "
        f"&& echo CONNECT=ok || echo CONNECT=refused\n"
        f"echo get_server_list | CUDA_MPS_PIPE_DIRECTORY={pipe} {standin_program(bed)} "
        f"&& echo CONTROL=ok || echo CONTROL=refused\n"
    )
    other = bed.run(["srun", "-w", NODE, "--gres=mps:10", "bash", "-c", probe], user=U2)
    assert "LS=refused" in other.stdout, other.stdout
    assert "CONNECT=refused" in other.stdout, other.stdout
    assert "CONTROL=refused" in other.stdout, other.stdout
    # The same probe as the owner, from a job of the owner, gets in: the refusal is real.
    same = bed.run(["srun", "-w", NODE, "--gres=mps:10", "bash", "-c", probe], user=U1)
    assert "LS=ok" in same.stdout and "CONNECT=ok" in same.stdout, same.stdout
    bed.run(["scancel", str(owner)])
    bed.wait_job(owner)
    assert_nothing_left(bed)


def test_gpushare_job_shows_what_the_job_got(mps_bed):
    bed = mps_bed
    command = (f"PYTHONPATH={bed.path('lib', 'python')} /usr/bin/python3 -m gpushare.cli job "
               f"--json --mps-control {standin_program(bed)}")
    result = bed.run(["srun", "-w", NODE, "--gres=mps:40", "bash", "-c", command], user=U1)
    data = json.loads(result.stdout)
    assert data["job"]["mps"] == "shared"
    assert data["job"]["share_percent"] == 40
    assert data["job"]["visible_devices"] == "0"
    expected = node_mem_mib(bed, NODE) * 40 // 100
    assert data["job"]["pinned_mem_limit"] == {"0": f"{expected}M"}
    assert data["job"]["pipe_dir"].startswith(bed.state_dir)
    assert data["daemon"]["status"] == "answers", data
    assert_nothing_left(bed)


def gpushare_mps(bed, *args: str):
    """``gpushare mps`` as root on the bed's node, settings from the bed's plugstack.conf."""
    return bed.run(["/usr/bin/python3", "-m", "gpushare.cli", "mps", "--node", NODE, *args],
                   env={"PYTHONPATH": bed.path("lib", "python")}, check=False)


def test_gpushare_mps_shows_the_node_daemons_and_their_jobs(mps_bed):
    bed = mps_bed
    jobs = {U1: bed.sbatch("sleep 60", "--gres=mps:20", "-w", NODE, "-c1", user=U1),
            U2: bed.sbatch("sleep 60", "--gres=mps:30", "-w", NODE, "-c1", user=U2)}
    records = wait_until("both daemons started", lambda: len(started_records(bed)) == 2 and
                         started_records(bed), 60)
    result = gpushare_mps(bed, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # The settings are the plugin's own: found through SLURM_CONF, as on a node.
    assert data["settings"] == bed.path("etc", "plugstack.conf")
    assert data["state_dir"] == bed.state_of(NODE)
    views = {view["user"]: view for view in data["daemons"]}
    assert sorted(views) == sorted(jobs)
    pids = {r["key"]: r["daemon_pid"] for r in records}  # type: ignore[union-attr]
    for user, share in ((U1, 20), (U2, 30)):
        view = views[user]
        assert (view["status"], view["mode"], view["jobs"]) == (
            "running", "shared", {str(jobs[user]): share})
        assert view["daemon_pid"] == pids[view["key"]] and view["cap_percent"] == share
        assert view["problems"] == []
    text = gpushare_mps(bed).stdout
    for user, share in ((U1, 20), (U2, 30)):
        assert re.search(rf"{views[user]['key']}\s+running\s+\d+\s+\S+\s+{user}\s+shared"
                         rf"\s+GPU \d\s+{jobs[user]}:{share}%", text), text
    for job_id in jobs.values():
        bed.run(["scancel", str(job_id)])
        bed.wait_job(job_id)
    assert_nothing_left(bed)
    after = gpushare_mps(bed, "--json")
    assert (after.returncode, json.loads(after.stdout)["daemons"]) == (0, [])


def test_private_mps_over_whole_gpus(mps_bed):
    bed = mps_bed
    job_id = bed.sbatch(ENV_SCRIPT.replace("{sleep}", "4"), "--gres=gpu:2", "--gpu-mps",
                        "-w", NODE, "-c1", user=U1)
    record = wait_until("private daemon", lambda: started_records(bed), 60)[0]  # type: ignore
    assert record["key"] == f"job{job_id}" and record["mode"] == "private"
    assert len(record["devices"]) == 2
    state = standin_state(record)
    assert state["uid"] == slurmbed.uid_of(U1)
    assert state["devices"] == [d["uuid"] for d in record["devices"]]
    assert bed.wait_job(job_id)["JobState"] == "COMPLETED"
    values = job_values(bed.output(job_id))
    assert values["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert values["CUDA_MPS_PIPE_DIRECTORY"] == record["pipe_dir"]
    assert_nothing_left(bed)
    assert not alive(record["daemon_pid"])


# ---------------------------------------------------------------------------- cleanup


def test_scancel_mid_job_stops_the_daemon(mps_bed):
    bed = mps_bed
    job_id = bed.sbatch("sleep 300", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    wait_running(bed, job_id)
    record = wait_until("daemon", lambda: started_records(bed), 60)[0]  # type: ignore[index]
    assert alive(record["daemon_pid"])
    bed.run(["scancel", str(job_id)])
    assert bed.wait_job(job_id)["JobState"] == "CANCELLED"
    assert_nothing_left(bed)
    assert not alive(record["daemon_pid"])
    assert "DRAIN" not in bed.node_state(NODE)["State"]


def _plant_lost_epilog(bed, lost_id: int, saved: dict[str, bytes], key: str) -> None:
    """Put back what a job's epilog removed, as if it had never run: its job record, and
    its reference in the daemon it shared (which still serves another job)."""
    jobs_dir = os.path.join(bed.state_of(NODE), "jobs")
    for name, data in saved.items():
        path = os.path.join(jobs_dir, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
            out.write(data)
    path = os.path.join(bed.state_of(NODE), "daemons", f"{key}.jobs", str(lost_id))
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write("25\n")


def epilog_finished(bed, job_id: int) -> bool:
    """The job's epilog is done: by its worker, or by the C glue (a job leaving others on
    its daemon)."""
    return any(f"job={job_id} " in line and (
        slurmbed.worker_ended(line, "job_epilog") or
        "cb=job_epilog python=skip reason=left-daemon" in line) for line in bed.debug_lines())


def _daemon_jobs(bed, key: str) -> set[str]:
    return set(daemon_jobs(os.path.join(bed.state_of(NODE), "daemons", f"{key}.json")))


def test_a_job_whose_epilog_was_lost_is_reaped_by_asking_slurmctld(mps_bed):
    """slurmd killed between a job's end and its epilog leaves the job's record and its
    share behind: gpushare mps shows it, --reap forgets it, and so does the next prolog."""
    bed = mps_bed
    holder = bed.sbatch("sleep 120", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    wait_running(bed, holder)
    key = wait_until("holder's daemon", lambda: started_records(bed), 60)[0]["key"]  # type: ignore[index]
    lost = bed.sbatch("sleep 4", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    jobs_dir = os.path.join(bed.state_of(NODE), "jobs")
    # The job's environment file is the prolog's last word, written after the daemon's record.
    wait_until("the second job joins the daemon", lambda: str(lost) in _daemon_jobs(bed, key)
               and os.path.exists(os.path.join(jobs_dir, f"{lost}.env")))
    saved = {}
    for name in (f"{lost}.json", f"{lost}.env"):
        with open(os.path.join(jobs_dir, name), "rb") as handle:
            saved[name] = handle.read()
    assert bed.wait_job(lost)["JobState"] == "COMPLETED"
    wait_until("its epilog ran", lambda: str(lost) not in _daemon_jobs(bed, key) and
               epilog_finished(bed, lost))

    _plant_lost_epilog(bed, lost, saved, key)
    shown = gpushare_mps(bed, "--json")
    assert shown.returncode == 1, shown.stdout + shown.stderr
    view = next(v for v in json.loads(shown.stdout)["daemons"] if v["key"] == key)
    assert f"slurmctld no longer runs job {lost} on this node" in " ".join(view["problems"])
    reaped = gpushare_mps(bed, "--reap", "--json")
    assert json.loads(reaped.stdout)["lost_jobs_forgotten"] == [lost], reaped.stdout
    assert _daemon_jobs(bed, key) == {str(holder)}
    assert not os.path.exists(os.path.join(jobs_dir, f"{lost}.json"))

    # The prolog of the node's next shared job does the same (once its interval is up).
    _plant_lost_epilog(bed, lost, saved, key)
    checked = os.path.join(bed.state_of(NODE), "slurm-checked")
    if os.path.exists(checked):
        os.unlink(checked)
    after = bed.sbatch("true", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    assert bed.wait_job(after)["JobState"] == "COMPLETED"
    # Its own epilog runs in a worker after the job ended: wait for it, then only the holder
    # is left (the lost job was forgotten by the prolog).
    wait_until("the next job's epilog ran", lambda: epilog_finished(bed, after))
    assert _daemon_jobs(bed, key) == {str(holder)}
    assert not os.path.exists(os.path.join(jobs_dir, f"{lost}.json"))
    assert "DRAIN" not in bed.node_state(NODE)["State"]
    bed.run(["scancel", str(holder)])
    bed.wait_job(holder)
    assert_nothing_left(bed)


def test_slurmd_killed_and_restarted_while_jobs_run_leaks_nothing(mps_bed):
    bed = mps_bed
    jobs = [bed.sbatch("echo script-started; sleep 12", "--gres=mps:25", "-w", NODE, "-c1",
                       user=user) for user in (U1, U1, U2)]
    for job_id in jobs:
        wait_running(bed, job_id)
    # slurmd is killed only once every prolog has reported back and every script runs: a
    # prolog that ends while no slurmd listens leaves the job in "Prolog" (Slurm's own
    # behaviour, not gpushare's).
    for job_id in jobs:
        wait_until(f"job {job_id} script started",
                   lambda job_id=job_id: os.path.exists(bed.path("out", f"{job_id}.out"))
                   and "script-started" in bed.output(job_id), 60)
    records = wait_until("daemons of 3 jobs",
                         lambda: (r := started_records(bed)) and
                         sum(len(x["jobs"]) for x in r) == 3 and r, 60)
    pids = [r["daemon_pid"] for r in records]  # type: ignore[union-attr]
    bed.kill_slurmd(NODE)
    time.sleep(2)
    assert all(alive(pid) for pid in pids)  # the jobs' daemons outlive slurmd
    bed.start_slurmd(NODE)
    for job_id in jobs:
        assert bed.wait_job(job_id, timeout=180)["JobState"] == "COMPLETED"
    assert_nothing_left(bed, timeout=120)
    assert not any(alive(pid) for pid in pids)
    wait_until(f"{NODE} back", lambda: bed.node_state(NODE)["State"] in ("IDLE", "MIXED"), 90)


# ---------------------------------------------------------------------------- faults


def fault_job(bed) -> int:
    """A job on the faulty node that asks not to be requeued, so that its task fails with
    the cause (test_hostile.py follows a job gpushare requeues)."""
    return bed.sbatch("echo RAN", "--gres=mps:25", "-w", FAULT_NODE, "-c1", "--no-requeue",
                      user=U1)


def prolog_failure(bed, job_id: int) -> tuple[str, list[str]]:
    """The drain reason and the slurmd log lines about the job, after its prolog failed."""
    reason = wait_drained(bed, FAULT_NODE)
    # The prolog's worker drained the node and left the job's task the cause: the task fails
    # with it instead of running without its daemon.
    info = bed.wait_job(job_id)
    assert info.get("JobState") != "COMPLETED", info
    output = bed.output(job_id)
    assert "RAN" not in output, output
    assert f"gpushare: could not set up this job on node {FAULT_NODE}: " in output, output
    lines = [line for line in slurmd_log(bed, FAULT_NODE).splitlines()
             if f"gpushare: job {job_id}:" in line and "error" in line.lower()]
    bed.run(["scancel", str(job_id)], check=False)
    return reason, lines


def test_missing_control_program_drains_with_its_path(mps_bed):
    bed = mps_bed
    missing = "/usr/lib/gpushare-missing/nvidia-cuda-mps-control"
    line = bed.plugstack_line().replace(f"mps_control={standin_program(bed)}",
                                        f"mps_control={missing}")
    assert missing in line
    bed.write_plugstack(line)
    job_id = fault_job(bed)
    reason, lines = prolog_failure(bed, job_id)
    assert missing in reason, reason
    assert len(lines) == 1 and missing in lines[0] and "does not exist" in lines[0], lines
    assert_nothing_left(bed)


@pytest.mark.parametrize("fault, cause, words", [
    ("die_start", "nvidia-cuda-mps-control -d exit 1", "exited with status 1"),
    ("hang_start", "no answer within 5 s, killed", "no answer within 5 s"),
    ("die_after_start", "no control socket within 5 s", "created no control socket"),
])
def test_daemon_failing_at_start_drains_the_node_naming_the_gpu(mps_bed, fault, cause, words):
    bed = mps_bed
    set_fault(bed, fault)
    started = time.monotonic()
    job_id = fault_job(bed)
    reason, lines = prolog_failure(bed, job_id)
    elapsed = time.monotonic() - started
    # `sinfo -R` shows the cause first, then the GPU, within Slurm's width; the log line
    # has every detail.
    assert reason.startswith(f"gpushare: MPS start failed: {cause} (GPU 0, daemon u"), reason
    without_stamp = re.sub(r" \[\w+@[^\]]*\]$", "", reason)  # Slurm adds [user@time]
    assert len(without_stamp) <= 100, reason
    assert len(lines) == 1 and words in lines[0], lines
    assert f"MPS for job {job_id}: cannot start MPS on GPU 0 (GPU-" in lines[0], lines
    # Bounded by timeout=5 (start + control socket), never a hung prolog.
    assert elapsed < 60, elapsed
    assert_nothing_left(bed)


def test_the_task_waits_for_a_slow_daemon_start(mps_bed):
    """The prolog returns to Slurm at once; its worker starts the daemon while the step
    starts, and the task waits for it."""
    bed = mps_bed
    set_fault(bed, "slow_start")
    started = time.monotonic()
    result = bed.run(["srun", "-w", FAULT_NODE, "--gres=mps:25", "-c1", "printenv",
                      "SLURM_JOB_ID", "CUDA_MPS_PIPE_DIRECTORY"], user=U1)
    assert time.monotonic() - started > 1.5
    job_id, pipe_dir = result.stdout.split()
    assert pipe_dir.startswith(bed.state_of(FAULT_NODE) + "/mps/u"), pipe_dir
    waited = [line for line in bed.debug_lines()
              if f"job={job_id} cb=task_init_privileged prolog=done waited=" in line]
    assert len(waited) == 1 and int(waited[0].rsplit("=", 1)[1]) > 0, waited
    assert_nothing_left(bed)
    assert "DRAIN" not in bed.node_state(FAULT_NODE)["State"]


def test_slurmd_restarts_while_a_prolog_worker_runs(mps_bed):
    """The worker belongs to no slurmd: one restarted while a prolog worker runs starts
    again, and the job still gets its daemon."""
    bed = mps_bed
    set_fault(bed, "slow_start")
    job_id = bed.sbatch("printenv CUDA_MPS_PIPE_DIRECTORY", "--gres=mps:25", "-w", FAULT_NODE,
                        "-c1", user=U1)
    # slurmd is killed once the job's step runs in its own slurmstepd, its task waiting for
    # the worker: a slurmd killed between the prolog and the step's launch loses the launch
    # with or without gpushare (Slurm's own race, seen on 24.11 under load).
    wait_until("the task waiting for the prolog's worker", lambda: any(
        f"job={job_id} cb=task_init_privileged begin" in line
        for line in bed.debug_lines()), 60)
    assert not any(f"job={job_id} " in line and slurmbed.worker_ended(line, "job_prolog", "")
                   for line in bed.debug_lines()), \
        "the worker ended before slurmd was killed: nothing was tested"
    bed.kill_slurmd(FAULT_NODE)
    bed.start_slurmd(FAULT_NODE)  # BedError if it cannot start
    assert bed.wait_job(job_id, timeout=120)["JobState"] == "COMPLETED"
    assert bed.output(job_id).startswith(bed.state_of(FAULT_NODE) + "/mps/u"), \
        bed.output(job_id)
    assert_nothing_left(bed, timeout=120)
    wait_until(f"{FAULT_NODE} back",
               lambda: bed.node_state(FAULT_NODE)["State"] in ("IDLE", "MIXED"), 90)


def test_a_killed_prolog_worker_and_supervisor_fail_the_task_instead_of_running_it(mps_bed):
    """A worker killed with its supervisor (a slurmd unit that kills its cgroup) leaves no
    word for the tasks: they fail instead of starting unchecked or without their daemon,
    and the task's C glue drains the node with the cause, as no Python is left to do it.
    (The worker alone killed is its supervisor's to report: test_hostile.py.)"""
    bed = mps_bed
    set_fault(bed, "slow_start")
    job_id = bed.sbatch("echo RAN", "--gres=mps:25", "-w", FAULT_NODE, "-c1", user=U1)
    started = wait_until("the prolog's worker", lambda: next(
        (line for line in bed.debug_lines()
         if f"job={job_id} " in line and slurmbed.WORKER_STARTED.search(line)), None), 60)
    # Killed while it starts the daemon (slow_start: 1.5 s), once the daemon's record names
    # the job: what it set up is then the epilog's to undo.
    wait_until("the daemon's record names the job", lambda: any(
        str(job_id) in record["jobs"] for record in mps_records(bed)), 60)
    worker = int(re.search(r" pid=(\d+) ", str(started))[1])
    with open(f"/proc/{worker}/stat") as handle:
        supervisor = int(handle.read().rsplit(")", 1)[1].split()[1])
    os.kill(supervisor, signal.SIGKILL)
    os.kill(worker, signal.SIGKILL)
    assert bed.wait_job(job_id)["JobState"] != "COMPLETED"
    output = bed.output(job_id)
    assert "RAN" not in output, output
    assert "gpushare: this job's set-up on the node ended without a result" in output, output

    def drained() -> object:
        state = bed.node_state(FAULT_NODE)
        return state if "DRAIN" in state["State"] else None

    state = wait_until("the node drained", drained, 60)
    assert "gpushare: a job's set-up worker was killed" in state.get("Reason", ""), state
    assert_nothing_left(bed, timeout=120)


def test_an_epilog_waits_for_its_prologs_worker(mps_bed):
    """A job cancelled while its prolog's worker still starts the daemon: the epilog waits
    for the worker, then stops the daemon it started. Nothing is left."""
    bed = mps_bed
    set_fault(bed, "slow_start")
    job_id = bed.sbatch("sleep 60", "--gres=mps:25", "-w", FAULT_NODE, "-c1", user=U1)
    wait_until("the prolog's worker", lambda: any(
        f"job={job_id} " in line and slurmbed.WORKER_STARTED.search(line)
        for line in bed.debug_lines()), 60)
    bed.run(["scancel", str(job_id)])
    bed.wait_job(job_id)
    wait_until("the epilog's worker", lambda: any(
        f"job={job_id} " in line and slurmbed.worker_ended(line, "job_epilog")
        for line in bed.debug_lines()), 60)
    lines = [line for line in slurmd_log(bed, FAULT_NODE).splitlines()
             if f"gpushare: job {job_id}: " in line]
    assert any("started MPS control daemon" in line for line in lines), lines
    assert any("stopped MPS control daemon" in line for line in lines), lines
    assert_nothing_left(bed)
    assert "DRAIN" not in bed.node_state(FAULT_NODE)["State"]


def barrier_held(path: str) -> bool:
    """Whether an epilog worker holds this barrier lock (asked without waiting)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_an_epilog_holds_the_barrier_of_its_own_gpus_only(mps_bed):
    """slurmd's epilog hands the C glue the job's GPUs (SLURM_JOB_GPUS): its worker holds
    their barrier locks, which a prolog on those GPUs waits for, and no other."""
    bed = mps_bed
    job_id = bed.sbatch("sleep 3", "--gres=mps:25", "-w", FAULT_NODE, "-c1", user=U1)
    wait_until("daemon", lambda: started_records(bed), 60)
    state = bed.state_of(FAULT_NODE)
    with open(os.path.join(state, "jobs", f"{job_id}.json")) as handle:
        gpus = json.load(handle)["slurm_gpus"]
    assert len(gpus) == 1 and gpus[0].isdigit(), gpus
    set_fault(bed, "ignore_quit")  # the epilog's worker now takes timeout= to stop it
    assert bed.wait_job(job_id)["JobState"] == "COMPLETED"
    own = os.path.join(state, f"epilogs.gpu{gpus[0]}.lock")
    wait_until("the epilog's worker holding its GPU's barrier", lambda: barrier_held(own), 30)
    others = [os.path.join(state, name) for name in os.listdir(state)
              if name.startswith("epilogs.") and name != os.path.basename(own)]
    assert not [path for path in others if barrier_held(path)], others
    assert_nothing_left(bed)
    # The worker cleans up, then its Python ends and its supervisor exits: the barrier goes
    # with the last of them, a moment after the files do.
    wait_until("the epilog's worker releasing its barrier", lambda: not barrier_held(own), 30)


@pytest.mark.parametrize("fault", ["ignore_quit", "ignore_term"])
def test_daemon_ignoring_quit_is_stopped_by_signal_at_epilog(mps_bed, fault):
    bed = mps_bed
    job_id = bed.sbatch("sleep 2", "--gres=mps:25", "-w", FAULT_NODE, "-c1", user=U1)
    record = wait_until("daemon", lambda: started_records(bed), 60)[0]  # type: ignore[index]
    set_fault(bed, fault)  # the running daemon re-reads it at quit and SIGTERM
    assert bed.wait_job(job_id)["JobState"] == "COMPLETED"
    assert_nothing_left(bed)
    assert not alive(record["daemon_pid"])
    pid = record["daemon_pid"]
    lines = [line for line in slurmd_log(bed, FAULT_NODE).splitlines()
             if f"(pid {pid}, pipe dir {record['pipe_dir']})" in line]
    ignored = [line for line in lines if "ignored quit for 5 s; ending it with signals" in line]
    assert len(ignored) == 1, lines
    signals = ["SIGTERM", "SIGKILL"] if fault == "ignore_term" else ["SIGTERM"]
    sent = [m.group(1) for line in lines for m in [re.search(r"sending (SIG\w+) to pid (\d+)",
                                                            line)] if m and m.group(2) == str(pid)]
    assert sent == signals, lines
    # Every line names the job whose epilog stopped the daemon.
    assert any(line.endswith(")") and f"gpushare: job {job_id}: stopped MPS control daemon"
               in line for line in lines), lines
    assert all(f"gpushare: job {job_id}: " in line for line in ignored), ignored
    assert "DRAIN" not in bed.node_state(FAULT_NODE)["State"]
