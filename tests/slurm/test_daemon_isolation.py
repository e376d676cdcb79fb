# SPDX-License-Identifier: GPL-2.0-or-later
"""A user's MPS daemon inside the real local Slurm: started as a job's process would be,
never confused with a process that only names the program, never talked to through what
its user planted; a full state_dir= named as the cause; root's shared jobs served by a
daemon of root's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from contextlib import suppress

import pytest

import slurmbed
from gpushare.node.mps import isolation
from mps_standin.harness import running as alive
from slurmbed import wait_until

pytestmark = pytest.mark.slurm

U1, U2 = slurmbed.TEST_USERS
NODE = "n1"
PID_FILE = "nvidia-cuda-mps-control.pid"


# ---------------------------------------------------------------------------- helpers

def started_records(bed, node: str = NODE) -> list[dict]:
    """The node's daemon records that name a started daemon."""
    mps = os.path.join(bed.state_of(node), "daemons")
    records = []
    for name in sorted(os.listdir(mps)) if os.path.isdir(mps) else []:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(mps, name)) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue  # replaced under us
        if record.get("daemon_pid"):
            records.append(record)
    return records


def one_daemon(bed, uid: int, node: str = NODE) -> dict:
    def found():
        mine = [r for r in started_records(bed, node) if r["uid"] == uid]
        return mine[0] if len(mine) == 1 else None
    return wait_until(f"the daemon of uid {uid}", found, 90)  # type: ignore[return-value]


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as handle:
        return dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)


def cgroup_v2(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as handle:
        return next((line.split(":", 2)[2].strip() for line in handle
                     if line.startswith("0::")), "")


def program(bed) -> str:
    return bed.path("bin", "nvidia-cuda-mps-control")


def as_user(user: str, argv: list[str], env: dict[str, str] | None = None
            ) -> subprocess.Popen:
    """A process of ``user`` outside Slurm, in a session of its own (Slurm never ends it)."""
    return subprocess.Popen(["runuser", "-u", user, "--", "env", "-i",
                             *[f"{k}={v}" for k, v in (env or {}).items()],
                             "setsid", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def spoof(bed, user: str, pipe_dir: str) -> int:
    """A process of ``user`` whose argv[0] is the MPS program (``exec -a``), with the
    daemon's pipe directory in its environment: it runs sleep. Returns its pid."""
    marker = f"GPUSHARE_TEST_SPOOF={time.monotonic_ns()}"
    as_user(user, ["bash", "-c", f"exec -a {program(bed)} sleep 600"],
            {"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
             marker.split("=")[0]: marker.split("=")[1]})

    def started():
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/environ", "rb") as handle:
                        environ = handle.read().split(b"\0")
                    with open(f"/proc/{name}/cmdline", "rb") as handle:
                        argv0 = handle.read().split(b"\0")[0]
                except OSError:
                    continue
                if marker.encode() in environ and argv0 == program(bed).encode():
                    return int(name)
        return None
    return wait_until("the spoofing process", started, 30)  # type: ignore[return-value]


def end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_until(f"pid {pid} gone", lambda: not alive(pid), 30)


def set_fault(bed, *names: str) -> None:
    path = bed.path("bin", "faults")
    with open(path, "w") as handle:
        handle.write("\n".join(names) + "\n")
    os.chmod(path, 0o644)


def nothing_left(bed) -> None:
    def clean() -> bool:
        jobs = [os.path.join(bed.state_of(node.name), "jobs") for node in bed.nodes]
        return not any(started_records(bed, node.name) for node in bed.nodes) and not any(
            os.listdir(path) for path in jobs if os.path.isdir(path))
    wait_until("no daemon or job left", clean, 90)


def not_drained(bed, node: str = NODE) -> None:
    state = bed.node_state(node)
    assert "DRAIN" not in state["State"], state


@pytest.fixture
def iso_bed(clean_bed):
    """The bed with every job through a worker (no join in C, which does not look at
    ``control``), no stand-in fault, and nothing left after."""
    line = clean_bed.plugstack_line()
    clean_bed.write_plugstack(line.rstrip("\n") + " verify_reuse=0\n")
    faults = clean_bed.path("bin", "faults")
    if os.path.exists(faults):
        os.unlink(faults)
    yield clean_bed
    if os.path.exists(faults):
        os.unlink(faults)
    for user in (*slurmbed.TEST_USERS, "root"):
        clean_bed.run(["scancel", "-u", user], check=False)
    clean_bed.write_plugstack(line)


# ---------------------------------------------------------------------------- isolation

def test_the_daemon_runs_as_a_job_would_after_its_starters_are_gone(iso_bed):
    """slurmd runs with oom_score_adj -1000 (or, where root may not lower it, 500): the
    daemon has 0, no blocked or ignored signal, umask 077, and a cgroup of its own; it
    keeps them when slurmd, the ancestor of the worker that started it, is killed."""
    bed = iso_bed
    slurmd = bed._pids[f"slurmd-{NODE}"]
    with open(f"/proc/{slurmd}/oom_score_adj") as handle:
        before = handle.read().strip()
    try:
        with open(f"/proc/{slurmd}/oom_score_adj", "w") as handle:
            handle.write("-1000")
    except PermissionError:
        with open(f"/proc/{slurmd}/oom_score_adj", "w") as handle:
            handle.write("500")
    try:
        job_id = bed.sbatch("sleep 60", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
        bed.wait_job(job_id, states={"RUNNING"}, timeout=120)
        record = one_daemon(bed, slurmbed.uid_of(U1))
    finally:
        with open(f"/proc/{slurmd}/oom_score_adj", "w") as handle:
            handle.write(before)
    pid = record["daemon_pid"]
    bed.kill_slurmd(NODE)
    try:
        assert alive(pid)
        seen = status(pid)
        with open(f"/proc/{pid}/oom_score_adj") as handle:
            assert handle.read().strip() == "0"
        assert int(seen["SigBlk"], 16) == 0 and int(seen["SigIgn"], 16) == 0, seen
        assert seen["Umask"] == "0077"
        assert seen["Uid"].split()[0] == str(slurmbed.uid_of(U1))
        if bed.daemon_cgroups is not None:  # the bed's mps_cgroup=, in place of auto's
            assert cgroup_v2(pid).endswith(
                f"/{os.path.basename(bed.daemon_cgroups)}/{NODE}/{record['key']}"), (
                cgroup_v2(pid))
        elif isolation.cgroup_parent("auto") is not None:
            assert cgroup_v2(pid).endswith(f"/gpushare-mps/{record['key']}"), cgroup_v2(pid)
        else:  # a root without a cgroup v2 mount: mps_cgroup=auto leaves the daemon put
            assert "gpushare-mps" not in cgroup_v2(pid), cgroup_v2(pid)
        print(f"daemon {pid}: oom_score_adj 0, SigBlk {seen['SigBlk']}, SigIgn "
              f"{seen['SigIgn']}, Umask {seen['Umask']}, cgroup {cgroup_v2(pid)}")
    finally:
        bed.start_slurmd(NODE)
    bed.run(["scancel", str(job_id)])
    bed.wait_job(job_id)
    nothing_left(bed)
    assert not alive(pid)
    not_drained(bed)


def test_a_process_left_in_the_daemons_cgroup_ends_with_the_daemon(iso_bed):
    """A takeover of the daemon (ptrace, where ptrace_scope allows it) leaves a child of the
    user in the daemon's cgroup that is no MPS program (here: root moves the user's
    ``sleep`` there). When the job ends, its daemon's whole cgroup ends: that process is
    gone, the cgroup removed, nothing left, the node in service."""
    bed = iso_bed
    mount, top = isolation.cgroup2_mount(), bed.daemon_cgroups
    if mount is None or top is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    assert f" mps_cgroup={top}/%n" in bed.plugstack_line()
    parent = os.path.join(top, NODE)
    uid = slurmbed.uid_of(U1)
    child = None
    try:
        job_id = bed.sbatch("sleep 60", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
        bed.wait_job(job_id, states={"RUNNING"}, timeout=120)
        record = one_daemon(bed, uid)
        key_cgroup = os.path.join(parent, record["key"])
        assert cgroup_v2(record["daemon_pid"]) == "/" + os.path.relpath(key_cgroup, mount)
        child = subprocess.Popen(["/bin/sleep", "600"], user=uid, group=uid,
                                 extra_groups=[], start_new_session=True)
        with open(os.path.join(key_cgroup, "cgroup.procs"), "w") as handle:
            handle.write(f"{child.pid}\n")
        assert cgroup_v2(child.pid) == cgroup_v2(record["daemon_pid"])
        bed.run(["scancel", str(job_id)])
        bed.wait_job(job_id)
        nothing_left(bed)
        assert child.wait(timeout=60) == -signal.SIGKILL
        assert not alive(record["daemon_pid"])
        wait_until("the daemon's cgroup removed", lambda: not os.path.exists(key_cgroup), 30)
        assert not [name for name in os.listdir(os.path.join(bed.state_of(NODE), "daemons"))
                    if name.startswith(record["key"])]  # its lock file too
        not_drained(bed)
        print(f"pid {child.pid} of uid {uid} in {key_cgroup}: killed with the daemon "
              f"{record['daemon_pid']}; cgroup removed")
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()


# ---------------------------------------------------------------------------- the daemon

def test_a_process_naming_the_program_in_argv_is_never_taken_for_the_daemon(iso_bed):
    """A process of the job's user with the daemon's pipe directory and ``exec -a
    <program>``: when the job ends and its daemon stops, it is left alone."""
    bed = iso_bed
    job_id = bed.sbatch("sleep 60", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    bed.wait_job(job_id, states={"RUNNING"}, timeout=120)
    record = one_daemon(bed, slurmbed.uid_of(U1))
    impostor = spoof(bed, U1, record["pipe_dir"])
    try:
        bed.run(["scancel", str(job_id)])
        bed.wait_job(job_id)
        nothing_left(bed)
        assert not alive(record["daemon_pid"])
        assert alive(impostor)  # no signal reached it
        not_drained(bed)
    finally:
        end(impostor)


def test_a_planted_pid_file_does_not_name_the_daemon(iso_bed):
    """The user writes the pid of their impostor into the pid file while the daemon starts
    (the stand-in waits 1.5 s and writes none): the record names the real daemon, whose
    exe is the program, and the impostor outlives the job."""
    bed = iso_bed
    set_fault(bed, "slow_start", "no_pid_file")
    uid = slurmbed.uid_of(U1)
    job_id = bed.sbatch("sleep 60", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    mps = os.path.join(bed.state_of(NODE), "mps")

    def pipe_dir():
        for name in os.listdir(mps) if os.path.isdir(mps) else []:
            path = os.path.join(mps, name, "pipe")
            if name.startswith(f"u{uid}-") and os.path.isdir(path):
                return path
        return None
    pipe = wait_until("the user's pipe directory", pipe_dir, 60)
    impostor = spoof(bed, U1, pipe)  # type: ignore[arg-type]
    try:
        planted = subprocess.run(
            ["runuser", "-u", U1, "--", "sh", "-c", f"echo {impostor} > {pipe}/{PID_FILE}"],
            capture_output=True, text=True)
        assert planted.returncode == 0, planted.stderr
        record = one_daemon(bed, uid)
        assert record["daemon_pid"] != impostor
        assert os.readlink(f"/proc/{record['daemon_pid']}/exe") == os.path.realpath(
            program(bed))
        bed.wait_job(job_id, states={"RUNNING"}, timeout=60)
        bed.run(["scancel", str(job_id)])
        bed.wait_job(job_id)
        nothing_left(bed)
        assert alive(impostor)
        not_drained(bed)
    finally:
        end(impostor)


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["fifo", "file", "silent_socket"])
def test_a_fake_control_fails_that_users_job_and_never_the_node(iso_bed, kind):
    """The user replaces their daemon's ``control``: their next job on that daemon fails
    with a message saying so (a socket that never answers only leaves the old, stricter
    caps); the node stays in service, the daemon still stops at its last job's end, and the
    next jobs of that user and of another run."""
    bed = iso_bed
    holder = bed.sbatch("sleep 60", "--gres=mps:25", "-w", NODE, "-c1", user=U1)
    bed.wait_job(holder, states={"RUNNING"}, timeout=120)
    record = one_daemon(bed, slurmbed.uid_of(U1))
    control = os.path.join(record["pipe_dir"], "control")
    plant = {
        "fifo": f"mv {control} {control}.moved && mkfifo {control}",
        "file": f"mv {control} {control}.moved && echo x > {control}",
        "silent_socket": (
            f"mv {control} {control}.moved && exec /usr/bin/python3 -c \"import socket, time; "
            f"s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind('{control}'); "
            f"s.listen(1); time.sleep(120)\""),
    }[kind]
    planter = as_user(U1, ["sh", "-c", plant], {"PATH": "/usr/bin:/bin"})
    wait_until("control replaced", lambda: os.path.exists(control + ".moved") and (
        os.path.exists(control)), 30)
    try:
        joined = bed.run(["srun", "-w", NODE, "--gres=mps:25", "-c1", "true"], user=U1,
                         check=False, timeout=120)
        if kind == "silent_socket":
            # A socket of the user's: root's caps command to it times out and is logged;
            # the job runs under the caps the daemon had.
            assert joined.returncode == 0, joined.stderr
        else:
            assert joined.returncode != 0
            assert "not the daemon's socket; the job's user put it there" in joined.stderr, (
                joined.stderr)
        not_drained(bed)
        bed.run(["scancel", str(holder)])
        bed.wait_job(holder)
        nothing_left(bed)
        assert not alive(record["daemon_pid"])
        not_drained(bed)
    finally:
        planter.kill()
        planter.wait()
    for user in (U1, U2):
        ran = bed.run(["srun", "-w", NODE, "--gres=mps:25", "-c1", "true"], user=user,
                      check=False, timeout=120)
        assert ran.returncode == 0, ran.stderr
    nothing_left(bed)
    not_drained(bed)


# ---------------------------------------------------------------------------- space

def mounts_below(path: str) -> list[str]:
    """Mount points below ``path`` in this (the bed's) mount namespace."""
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    return [point for point in points if point.startswith(path + "/")]


def test_a_user_who_fills_their_own_mps_space_fails_nobody_else_and_drains_nothing(iso_bed):
    """The node's users' MPS directories on a small tmpfs, as docs/admin.md used to set
    them up, and each daemon's own space on top (the default mps_space=16M,4096). From
    inside their running MPS job, user 1 writes into $CUDA_MPS_LOG_DIRECTORY until ENOSPC.
    Their space is full, and only theirs: user 2's shared job on the same GPU starts and
    completes; user 1's next job there fails, naming their uid and what to do, and joins
    once they removed what they wrote; no node drains. When the filling job ends its space
    goes with one unmount (nothing left behind), and user 1's next start gets a fresh one
    and runs."""
    bed = iso_bed
    node = "n2"
    mps = os.path.join(bed.state_of(node), "mps")
    os.makedirs(mps, mode=0o755, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m,nr_inodes=256",
                    "gpushare-test-full", mps], check=True)
    uid1, uid2 = slurmbed.uid_of(U1), slurmbed.uid_of(U2)
    try:
        filler = bed.sbatch("head -c 20M /dev/zero > $CUDA_MPS_LOG_DIRECTORY/fill; "
                            "echo WRITE=$?; sleep 90", "--gres=mps:25", "-w", node, "-c1",
                            user=U1)
        mine = one_daemon(bed, uid1, node)
        key_dir = os.path.dirname(mine["log_dir"])

        def full() -> bool:
            room = os.statvfs(key_dir)
            return room.f_bavail == 0 or room.f_favail == 0
        wait_until("user 1's MPS space full", full, 90)
        # Full as soon as head's last write fails; its status is echoed just after.
        wait_until("the filler's write status", lambda: "WRITE=" in bed.output(filler, ""), 60)
        assert "WRITE=1" in bed.output(filler, ""), bed.output(filler, "")
        holder = bed.sbatch("sleep 60", "--gres=mps:25", "-w", node, "-c1", user=U2)
        bed.wait_job(holder, states={"RUNNING"}, timeout=120)
        theirs = one_daemon(bed, uid2, node)
        assert theirs["devices"] == mine["devices"], (theirs["devices"], mine["devices"])
        ran = bed.run(["srun", "-w", node, "--gres=mps:25", "-c1", "true"], user=U2,
                      check=False, timeout=120)
        assert ran.returncode == 0, ran.stderr
        not_drained(bed, node)
        refused = bed.run(["srun", "-w", node, "--gres=mps:25", "-c1", "true"], user=U1,
                          check=False, timeout=120)
        assert refused.returncode != 0
        assert (f"its own MPS space {key_dir} (uid {uid1}'s, plugstack mps_space=16M,4096) "
                f"is full: the jobs of uid {uid1} filled") in refused.stderr, refused.stderr
        not_drained(bed, node)
        freed = subprocess.run(["runuser", "-u", U1, "--", "rm", mine["log_dir"] + "/fill"],
                               capture_output=True, text=True)
        assert freed.returncode == 0, freed.stderr
        joined = bed.run(["srun", "-w", node, "--gres=mps:25", "-c1", "true"], user=U1,
                         check=False, timeout=120)
        assert joined.returncode == 0, joined.stderr
        not_drained(bed, node)
        bed.run(["scancel", str(filler), str(holder)])
        bed.wait_job(filler)
        bed.wait_job(holder)
        nothing_left(bed)
        assert mounts_below(mps) == [] and os.listdir(mps) == []
        again = bed.run(["srun", "-w", node, "--gres=mps:25", "-c1", "bash", "-c",
                         "head -c 1M /dev/zero > $CUDA_MPS_LOG_DIRECTORY/room && echo ROOM"],
                        user=U1, check=False, timeout=120)
        assert again.returncode == 0 and "ROOM" in again.stdout, again.stderr
        nothing_left(bed)
        assert mounts_below(mps) == [] and os.listdir(mps) == []
        not_drained(bed, node)
    finally:
        bed.run(["scancel", "-u", U1], check=False)
        bed.run(["scancel", "-u", U2], check=False)
        nothing_left(bed)
        for point in reversed(mounts_below(mps)):
            subprocess.run(["umount", "-l", point], check=False)
        subprocess.run(["umount", "-l", mps], check=False)
        bed.resume(node)


def test_a_full_state_dir_is_the_drain_reason_and_the_jobs_message(iso_bed):
    """state_dir= itself full (here a small tmpfs that root's own file fills): that is the
    node's fault. A shared job there fails with "no space left in state_dir=", the node is
    drained with that cause, and once space is freed and the node resumed, shared jobs run
    again."""
    bed = iso_bed
    node = "n2"
    state = bed.state_of(node)
    nothing_left(bed)
    os.makedirs(state, mode=0o755, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m,nr_inodes=256",
                    "gpushare-test-state", state], check=True)
    fill = os.path.join(state, "fill")
    try:
        subprocess.run(["bash", "-c", f"head -c 2M /dev/zero > {fill}"], check=False)
        assert os.statvfs(state).f_bavail == 0
        failed = bed.run(["srun", "-w", node, "--gres=mps:25", "-c1", "true"], user=U2,
                         check=False, timeout=120)
        assert failed.returncode != 0, bed.debug_lines()[-15:]
        assert "no space left in state_dir=" in failed.stderr, failed.stderr
        wait_until("drained", lambda: "DRAIN" in bed.node_state(node)["State"], 60)
        reason = bed.run(["sinfo", "-h", "-n", node, "-o", "%E"]).stdout.strip()
        assert reason == f"gpushare: state_dir= full: {state}", reason
        os.unlink(fill)
        bed.resume(node)
        ran = bed.run(["srun", "-w", node, "--gres=mps:25", "-c1", "true"], user=U2,
                      check=False, timeout=120)
        assert ran.returncode == 0, ran.stderr
        nothing_left(bed)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(fill)
        nothing_left(bed)
        subprocess.run(["umount", "-l", state], check=False)
        bed.resume(node)


# ---------------------------------------------------------------------------- root

def test_roots_shared_job_runs_under_a_daemon_of_roots_that_no_one_else_reaches(iso_bed):
    """As Slurm's own MPS tests submit: ``sbatch --gres=mps:25`` as root. Its daemon runs
    as root with pipe and log directories only root can reach; a user's probe from a job
    of theirs gets nowhere; it ends with the job."""
    bed = iso_bed
    script = "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\nsleep 30\n"
    job_id = bed.sbatch(script, "--gres=mps:25", "-w", NODE, "-c1", user="root")
    bed.wait_job(job_id, states={"RUNNING"}, timeout=120)
    record = one_daemon(bed, 0)
    assert status(record["daemon_pid"])["Uid"].split()[0] == "0"
    for path in (record["pipe_dir"], record["log_dir"]):
        info = os.lstat(path)
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o700)
    probe = bed.run(["srun", "-w", NODE, "--gres=mps:10", "-c1", "bash", "-c",
                     f"ls {record['pipe_dir']} >/dev/null 2>&1 && echo LS=ok || echo LS=no"],
                    user=U2, timeout=120)
    assert "LS=no" in probe.stdout, probe.stdout
    bed.wait_job(job_id, timeout=120)
    assert bed.job(job_id)["JobState"] == "COMPLETED"
    out = bed.output(job_id)
    assert f"PIPE={record['pipe_dir']}" in out and "PCT=25" in out, out
    nothing_left(bed)
    assert not alive(record["daemon_pid"])
    not_drained(bed)


def test_under_systemd_each_daemon_runs_in_a_scope_of_gpushare_slice(bed):
    """slurmd as a systemd service (Delegate=yes, KillMode=process, as a site runs it) under
    a real systemd: a shared job's daemon runs in a transient scope of its own in
    gpushare.slice, outside slurmd's service and any job's cgroup; ``gpushare mps`` shows
    it; the scope goes when the last job's epilog stops the daemon."""
    import re

    import systemd_node

    reason = systemd_node.unusable_reason()
    if reason is not None:
        pytest.skip(reason)
    node_name = "sd1"
    with systemd_node.SystemdNode() as node:
        small = slurmbed.default_bed(root=bed.root + "-systemd", port_base=bed.ctld_port + 80,
                                     node_count=1, prefix="sd", cgroup=False, systemd=node)
        with small:
            assert node.units("slurmd-*") == [f"slurmd-{node_name}.service"]
            job_id = small.sbatch("sleep 120", "--gres=mps:25", "-c1", user=U1)
            small.wait_job(job_id, states={"RUNNING"}, timeout=120)
            record = one_daemon(small, slurmbed.uid_of(U1), node=node_name)
            cgroup = next(line.split(":", 2)[2] for line in node.run(
                ["cat", f"/proc/{record['daemon_pid']}/cgroup"]).stdout.splitlines()
                if line.startswith("0::"))
            scope = re.fullmatch(r"/gpushare\.slice/(gpushare-mps-(.+)-[0-9a-f]{8}\.scope)",
                                 cgroup)
            assert scope and scope[2] == record["key"], cgroup
            assert node.units("gpushare-mps-*") == [scope[1]]
            slurmd_cgroup = node.run(["systemctl", "show", "-p", "ControlGroup", "--value",
                                      f"slurmd-{node_name}.service"]).stdout.strip()
            assert slurmd_cgroup == f"/system.slice/slurmd-{node_name}.service"
            shown = node.run(["/usr/bin/python3", "-m", "gpushare.cli", "mps", "--node",
                              node_name, "--json"],
                             env=dict(small.env, PYTHONPATH=small.path("lib", "python")))
            (daemon,) = json.loads(shown.stdout)["daemons"]
            assert daemon["cgroup"] == cgroup and daemon["status"] == "running", daemon
            small.run(["scancel", str(job_id)])
            small.wait_job(job_id)
            nothing_left(small)
            wait_until("the daemon's scope gone",
                       lambda: node.units("gpushare-mps-*") == [], 30)
            not_drained(small, node_name)
