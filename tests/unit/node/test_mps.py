# SPDX-License-Identifier: GPL-2.0-or-later
"""MPS daemon lifecycle against the stand-in daemon, run for real as two test users."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import shutil
import stat
import subprocess
import time
import uuid

import pytest

from gpushare.admin.mps_report import inspect_daemons
from gpushare.cli import main as cli_main
from gpushare.node.config import PluginConfig
from gpushare.node.mps import (
    MpsDevice,
    MpsError,
    MpsLease,
    MpsManager,
    MpsUserError,
    RecordStore,
    daemon_key,
    isolation,
    teardown,
)
from gpushare.node.state import JobRecord, JobStore
from mps_standin.harness import StandinInstall, traversable_tmpdir, unusable_reason
from mps_standin.harness import running as alive

REASON = unusable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

GPU0 = MpsDevice("GPU-11111111-2222-3333-4444-555555555555", 0, 80 << 30, "GPU 0")
GPU1 = MpsDevice("GPU-66666666-7777-8888-9999-000000000000", 1, 80 << 30, "GPU 1")
MIG = MpsDevice("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 2, 10 << 30, "GPU 2 MIG 1g.10gb")


def own_cgroup_parent() -> str:
    """A cgroup v2 directory of this bed's own for its daemons' cgroups (never the shared
    ``gpushare-mps``: a daemon's retirement kills its whole cgroup, and another run of these
    tests on this host has daemons of the same keys); "none" where root cannot make one."""
    mount = isolation.cgroup2_mount()
    if mount is None:
        return "none"
    path = os.path.join(mount, f"gpushare-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(path, 0o755)
    except OSError:
        return "none"
    return path


class Bed:
    """A traversable temp dir holding a root-owned stand-in and a state dir; daemons get
    cgroups under a parent of the bed's own."""

    def __init__(self) -> None:
        self.base = traversable_tmpdir()
        self.standin = StandinInstall(self.base)
        self.state_dir = os.path.join(self.base, "state")
        self.cgroup = own_cgroup_parent()

    def config(self, **overrides) -> PluginConfig:
        values = {"state_dir": self.state_dir, "mps_control": self.standin.program,
                  "timeout": 2.0, "mps_cgroup": self.cgroup}
        values.update(overrides)
        return PluginConfig(**values)

    def manager(self, **overrides) -> MpsManager:
        return MpsManager(self.config(**overrides), lock_timeout=60)

    @property
    def mps_dir(self) -> str:
        return os.path.join(self.state_dir, "mps")

    @property
    def daemons_dir(self) -> str:
        return os.path.join(self.state_dir, "daemons")

    def entries(self) -> list[str]:
        """What is left of root's records and of the users' directories (with
        ``mps_space=shared`` the users' ``.trash`` stays, made before users can fill the
        mount: what it holds is listed instead)."""
        found = sorted(name for path in (self.daemons_dir, self.mps_dir)
                       if os.path.isdir(path) for name in os.listdir(path))
        if ".trash" in found:
            found.remove(".trash")
            found += [f".trash/{name}" for name in os.listdir(
                os.path.join(self.mps_dir, ".trash"))]
        return found

    def mounts(self) -> list[str]:
        """The mount points below the bed (each daemon's own tmpfs, while it runs)."""
        return mounts_below(self.base)


def mounts_below(base: str) -> list[str]:
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4].replace("\\040", " ") for line in handle]
    return [point for point in points if point.startswith(base + "/")]




def kill_and_wait(pid: int) -> None:
    """SIGKILL a daemon behind gpushare's back and wait until the kernel has ended it."""
    os.kill(pid, 9)
    for _ in range(1000):
        if not alive(pid):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} survived SIGKILL")


def wait_listening(daemon: subprocess.Popen, pipe_dir: str) -> None:
    """Wait until a daemon started here listens on its control socket: it renames the
    socket into place last, so the daemon is then started, as one gpushare started is."""
    control = os.path.join(pipe_dir, "control")
    deadline = time.monotonic() + 30
    while not os.path.exists(control):
        if daemon.poll() is not None:
            raise AssertionError(f"the stand-in exited with {daemon.returncode} before it "
                                 f"listened on {control}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the stand-in made no {control} within 30 s")
        time.sleep(0.005)


def standin_state(lease: MpsLease) -> dict:
    with open(os.path.join(lease.log_dir, "standin-state.json")) as handle:
        return json.load(handle)


def record(bed: Bed, key: str) -> dict:
    """The daemon's record as its file holds it, with ``jobs`` from ``<key>.jobs/``."""
    with open(os.path.join(bed.daemons_dir, key + ".json")) as handle:
        data = json.load(handle)
    data["jobs"] = {}
    jobs_dir = os.path.join(bed.daemons_dir, key + ".jobs")
    for name in sorted(os.listdir(jobs_dir)) if os.path.isdir(jobs_dir) else []:
        with open(os.path.join(jobs_dir, name)) as handle:
            data["jobs"][name] = {"share_percent": int(handle.read())}
    return data


def as_user(user, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", "-c", code], user=user.pw_uid, group=user.pw_gid,
                          extra_groups=[], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin"}, cwd="/")


# --------------------------------------------------------------------------- start / env


def test_acquire_starts_daemon_as_the_user_with_a_clean_environment(bed, users, monkeypatch):
    u1 = users[0]
    monkeypatch.setenv("GPUSHARE_TEST_SECRET", "must-not-leak")
    mgr = bed.manager()
    lease = mgr.acquire(job_id=11, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        mode="shared", share_percent=25)
    key = daemon_key("shared", u1.pw_uid, 11, [GPU0])
    assert lease.key == key
    assert lease.pipe_dir == os.path.join(bed.mps_dir, key, "pipe")
    assert lease.env == {
        "CUDA_MPS_PIPE_DIRECTORY": lease.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": lease.log_dir,
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G",
    }
    state = standin_state(lease)
    assert state["pid"] == lease.daemon_pid and alive(lease.daemon_pid)
    assert (state["uid"], state["gid"], state["groups"]) == (u1.pw_uid, u1.pw_gid, [])
    expected_env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CUDA_VISIBLE_DEVICES": GPU0.uuid,
        "CUDA_MPS_PIPE_DIRECTORY": lease.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": lease.log_dir,
    }
    assert state["env"] == expected_env  # nothing of ours leaks in
    assert state["default_active_thread_percentage"] == 25.0
    assert state["default_device_pinned_mem_limit"] == {"0": "20G"}
    for name in ("pipe", "log"):
        st = os.lstat(os.path.join(bed.mps_dir, key, name))
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (u1.pw_uid, u1.pw_gid, 0o700)
    for path in (bed.state_dir, bed.mps_dir, os.path.join(bed.mps_dir, key)):
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert MpsLease.from_record(json.loads(json.dumps(lease.to_record()))) == lease

    assert mgr.release(11) == [key]
    assert not alive(lease.daemon_pid)
    assert bed.entries() == []


def test_a_start_that_did_not_finish_is_done_again(bed, users):
    """A record that holds the job but names no daemon (a start that died before it knew
    the daemon's pid): acquire ends what runs in the daemon's directory and starts it
    again, instead of taking the job as set up."""
    u1 = users[0]
    mgr = bed.manager()
    first = mgr.acquire(job_id=21, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        mode="shared", share_percent=25)
    store = RecordStore(bed.daemons_dir, bed.mps_dir)
    with store.dir_fd() as mps_fd:
        rec = store.read(mps_fd, first.key)
        rec.daemon_pid = None
        store.write(mps_fd, rec)
    again = mgr.acquire(job_id=21, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        mode="shared", share_percent=25)
    assert again.daemon_pid and again.daemon_pid != first.daemon_pid
    assert alive(again.daemon_pid) and not alive(first.daemon_pid)
    assert mgr.release(21) == [first.key] and bed.entries() == []


def test_same_user_jobs_share_one_daemon_and_its_cap_follows_their_shares(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    leases = [mgr.acquire(job_id=j, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                          share_percent=share) for j, share in ((1, 25), (2, 25), (3, 30))]
    assert len({lease.daemon_pid for lease in leases}) == 1
    assert len({lease.pipe_dir for lease in leases}) == 1
    assert [lease.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for lease in leases] == \
        ["25", "25", "30"]
    assert leases[2].env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=24G"
    rec = record(bed, leases[0].key)
    assert sorted(rec["jobs"]) == ["1", "2", "3"]
    # The largest share: a client that drops its own setting gets no other job's share.
    state = standin_state(leases[0])
    assert state["default_active_thread_percentage"] == 30.0
    assert state["default_device_pinned_mem_limit"] == {"0": "24G"}
    assert record(bed, leases[0].key)["caps"] == {"percent": 30, "mem": {"0": "24G"}}
    commands = len(state["commands"])

    assert mgr.release(2) == []  # the largest share stays: the daemon is not asked
    assert alive(leases[0].daemon_pid)
    assert sorted(record(bed, leases[0].key)["jobs"]) == ["1", "3"]
    assert len(standin_state(leases[0])["commands"]) == commands
    assert mgr.release(3) == []  # the largest share goes: the cap comes down to 25%
    state = standin_state(leases[0])
    assert state["default_active_thread_percentage"] == 25.0
    assert state["default_device_pinned_mem_limit"] == {"0": "20G"}
    assert mgr.release(1) == [leases[0].key]
    assert not alive(leases[0].daemon_pid)
    assert bed.entries() == []


def test_a_join_with_caps_later_leaves_the_stricter_caps_until_update_caps(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    first = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25, caps_later=True)
    # A daemon the call starts is capped before it returns, caps_later or not.
    assert standin_state(first)["default_active_thread_percentage"] == 25.0
    joined = mgr.acquire(job_id=2, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                         share_percent=30, caps_later=True)
    assert joined.daemon_pid == first.daemon_pid
    assert sorted(record(bed, first.key)["jobs"]) == ["1", "2"]
    state = standin_state(first)
    assert state["default_active_thread_percentage"] == 25.0  # not raised yet
    assert state["default_device_pinned_mem_limit"] == {"0": "20G"}
    mgr.update_caps(first.key)
    state = standin_state(first)
    assert state["default_active_thread_percentage"] == 30.0
    assert state["default_device_pinned_mem_limit"] == {"0": "24G"}
    assert record(bed, first.key)["caps"]["percent"] == 30
    commands = len(state["commands"])
    mgr.update_caps(first.key)  # nothing changed: the daemon is not asked again
    assert len(standin_state(first)["commands"]) == commands
    # A join with a share no larger than the cap changes nothing on the daemon.
    mgr.acquire(job_id=3, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=30,
                caps_later=True)
    mgr.update_caps(first.key)
    assert len(standin_state(first)["commands"]) == commands
    mgr.update_caps("u1-GPU-gone")  # a daemon already gone: nothing to do, nothing raised
    assert mgr.release(1) == [] and mgr.release(2) == []
    assert mgr.release(3) == [first.key]
    assert bed.entries() == []


def test_update_caps_never_raises(bed, monkeypatch, caplog):
    mgr = bed.manager()

    def unreadable(*_args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(mgr.store, "read", unreadable)
    mgr.update_caps("u1-GPU-x")  # the job's tasks may already run: logged, not raised
    assert "cannot update the caps of MPS daemon u1-GPU-x" in caplog.text


def test_cap_is_applied_to_running_servers_too(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    first = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=20)
    started = subprocess.run([bed.standin.program], input=f"start_server -uid {u1.pw_uid}\n",
                             env=first.env, user=u1.pw_uid, group=u1.pw_gid,
                             capture_output=True, text=True, timeout=30, check=True)
    server_pid = started.stdout.strip()
    mgr.acquire(job_id=2, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=30)
    server = standin_state(first)["servers"][server_pid]
    assert server["active_thread_percentage"] == 30.0
    assert server["pinned"] == {"0": "24G"}
    mgr.release(1)
    mgr.release(2)
    assert not alive(int(server_pid))
    assert bed.entries() == []


def test_two_users_on_one_gpu_get_separate_daemons_they_cannot_reach(bed, users):
    u1, u2 = users
    mgr = bed.manager()
    a = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=50)
    b = mgr.acquire(job_id=2, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0], share_percent=50)
    assert a.daemon_pid != b.daemon_pid
    assert a.pipe_dir != b.pipe_dir
    assert standin_state(a)["uid"] == u1.pw_uid
    assert standin_state(b)["uid"] == u2.pw_uid

    listing = as_user(u1, f"import os; print(os.listdir({b.pipe_dir!r}))")
    assert listing.returncode != 0 and "PermissionError" in listing.stderr
    connect = as_user(u1, (
        "import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
        f"s.connect({os.path.join(b.pipe_dir, 'control')!r})"))
    assert connect.returncode != 0 and "PermissionError" in connect.stderr
    own = as_user(u2, f"import os; print(sorted(os.listdir({b.pipe_dir!r})))")
    assert own.returncode == 0 and "control" in own.stdout

    assert mgr.release(1) == [a.key]
    assert alive(b.daemon_pid)
    assert mgr.release(2) == [b.key]
    assert bed.entries() == []


def test_private_mode_one_daemon_over_the_jobs_gpus(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(job_id=77, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0, GPU1],
                        mode="private")
    assert lease.key == "job77"
    assert lease.env == {
        "CUDA_MPS_PIPE_DIRECTORY": lease.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": lease.log_dir,
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    state = standin_state(lease)
    assert state["env"]["CUDA_VISIBLE_DEVICES"] == f"{GPU0.uuid},{GPU1.uuid}"
    assert state["default_device_pinned_mem_limit"] == {}
    # A private daemon's own default is its job's limit (its clients need no variable).
    other = mgr.acquire(job_id=78, uid=u1.pw_uid, gid=u1.pw_gid, devices=[MIG],
                        mode="private", share_percent=50)
    assert other.daemon_pid != lease.daemon_pid
    assert standin_state(other)["default_active_thread_percentage"] == 50.0
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in other.env
    assert mgr.release(77) == ["job77"]
    assert mgr.release(78) == ["job78"]
    assert bed.entries() == []


@pytest.mark.parametrize("setting, expected", [
    ("16G", "0=10G"),        # a fixed size is capped at the slice's memory
    ("4G", "0=4G"),
    ("proportional", "0=2560M"),
    ("off", None),
])
def test_pinned_memory_limit_setting(bed, users, setting, expected):
    u1 = users[0]
    mgr = bed.manager(mem_limit=setting)
    lease = mgr.acquire(job_id=5, uid=u1.pw_uid, gid=u1.pw_gid, devices=[MIG],
                        share_percent=25)
    assert lease.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == expected
    mgr.release(5)


def test_acquire_and_release_are_idempotent(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    assert mgr.release(999) == []                       # epilog without prolog
    first = mgr.acquire(job_id=3, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=40)
    again = mgr.acquire(job_id=3, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=40)
    assert again == first
    assert list(record(bed, first.key)["jobs"]) == ["3"]
    assert mgr.release(3) == [first.key]
    assert mgr.release(3) == []                         # epilog twice
    assert bed.entries() == []


def test_a_daemon_recorded_by_the_release_before_keeps_serving_after_an_upgrade(bed, users):
    """The record of a running daemon as earlier releases wrote it (version 1: its jobs in
    the record, no ``stop_failed``, and before that no ``dirs_made``): the next job joins
    it, the record is written back as version 2, the last job stops it."""
    u1 = users[0]
    mgr = bed.manager()
    first = mgr.acquire(job_id=31, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    before = record(bed, first.key)
    for field in ("stop_failed", "dirs_made"):
        del before[field]
    before["version"] = 1
    shutil.rmtree(os.path.join(bed.daemons_dir, first.key + ".jobs"))
    with open(os.path.join(bed.daemons_dir, first.key + ".json"), "w") as handle:
        json.dump(before, handle, indent=1, sort_keys=True)
    second = mgr.acquire(job_id=32, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                         share_percent=30)
    assert second.daemon_pid == first.daemon_pid and alive(first.daemon_pid)
    after = record(bed, first.key)
    assert after["version"] == 2 and after["jobs"] == {"31": {"share_percent": 25},
                                                       "32": {"share_percent": 30}}
    assert after["caps"] == {"percent": 30, "mem": {"0": "24G"}}
    assert standin_state(first)["default_active_thread_percentage"] == 30.0
    assert mgr.release(31) == [] and mgr.release(32) == [first.key]
    assert not alive(first.daemon_pid) and bed.entries() == []


def test_records_an_earlier_release_kept_beside_the_users_directories_are_moved(bed, users):
    """Earlier releases kept the records, job references, locks and join tickets in
    ``<state_dir>/mps``, among the users' directories. After an upgrade the daemon of a
    running job keeps serving: the next job joins it, its record moves to root's
    ``<state_dir>/daemons``, nothing of root's stays on the users' mount, and the last
    job stops it."""
    u1 = users[0]
    first = bed.manager().acquire(job_id=41, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                                  share_percent=25)
    for name in (first.key + ".json", first.key + ".jobs", first.key + ".lock"):
        os.rename(os.path.join(bed.daemons_dir, name), os.path.join(bed.mps_dir, name))
    os.mkdir(os.path.join(bed.mps_dir, "tickets"), 0o700)
    with open(os.path.join(bed.mps_dir, "tickets", "u1.g1.s25"), "w") as handle:
        handle.write(f"gpushare-ticket 1\nkey {first.key}\n")
    assert os.listdir(bed.daemons_dir) == []
    second = bed.manager().acquire(job_id=42, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                                   share_percent=25)
    assert second.daemon_pid == first.daemon_pid and alive(first.daemon_pid)
    assert sorted(record(bed, first.key)["jobs"]) == ["41", "42"]
    assert sorted(os.listdir(bed.mps_dir)) == [first.key]  # the users' directories only
    assert bed.manager().release(41) == [] and bed.manager().release(42) == [first.key]
    assert not alive(first.daemon_pid) and bed.entries() == []


def test_a_release_after_an_upgrade_finds_the_record_an_earlier_release_kept(bed, users):
    """The epilog of a job set up before the upgrade (its record still among the users'
    directories) stops its daemon."""
    u1 = users[0]
    lease = bed.manager().acquire(job_id=43, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                                  share_percent=25)
    for name in (lease.key + ".json", lease.key + ".jobs"):
        os.rename(os.path.join(bed.daemons_dir, name), os.path.join(bed.mps_dir, name))
    assert bed.manager().release(43) == [lease.key]
    assert not alive(lease.daemon_pid) and bed.entries() == []


@pytest.fixture
def users_mount(bed):
    """The users' MPS directories on a small tmpfs of their own, as docs/admin.md says."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    os.makedirs(bed.mps_dir, 0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m,nr_inodes=256",
                    "gpushare-test-users", bed.mps_dir], check=True)
    try:
        yield bed.mps_dir
    finally:
        subprocess.run(["umount", "-l", bed.mps_dir], check=False)


def test_with_shared_space_a_user_who_fills_the_users_mount_fails_starts_never_drains(
        bed, users, users_mount):
    """``mps_space=shared`` (a site whose job containers see no later mount): one user's
    daemon directory fills the users' mount: another user's daemon cannot start, and that is
    a user's doing (MpsUserError: the job fails, the node stays in service), never
    "state_dir= full". Root's records are on state_dir='s own file system, so the daemon
    already running goes on serving its user, and once the space is freed the next start
    works. (The default, a tmpfs per daemon, keeps the other user's start working:
    test_mps_space.py.)"""
    from gpushare.node import faults

    u1, u2 = users
    mgr = bed.manager(mps_space="shared")
    running = mgr.acquire(job_id=51, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                          share_percent=25)
    filler = os.path.join(running.env["CUDA_MPS_LOG_DIRECTORY"], "fill")
    with open(filler, "wb") as handle, pytest.raises(OSError):
        handle.write(b"\0" * (2 << 20))
        handle.flush()
    with pytest.raises(MpsUserError, match=r"users' MPS directories .* are full") as caught:
        mgr.acquire(job_id=52, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0], share_percent=25)
    fault = faults.classify("job_prolog", caught.value, bed.state_dir)
    assert fault.who == faults.USER and fault.brief == ""
    joined = mgr.acquire(job_id=53, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                         share_percent=25)
    assert joined.daemon_pid == running.daemon_pid
    assert sorted(record(bed, running.key)["jobs"]) == ["51", "53"]
    os.unlink(filler)
    other = mgr.acquire(job_id=52, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0],
                        share_percent=25)
    assert alive(other.daemon_pid)
    assert mgr.release(51) == [] and mgr.release(53) == [running.key]
    assert mgr.release(52) == [other.key]
    assert bed.entries() == []


def test_release_reads_only_the_daemon_the_lease_names(bed, users, monkeypatch):
    u1, u2 = users
    mgr = bed.manager()
    mine = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=25)
    other = mgr.acquire(job_id=2, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0],
                        share_percent=25)
    scans = []
    real_scan = RecordStore.keys_of_job
    monkeypatch.setattr(RecordStore, "keys_of_job",
                        lambda self, fd, job: scans.append(job) or real_scan(self, fd, job))
    assert mgr.release(1, hint=mine.key) == [mine.key]
    assert scans == []                                   # the hint was enough
    # A hint that does not hold the job (stale, or made up) falls back to the scan.
    for hint in (mine.key, "../etc", "u0-GPU-nothing"):
        assert mgr.release(2, hint=hint) in ([other.key], [])
    assert scans == [2, 2, 2]
    assert bed.entries() == []


def test_bad_requests_are_refused_with_a_reason(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    cases = [
        (dict(uid=u1.pw_uid, gid=u1.pw_gid, devices=[]), "without any GPU"),
        (dict(uid=u1.pw_uid, gid=u1.pw_gid, devices=[MpsDevice("../etc")]), "not a GPU"),
        (dict(uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=0), "1..100"),
        (dict(uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], mode="x"), "shared or private"),
    ]
    for kwargs, words in cases:
        with pytest.raises(MpsError, match=words):
            mgr.acquire(job_id=1, **kwargs)
    assert bed.entries() == []


# --------------------------------------------------------------------------- concurrency


def _acquire_job(args):
    state_dir, program, job_id, uid, gid = args
    mgr = MpsManager(PluginConfig(state_dir=state_dir, mps_control=program, timeout=5.0),
                     lock_timeout=120)
    lease = mgr.acquire(job_id=job_id, uid=uid, gid=gid, devices=[GPU0], share_percent=10)
    return lease.daemon_pid


def _release_job(args):
    state_dir, program, job_id = args
    mgr = MpsManager(PluginConfig(state_dir=state_dir, mps_control=program, timeout=5.0),
                     lock_timeout=120)
    return mgr.release(job_id)


def test_concurrent_prologs_and_epilogs_keep_counts_right(bed, users):
    u1, u2 = users
    jobs = [(j, u1 if j % 3 else u2) for j in range(1, 19)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8) as pool:
        pids = pool.map(_acquire_job, [(bed.state_dir, bed.standin.program, j, u.pw_uid,
                                        u.pw_gid) for j, u in jobs])
        by_user = {}
        for (_j, u), pid in zip(jobs, pids):
            by_user.setdefault(u.pw_uid, set()).add(pid)
        assert {uid: len(p) for uid, p in by_user.items()} == {u1.pw_uid: 1, u2.pw_uid: 1}
        for u in (u1, u2):
            rec = record(bed, daemon_key("shared", u.pw_uid, 0, [GPU0]))
            assert sorted(map(int, rec["jobs"])) == [j for j, ju in jobs if ju is u]
        assert len(bed.standin.processes()) == 2
        stopped = pool.map(_release_job, [(bed.state_dir, bed.standin.program, j)
                                          for j, _ in jobs])
    assert sorted(k for keys in stopped for k in keys) == sorted(
        daemon_key("shared", u.pw_uid, 0, [GPU0]) for u in (u1, u2))
    assert bed.standin.processes() == []
    assert bed.entries() == []


def test_interleaved_acquire_and_release_from_many_processes(bed, users):
    u1 = users[0]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(6) as pool:
        results = []
        for round_ in range(3):
            ids = [round_ * 100 + j for j in range(6)]
            results.append(pool.map_async(_acquire_job, [
                (bed.state_dir, bed.standin.program, j, u1.pw_uid, u1.pw_gid) for j in ids]))
            if round_:
                prev = [(round_ - 1) * 100 + j for j in range(6)]
                results.append(pool.map_async(_release_job, [
                    (bed.state_dir, bed.standin.program, j) for j in prev]))
        for result in results:
            result.get(timeout=300)
        rec = record(bed, daemon_key("shared", u1.pw_uid, 0, [GPU0]))
        live = sorted(map(int, rec["jobs"]))
        assert set(live) >= {200 + j for j in range(6)}
        pool.map(_release_job, [(bed.state_dir, bed.standin.program, j) for j in live])
    assert bed.standin.processes() == []
    assert bed.entries() == []


# --------------------------------------------------------------------------- stale state


def test_reap_stale_drops_vanished_jobs_and_stops_unused_daemons(bed, users):
    u1, u2 = users
    mgr = bed.manager()
    a1 = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=20)
    mgr.acquire(job_id=2, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=20)
    b = mgr.acquire(job_id=3, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0], share_percent=20)
    # a fresh manager, as after a slurmd restart: everything comes from the state dir
    fresh = bed.manager()
    assert fresh.reap_stale(lambda job_id: job_id == 2) == [b.key]
    assert not alive(b.daemon_pid) and alive(a1.daemon_pid)
    assert list(record(bed, a1.key)["jobs"]) == ["2"]
    assert fresh.reap_stale(lambda job_id: False) == [a1.key]
    assert not alive(a1.daemon_pid)
    assert bed.entries() == []


def test_a_daemon_that_died_is_restarted_for_the_next_job_and_reaped_cleanly(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    first = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=20)
    kill_and_wait(first.daemon_pid)
    second = mgr.acquire(job_id=2, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                         share_percent=20)
    assert second.daemon_pid != first.daemon_pid and alive(second.daemon_pid)
    assert sorted(record(bed, first.key)["jobs"]) == ["1", "2"]
    kill_and_wait(second.daemon_pid)
    assert mgr.reap_stale(lambda job_id: False) == [first.key]
    assert bed.entries() == []


def test_leftover_directory_without_record_is_removed_by_reap(bed, users):
    os.makedirs(os.path.join(bed.mps_dir, "u5-GPU-x", "pipe"), 0o755)
    os.makedirs(bed.daemons_dir)
    open(os.path.join(bed.daemons_dir, "u5-GPU-x.lock"), "w").close()
    assert bed.manager().reap_stale(lambda job_id: True) == []
    assert bed.entries() == []


def test_release_never_signals_a_process_that_is_not_the_daemon(bed, users):
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=20)
    # A process of the same user with the daemon's pipe directory, but another program,
    # recorded as the daemon (a forged or reused pid): it must survive the epilog.
    bystander = subprocess.Popen(["/bin/sleep", "60"], env=lease.env, user=u1.pw_uid,
                                 group=u1.pw_gid)
    try:
        path = os.path.join(bed.daemons_dir, lease.key + ".json")
        rec = record(bed, lease.key)
        rec["daemon_pid"] = bystander.pid
        with open(path, "w") as handle:
            json.dump(rec, handle)
        assert mgr.release(1) == [lease.key]
        assert bystander.poll() is None
        assert not alive(lease.daemon_pid)       # found by uid, program and pipe dir
    finally:
        bystander.kill()
        bystander.wait()
    assert bed.entries() == []


# --------------------------------------------------------------------------- faults


def test_missing_program(bed, users):
    u1 = users[0]
    mgr = bed.manager(mps_control=os.path.join(bed.standin.bindir, "absent"))
    with pytest.raises(MpsError, match=r"absent does not exist; install it or fix the path"):
        mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])
    assert bed.entries() == []


@pytest.mark.parametrize("fault, words", [
    ("die_start", r"exited with status 1: An error occurred while starting"),
    ("hang_start", r"no answer within 2 s"),
    ("die_after_start", r"created no control socket .* within 2 s"),
    ("hang_client", r"control command 'set_default_active_thread_percentage 25' failed: "
                    r".*no answer within 2 s"),
])
def test_start_faults_give_a_clear_error_and_leave_nothing(bed, users, fault, words):
    u1 = users[0]
    bed.standin.set_faults(fault)
    mgr = bed.manager()
    with pytest.raises(MpsError, match=words) as err:
        mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                    share_percent=25)
    assert "GPU 0" in str(err.value) and GPU0.uuid in str(err.value)
    # The node's fault: root's probe on the same GPU fails the same way.
    assert not isinstance(err.value, MpsUserError)
    assert "root's probe on the same GPUs failed too" in str(err.value)
    assert bed.standin.processes() == []
    assert bed.entries() == []
    assert not [name for name in os.listdir(bed.daemons_dir) if name.startswith(".probe")]
    # The drain reason: the cause first, within what `sinfo -R` shows.
    assert err.value.brief.startswith(("MPS start failed: ", "MPS ")), err.value.brief


def test_a_user_who_chmods_their_pipe_directory_during_a_start_fails_only_their_job(
        bed, users, monkeypatch):
    """The daemon's user makes its pipe directory unusable while it starts (``chmod 0``):
    the start fails as the user's doing (MpsUserError naming the change), and the node is
    not blamed; the next start of the same user works."""
    from gpushare.node.mps import userdirs

    u1 = users[0]
    made = userdirs.UserDirs.make

    def make_then_chmod(self, rec):
        made(self, rec)
        os.chmod(os.path.join(self.path(rec.key), "pipe"), 0)  # what the user may do

    monkeypatch.setattr(userdirs.UserDirs, "make", make_then_chmod)
    mgr = bed.manager()
    with pytest.raises(MpsUserError, match=r"pipe has mode 0000, not 0700, which only its "
                                           r"user can do") as err:
        mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=25)
    assert "its user changed its directories" in err.value.brief
    assert bed.standin.processes() == [] and bed.entries() == []
    monkeypatch.setattr(userdirs.UserDirs, "make", made)
    lease = mgr.acquire(job_id=2, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    assert alive(lease.daemon_pid) and mgr.release(2) == [lease.key]
    assert bed.entries() == []


def test_a_user_who_kills_their_daemon_during_a_start_fails_only_their_job(
        bed, users, monkeypatch):
    """The daemon's user SIGKILLs their own MPS processes while it starts (``pkill -u``):
    the start fails, root's probe on the same GPU works, so the job fails as the user's
    doing and the node stays in service. Nothing of the probe is left."""
    import signal

    from gpushare.node.mps import daemon as daemon_mod

    u1 = users[0]
    waited = daemon_mod.Daemons._wait_listening

    def user_kills_then_wait(self, rec, budget, failed):
        # Once the daemon listens (it forks nothing more), the user kills it: its socket
        # stays, and nothing answers there.
        control = os.path.join(rec.pipe_dir, "control")
        waited_until = time.monotonic() + 30
        while not os.path.exists(control) and time.monotonic() < waited_until:
            time.sleep(0.01)
        for pid in bed.standin.processes():
            if os.stat(f"/proc/{pid}").st_uid == rec.uid:
                os.kill(pid, signal.SIGKILL)  # as the user may, on their own processes
        return waited(self, rec, budget, failed)

    monkeypatch.setattr(daemon_mod.Daemons, "_wait_listening", user_kills_then_wait)
    mgr = bed.manager()
    with pytest.raises(MpsUserError, match=r"the same program started by root on GPU 0 "
                                           r"works") as err:
        mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=25)
    assert "not the node's fault" in err.value.brief
    assert bed.standin.processes() == [] and bed.entries() == []
    assert not [name for name in os.listdir(bed.daemons_dir) if name.startswith(".probe")]


def test_a_start_that_fails_keeps_the_daemon_logs_last_lines_in_the_message(bed, users):
    """The daemon's directory is removed with the failed start: no path to a deleted log."""
    u1 = users[0]
    bed.standin.set_faults("die_after_start")
    with pytest.raises(MpsError) as err:
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                              share_percent=25)
    assert "control.log ends: [stand-in] Failed to start the control daemon: no usable GPU" \
        in str(err.value)
    assert "see " not in str(err.value)
    assert err.value.brief.startswith("MPS start failed: no control socket within 2 s (")


def test_a_hung_start_is_a_short_drain_reason_with_the_cause_first(bed, users):
    from gpushare.node.drain import DRAIN_REASON_MAX, fit_reason

    u1 = users[0]
    bed.standin.set_faults("hang_start")
    with pytest.raises(MpsError) as err:
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                              share_percent=25)
    reason = fit_reason(err.value.brief)
    assert reason.startswith("gpushare: MPS start failed: no answer within 2 s, killed (")
    assert len(reason) <= DRAIN_REASON_MAX


def test_a_daemon_without_a_pid_file_is_found_through_proc(bed, users):
    u1 = users[0]
    bed.standin.set_faults("no_pid_file")
    mgr = bed.manager()
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    assert not os.path.exists(os.path.join(lease.pipe_dir, "nvidia-cuda-mps-control.pid"))
    assert lease.daemon_pid == standin_state(lease)["pid"]
    assert mgr.release(1) == [lease.key]
    assert not alive(lease.daemon_pid)
    assert bed.entries() == []


def test_the_daemon_is_not_mistaken_for_its_launchers_middle_process(monkeypatch):
    """The launcher forks twice; its middle process may still be alive for a moment when the
    control socket appears: the scan is taken again until only the daemon is left."""
    from types import SimpleNamespace

    from gpushare.node.mps.daemon import Daemons

    scans = iter([[100, 101], [100, 101], [101]])
    daemons = Daemons.__new__(Daemons)
    monkeypatch.setattr(daemons, "leftovers", lambda rec: next(scans), raising=False)
    monkeypatch.setattr(daemons, "is_ours", lambda pid, rec, only: True, raising=False)
    record = SimpleNamespace(key="k")
    assert daemons._find_pid(-1, record) == 101  # no pid file at a bad fd: through /proc


def test_without_pidfds_daemons_are_still_waited_for_and_stopped(bed, users, no_pidfds):
    """Kernels before 5.3 (RHEL 8's 4.18) have no pidfd_open: every wait polls instead."""
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    assert mgr.acquire(job_id=2, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                       share_percent=25).key == lease.key
    assert mgr.release(2) == []
    bed.standin.set_faults("ignore_quit")  # the wait for quit runs out, then SIGTERM
    assert mgr.release(1) == [lease.key]
    assert not alive(lease.daemon_pid)
    assert bed.entries() == []


@pytest.mark.parametrize("fault", ["ignore_quit", "ignore_term", "hang_client"])
def test_a_daemon_that_will_not_quit_is_ended_with_signals(bed, users, fault, caplog):
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    bed.standin.set_faults(fault)
    with caplog.at_level(logging.WARNING, logger="gpushare.mps"):
        assert mgr.release(1) == [lease.key]
    assert not alive(lease.daemon_pid)
    assert f"pid {lease.daemon_pid}" in caplog.text and "signals" in caplog.text
    expected_signal = "SIGKILL" if fault == "ignore_term" else "SIGTERM"
    assert expected_signal in caplog.text
    assert bed.entries() == []


def test_a_daemon_that_cannot_be_stopped_fails_release_naming_gpu_and_daemon(
        bed, users, monkeypatch):
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    bed.standin.set_faults("ignore_quit")
    # A process stuck in the kernel: neither gpushare's signals nor its cgroup's kill end it.
    monkeypatch.setattr(mgr.daemons, "signal_if_ours", lambda pid, rec, sig: None)
    monkeypatch.setattr(teardown, "_kill_all", lambda path, relative, pids: None)
    with pytest.raises(MpsError) as err:
        mgr.release(1)
    message = str(err.value)
    for part in (f"pid {lease.daemon_pid}", lease.pipe_dir, "GPU 0", GPU0.uuid, "drain"):
        assert part in message
    assert alive(lease.daemon_pid)
    assert record(bed, lease.key)["jobs"] == {}
    monkeypatch.undo()
    assert bed.manager().reap_stale(lambda job_id: False) == [lease.key]
    assert not alive(lease.daemon_pid)
    assert bed.entries() == []


# --------------------------------------------------------------------------- unsafe paths


def test_group_writable_program_is_refused(bed, users):
    u1 = users[0]
    os.chmod(bed.standin.program, 0o775)
    with pytest.raises(MpsError, match=r"nvidia-cuda-mps-control must be owned by root and "
                                       r"not writable by group or others.*chmod go-w"):
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])
    assert bed.entries() == []


def test_program_in_a_user_owned_directory_is_refused(bed, users):
    u1 = users[0]
    os.chown(bed.standin.bindir, u1.pw_uid, u1.pw_gid)
    with pytest.raises(MpsError, match=r"bin is not owned by root"):
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])


def test_program_owned_by_a_user_is_refused(bed, users):
    u1 = users[0]
    os.chown(bed.standin.program, u1.pw_uid, u1.pw_gid)
    with pytest.raises(MpsError, match=r"must be owned by root"):
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])


def test_symlink_planted_at_the_daemon_directory_is_refused(bed, users):
    u1 = users[0]
    target = os.path.join(bed.base, "elsewhere")
    os.mkdir(target)
    os.makedirs(bed.mps_dir)
    key = daemon_key("shared", u1.pw_uid, 1, [GPU0])
    os.symlink(target, os.path.join(bed.mps_dir, key))
    with pytest.raises(MpsError, match=r"symbolic link or not a directory; remove it"):
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])
    assert os.listdir(target) == []
    assert os.path.islink(os.path.join(bed.mps_dir, key))
    assert bed.standin.processes() == []


def test_user_owned_directory_planted_at_the_daemon_directory_is_refused(bed, users):
    u1 = users[0]
    key = daemon_key("shared", u1.pw_uid, 1, [GPU0])
    planted = os.path.join(bed.mps_dir, key)
    os.makedirs(planted)
    os.chown(planted, u1.pw_uid, u1.pw_gid)
    with pytest.raises(MpsError, match=r"is not owned by root .*remove it"):
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])
    assert os.path.isdir(planted)


@pytest.mark.parametrize("name", ["daemons", "mps"])
def test_state_directory_writable_by_a_user_is_refused(bed, users, name):
    """Root's records and the users' directory above their key directories are root's."""
    u1 = users[0]
    path = os.path.join(bed.state_dir, name)
    os.makedirs(path)
    os.chown(path, u1.pw_uid, u1.pw_gid)
    with pytest.raises(MpsError,
                       match=rf"state directory refused: .*{name} is not owned by root") as err:
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])
    assert not isinstance(err.value, MpsUserError)  # the node's set-up, not the user's doing


def test_a_join_through_an_unsafe_users_directory_is_the_nodes_fault(bed, users):
    """Joining a running daemon checks its control socket through the users' directory;
    when that directory itself is no longer root's, the node is at fault (MpsError), not
    the job's user, who can only change what is below their key directory."""
    u1 = users[0]
    mgr = bed.manager()
    first = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    os.chown(bed.mps_dir, u1.pw_uid, u1.pw_gid)
    try:
        with pytest.raises(MpsError, match=r"state directory refused: .*not owned by root") \
                as err:
            mgr.acquire(job_id=2, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
        assert not isinstance(err.value, MpsUserError)
    finally:
        os.chown(bed.mps_dir, 0, 0)
    assert sorted(record(bed, first.key)["jobs"]) == ["1"]
    assert mgr.release(1) == [first.key] and bed.entries() == []


def test_state_directory_reached_through_a_symlink_is_refused(bed, users):
    u1 = users[0]
    real = os.path.join(bed.base, "real-state")
    os.mkdir(real, 0o755)
    os.symlink(real, bed.state_dir)
    with pytest.raises(MpsError, match=r"state directory refused: .*symbolic link"):
        bed.manager().acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0])
    assert os.listdir(real) == []


# --------------------------------------------------------------------------- gpushare mps


def run_mps_command(bed: Bed, tmp_path, *args: str, capsys) -> tuple[int, str]:
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text(f"required /usr/lib64/slurm/spank_gpushare.so "
                         f"state_dir={bed.state_dir} mps_control={bed.standin.program} "
                         "timeout=2\n")
    capsys.readouterr()
    status = cli_main(["mps", "--plugstack", str(plugstack), *args])
    return status, capsys.readouterr().out


def write_job_record(bed: Bed, job_id: int, user) -> None:
    JobStore(bed.state_dir).write(JobRecord(job_id=job_id, uid=user.pw_uid, gid=user.pw_gid,
                                            node="n1", mode="shared", share_percent=25))


def test_gpushare_mps_lists_daemons_and_says_what_needs_an_administrator(
        bed, users, tmp_path, capsys):
    u1, u2 = users[:2]
    mgr = bed.manager()
    for job_id, user, device, share in ((1, u1, GPU0, 25), (2, u1, GPU0, 30),
                                        (3, u2, GPU0, 50), (4, u1, GPU1, 20)):
        mgr.acquire(job_id=job_id, uid=user.pw_uid, gid=user.pw_gid, devices=[device],
                    share_percent=share)
    for job_id, user in ((1, u1), (2, u1), (4, u1)):      # job 3's epilog "never ran"
        write_job_record(bed, job_id, user)
    gone = mgr.acquire(job_id=4, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU1],
                       share_percent=20)
    kill_and_wait(gone.daemon_pid)

    status, out = run_mps_command(bed, tmp_path, "--json", capsys=capsys)
    data = json.loads(out)
    assert status == data["status"] == 1
    views = {view["key"]: view for view in data["daemons"]}
    shared = views[daemon_key("shared", u1.pw_uid, 1, [GPU0])]
    assert (shared["status"], shared["user"], shared["jobs"]) == (
        "running", u1.pw_name, {"1": 25, "2": 30})
    assert shared["cap_percent"] == 30 and shared["mem_limits"] == {"0": "24G"}
    assert (shared["devices"], shared["device_uuids"]) == ([GPU0.label], [GPU0.uuid])
    assert shared["problems"] == []
    other = views[daemon_key("shared", u2.pw_uid, 3, [GPU0])]
    assert (other["status"], other["stale_jobs"]) == ("running", ["3"])
    assert "the daemon still counts job 3, gone without" in other["problems"][0]
    dead = views[daemon_key("shared", u1.pw_uid, 4, [GPU1])]
    assert dead["status"] == "not running"
    assert f"daemon pid {gone.daemon_pid} is gone while it serves job 4:" in dead["problems"][0]
    # While an epilog holds its lock (stopping it), the same daemon is changing, no alarm.
    with mgr.store.dir_fd() as mps_fd, mgr._locked(mps_fd, dead["key"]):
        status, out = run_mps_command(bed, tmp_path, "--json", capsys=capsys)
    changing = {view["key"]: view for view in json.loads(out)["daemons"]}[dead["key"]]
    assert (changing["status"], changing["problems"]) == ("changing", [])

    status, out = run_mps_command(bed, tmp_path, capsys=capsys)
    assert status == 1
    assert f"MPS daemons in {bed.daemons_dir} (settings: {tmp_path}/plugstack.conf): 3" in out
    assert re.search(rf"{shared['key']}\s+running\s+{shared['daemon_pid']}\s+\S+\s+"
                     rf"{u1.pw_name}\s+shared\s+.*1:25% 2:30%\s+30% 0=24G", out), out
    assert f"{other['key']}: the daemon still counts job 3" in out

    # --reap stops what only the vanished job held; the dead daemon's job still runs.
    status, out = run_mps_command(bed, tmp_path, "--reap", "--json", capsys=capsys)
    data = json.loads(out)
    assert data["reaped"] == [other["key"]] and status == 1
    assert not alive(other["daemon_pid"])
    assert sorted(view["key"] for view in data["daemons"]) == sorted([shared["key"],
                                                                      dead["key"]])
    for job_id in (1, 2, 4):
        mgr.release(job_id)
    status, out = run_mps_command(bed, tmp_path, capsys=capsys)
    assert status == 0 and out.rstrip().endswith(": 0")


def test_gpushare_mps_reports_failed_stops_unreadable_records_and_leftovers(
        bed, users, tmp_path, capsys):
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(job_id=7, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    rec = record(bed, lease.key)
    rec["stop_failed"] = "cannot stop MPS control daemon x: pids 1 survive SIGKILL"
    with open(os.path.join(bed.daemons_dir, lease.key + ".json"), "w") as handle:
        json.dump(rec, handle)
    with open(os.path.join(bed.daemons_dir, "u1-GPU-broken.json"), "w") as handle:
        handle.write("{not json")
    open(os.path.join(bed.daemons_dir, "u2-GPU-orphan.lock"), "w").close()
    # A key whose lock a prolog holds right now is changing, not a problem.
    with mgr.store.dir_fd() as mps_fd, mgr._locked(mps_fd, "u2-GPU-starting"):
        status, out = run_mps_command(bed, tmp_path, "--json", capsys=capsys)
    views = {view["key"]: view for view in json.loads(out)["daemons"]}
    assert (views["u2-GPU-starting"]["status"], views["u2-GPU-starting"]["problems"]) == (
        "changing", [])
    assert status == 1
    assert views[lease.key]["status"] == "stop failed"
    assert views[lease.key]["problems"][0].startswith(rec["stop_failed"] + "; once the GPU")
    assert views["u1-GPU-broken"]["status"] == "unreadable"
    assert "is unreadable" in views["u1-GPU-broken"]["problems"][0]
    assert views["u2-GPU-orphan"]["status"] == "no record"
    # Without root's view of /proc, liveness is reported unknown, never guessed.
    unknown = {view.key: view.status for view in inspect_daemons(bed.config(),
                                                                 check_processes=False)}
    assert unknown[lease.key] == "stop failed"
    os.unlink(os.path.join(bed.daemons_dir, "u1-GPU-broken.json"))
    rec.pop("stop_failed")
    with open(os.path.join(bed.daemons_dir, lease.key + ".json"), "w") as handle:
        json.dump(rec, handle)
    assert {view.key: view.status for view in inspect_daemons(
        bed.config(), check_processes=False)}[lease.key] == "unknown"
    mgr.release(7)
    status, out = run_mps_command(bed, tmp_path, "--reap", capsys=capsys)  # the orphan lock
    assert status == 0 and bed.entries() == []


def test_gpushare_mps_settings_errors(tmp_path, capsys):
    missing = tmp_path / "plugstack.conf"
    assert cli_main(["mps", "--plugstack", str(missing)]) == 2
    assert "cannot read" in capsys.readouterr().err
    missing.write_text("required /x/other.so\n")
    assert cli_main(["mps", "--plugstack", str(missing)]) == 2
    assert "has no line loading spank_gpushare.so" in capsys.readouterr().err
    missing.write_text("required /x/spank_gpushare.so timeout=never\n")
    assert cli_main(["mps", "--plugstack", str(missing)]) == 2
    assert "timeout='never' is invalid" in capsys.readouterr().err


def test_daemons_whose_state_was_removed_are_shown_and_stopped_by_reap(
        bed, users, tmp_path, capsys, caplog):
    u1, u2 = users[:2]
    mgr = bed.manager()
    kept = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                       share_percent=25)
    write_job_record(bed, 1, u1)
    lost = mgr.acquire(job_id=2, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0],
                       share_percent=25)
    gone = mgr.acquire(job_id=3, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU1],
                       share_percent=25)
    os.unlink(os.path.join(bed.daemons_dir, lost.key + ".json"))   # the record only
    subprocess.run(["umount", "-l", os.path.join(bed.mps_dir, gone.key)], check=True)
    shutil.rmtree(os.path.join(bed.mps_dir, gone.key))          # everything: no pipe left
    os.unlink(os.path.join(bed.daemons_dir, gone.key + ".json"))
    os.unlink(os.path.join(bed.daemons_dir, gone.key + ".lock"))
    assert alive(lost.daemon_pid) and alive(gone.daemon_pid)

    status, out = run_mps_command(bed, tmp_path, "--json", capsys=capsys)
    views = {view["key"]: view for view in json.loads(out)["daemons"]}
    assert status == 1 and views[kept.key]["status"] == "running"
    for lease in (lost, gone):
        assert views[lease.key]["status"] == "untracked"
        assert f"MPS processes {lease.daemon_pid} run in this daemon's directory" in \
            views[lease.key]["problems"][0]

    status, out = run_mps_command(bed, tmp_path, "--reap", "--json", capsys=capsys)
    data = json.loads(out)
    assert sorted(data["reaped"]) == sorted([lost.key, gone.key])
    assert status == 0 and [view["key"] for view in data["daemons"]] == [kept.key]
    assert not alive(lost.daemon_pid) and not alive(gone.daemon_pid)
    # The one whose pipe directory is still there quits when asked; the other gets signals.
    signalled = " ".join(r.getMessage() for r in caplog.records if "sending SIG" in
                         r.getMessage())
    assert gone.key in signalled and lost.key not in signalled
    assert alive(kept.daemon_pid)
    mgr.release(1)
    assert bed.entries() == []


def test_a_prolog_ends_what_runs_in_a_directory_without_record_before_removing_it(
        bed, users):
    u1 = users[0]
    mgr = bed.manager()
    lost = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                       share_percent=25)
    os.unlink(os.path.join(bed.daemons_dir, lost.key + ".json"))
    # The next job's prolog reaps first: the leftover directory's daemon is stopped, not
    # cut off from its pipe directory and left running.
    mgr.reap_stale(lambda job_id: True)
    assert not alive(lost.daemon_pid)
    assert bed.entries() == []


def test_reap_never_acts_for_root_in_a_users_directory_without_record(bed, users):
    """An MPS process of root's in a pipe directory a user holds is reported, not quit
    through that user's pipe (root's own daemon has a pipe directory of root's)."""
    mgr = bed.manager()
    mgr.reap_stale(lambda job_id: True)  # creates the state directories
    key = "u0-" + GPU0.uuid
    pipe_dir = os.path.join(bed.mps_dir, key, "pipe")
    os.makedirs(pipe_dir)
    os.chown(pipe_dir, users[0].pw_uid, users[0].pw_gid)
    env = {"PATH": "/usr/bin:/bin",
           "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
           "CUDA_MPS_LOG_DIRECTORY": os.path.join(bed.base, "root-log")}
    # In the foreground, as this test's child: its pid is the daemon's from exec on. -d
    # returns while the middle process of its fork, setsid, fork may not have forked yet: a
    # pid taken then, or the reap's scan of /proc, catches that process, which exits
    # unchecked while the daemon it forks runs on.
    daemon = subprocess.Popen([bed.standin.program, "-f"], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(daemon, pipe_dir)  # so a quit through the user's pipe would end it
        with pytest.raises(MpsError,
                           match=rf"pid {daemon.pid} runs MPS as root in .*{key}/pipe"):
            mgr.reap_stale(lambda job_id: True, strays=True)
        assert daemon.poll() is None
    finally:
        daemon.kill()
        daemon.wait(timeout=30)
        shutil.rmtree(os.path.join(bed.mps_dir, key), ignore_errors=True)


@pytest.mark.parametrize("dir_mode, record_mode", [(0o700, 0o644), (0o755, 0o600)])
def test_gpushare_mps_as_a_user_without_rights_says_what_it_needs(tmp_path, dir_mode,
                                                                   record_mode):
    """The plugin's state is root's (the records 0600 in a 0755 directory, as written now):
    a user is told to run the command as root, not shown a traceback."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make root's state and run as another user")
    state = tmp_path / "state"
    (state / "daemons").mkdir(parents=True)
    (state / "daemons" / "u1-GPU-x.json").write_text("{}")
    (state / "daemons" / "u1-GPU-x.json").chmod(record_mode)
    for path in (tmp_path, state):
        path.chmod(0o755)
    (state / "daemons").chmod(dir_mode)
    # The core, where the user can read it whatever the checkout's place (a 0700 parent).
    src = traversable_tmpdir()
    shutil.copytree(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src",
                                 "gpushare"), os.path.join(src, "gpushare"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "go+rX", src], check=True)
    try:
        result = subprocess.run(
            ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-m", "gpushare.cli", "mps",
             "--state-dir", str(state)], capture_output=True, text=True, timeout=60,
            env={"PYTHONPATH": src, "PATH": os.environ["PATH"]}, cwd="/")
    finally:
        shutil.rmtree(src, ignore_errors=True)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert f"cannot read the plugin's state in {state}" in result.stderr
    assert "run gpushare mps as root" in result.stderr


def test_a_state_dir_too_long_for_the_control_socket_is_named_at_once(bed, users, tmp_path):
    """The daemon could never listen on a socket path over 107 bytes: the start fails at
    once with what to change, instead of after the whole timeout."""
    u1 = users[0]
    deep = str(tmp_path / ("s" * 60))
    mgr = bed.manager(state_dir=deep)
    with pytest.raises(MpsError, match=r"too close to the 107 a Unix socket path may have; give "
                       r"plugstack.conf a state_dir= of at most \d+ characters") as err:
        mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=25)
    assert err.value.brief.startswith("MPS start failed: state_dir= too long")
    assert bed.standin.processes() == []  # no daemon was started to wait for
    assert not os.path.exists(os.path.join(deep, "mps", f"u{u1.pw_uid}-{GPU0.uuid}"))


def test_gpushare_mps_before_the_first_shared_job_reports_none(tmp_path, capsys):
    """A node whose prologs never ran has no state directory yet (only the first shared
    job's prolog makes it): the report and --reap find nothing, say why, and exit 0 without
    making the directory (a traceback here was a report that failed on every fresh node)."""
    state_dir = tmp_path / "run-gpushare"
    for extra in ((), ("--reap",), ("--json",)):
        status = cli_main(["mps", "--state-dir", str(state_dir), *extra])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        assert "Traceback" not in captured.err
        if extra == ("--json",):
            assert json.loads(captured.out)["daemons"] == []
        else:
            assert f"MPS daemons in {state_dir}/daemons" in captured.out
            assert ": 0" in captured.out
            assert f"{state_dir} does not exist" in captured.err
        assert not state_dir.exists()
