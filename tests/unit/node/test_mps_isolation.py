# SPDX-License-Identifier: GPL-2.0-or-later
"""A user's MPS daemon starts as a job's process would, whatever its starter's state; root
talks to it only through a socket of its user; root's own shared jobs get a daemon that no
one else can reach. Against the stand-in daemon, run for real."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import uuid

import pytest

from gpushare.common import proc
from gpushare.node.mps import MpsDevice, MpsError, MpsManager, MpsUserError, isolation, teardown
from gpushare.node.mps.record import DaemonRecord
from mps_standin.harness import StandinBed as Bed
from mps_standin.harness import ensure_users, unusable_reason
from mps_standin.harness import running as alive

REASON = unusable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

GPU0 = MpsDevice("GPU-11111111-2222-3333-4444-555555555555", 0, 80 << 30, "GPU 0")


@pytest.fixture(scope="module")
def users():
    return ensure_users()


@pytest.fixture
def cgroup_parent():
    """A cgroup v2 directory of this test's own, removed after it."""
    mount = isolation.cgroup_parent("auto")
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    parent = os.path.join(os.path.dirname(mount), f"gpushare-test-{uuid.uuid4().hex[:8]}")
    yield parent
    for dirpath, _dirs, _files in sorted(os.walk(parent), key=lambda e: -len(e[0])):
        os.rmdir(dirpath)


@pytest.fixture
def bed():
    made = Bed()
    yield made
    made.close()


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as handle:
        return dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)


def limits(pid: int) -> dict[str, tuple[str, str]]:
    with open(f"/proc/{pid}/limits") as handle:
        rows = handle.read().splitlines()[1:]
    return {row[:26].strip(): tuple(row[26:].split()[:2]) for row in rows}


def test_a_daemon_starts_as_a_job_would_not_as_its_starters_child(users, cgroup_parent):
    """Its starter (slurmd's worker) runs with oom_score_adj -1000 (or 500), signals
    blocked and ignored, umask 022 and a lowered open-files limit. The daemon (the
    stand-in, which sets umask 077 itself as NVIDIA's does, and waits in ppoll with the
    mask it started with) has none of it, runs in a cgroup of its own under mps_cgroup=,
    and its cgroup goes with it."""
    u1 = users[0]
    made = Bed(cgroup=cgroup_parent)
    script = f"""
import os, resource, signal, sys
sys.path[:0] = {[p for p in sys.path if p]!r}
from gpushare.node.config import PluginConfig
from gpushare.node.mps import MpsDevice, MpsManager
try:  # slurmd's usual; where root may not lower it (a container), raised instead
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("-1000")
except PermissionError:
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("500")
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2, signal.SIGTERM])
os.umask(0o022)
resource.setrlimit(resource.RLIMIT_NOFILE,
                   (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
config = PluginConfig(state_dir={made.config.state_dir!r}, mps_control={made.standin.program!r},
                      timeout=2.0, mps_cgroup={cgroup_parent!r})
lease = MpsManager(config, lock_timeout=60).acquire(
    1, {u1.pw_uid}, {u1.pw_gid}, [MpsDevice({GPU0.uuid!r}, 0, 80 << 30, "GPU 0")],
    share_percent=25)
print(lease.daemon_pid, lease.key)
"""
    try:
        started = subprocess.run([sys.executable, "-c", script], check=True,
                                 capture_output=True, text=True, timeout=60)
        pid_text, key = started.stdout.split()
        pid = int(pid_text)
        seen = status(pid)
        with open(f"/proc/{pid}/oom_score_adj") as handle:
            assert handle.read().strip() == "0"
        assert int(seen["SigBlk"], 16) == 0      # the daemon waits with its starter's mask
        assert int(seen["SigIgn"], 16) == 0
        assert seen["Umask"] == "0077"
        assert seen["Uid"].split()[0] == str(u1.pw_uid)
        # PID 1's limit; where root may not raise a hard limit (a container), PID 1's
        # soft one within the hard limit the starter has.
        node_soft, node_hard = (int(n) for n in limits(1)["Max open files"])
        ceiling = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        assert tuple(int(n) for n in limits(pid)["Max open files"]) in (
            (node_soft, node_hard), (min(node_soft, ceiling), ceiling))
        assert isolation.cgroup_of(pid).endswith(
            "/" + os.path.basename(cgroup_parent) + "/" + key)
        with open(os.path.join(cgroup_parent, key, "cgroup.procs")) as handle:
            assert str(pid) in handle.read().split()
        assert made.manager().release(1) == [key]
        assert not alive(pid)
        assert not os.path.exists(os.path.join(cgroup_parent, key))
    finally:
        made.close()


def test_node_rlimits_are_pid_1s():
    mine = {res: soft for res, soft, _hard in isolation.node_rlimits()}

    with open("/proc/1/limits") as handle:
        row = next(line for line in handle if line.startswith("Max open files"))
    soft, hard = row[26:].split()[:2]
    assert mine[resource.RLIMIT_NOFILE] == (
        resource.RLIM_INFINITY if soft == "unlimited" else int(soft))
    assert (resource.RLIMIT_NOFILE, mine[resource.RLIMIT_NOFILE],
            resource.RLIM_INFINITY if hard == "unlimited" else int(hard)
            ) in isolation.node_rlimits()


def test_a_cgroup_that_cannot_be_made_fails_the_start_naming_the_setting(bed, users):
    u1 = users[0]
    config = bed.config._replace(mps_cgroup=os.path.join(bed.base, "not-a-cgroup"))
    with pytest.raises(MpsError, match=r"no cgroup for its daemon under mps_cgroup=.*"
                                       r"not in a cgroup v2 hierarchy") as err:
        MpsManager(config, lock_timeout=60).acquire(1, u1.pw_uid, u1.pw_gid, [GPU0])
    assert not isinstance(err.value, MpsUserError)


def _plant(pipe_dir: str, kind: str, uid: int, gid: int) -> socket.socket | None:
    path = os.path.join(pipe_dir, "control")
    os.rename(path, path + ".moved")
    held = None
    if kind == "file":
        with open(path, "w") as handle:
            handle.write("x")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        os.symlink(path + ".moved", path)
    else:  # a socket of the user that never answers
        held = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        held.bind(path)
        held.listen(1)
    os.lchown(path, uid, gid)
    return held


@pytest.mark.parametrize("kind, words", [
    ("file", "is a regular file"), ("fifo", "is a FIFO"), ("symlink", "is a symbolic link")])
def test_a_planted_control_fails_the_users_next_job_and_the_daemon_still_stops(
        bed, users, kind, words):
    """Root never talks through a ``control`` that is not a socket of the daemon's user:
    the user's next job on it gets an MpsUserError (its job fails, the node stays), and
    the daemon is still stopped, with signals, when its last job ends."""
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(1, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
    _plant(lease.pipe_dir, kind, u1.pw_uid, u1.pw_gid)
    with pytest.raises(MpsUserError, match=rf"control {words}, not the daemon's socket"):
        mgr.acquire(2, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
    assert mgr.release(1) == [lease.key]
    assert not alive(lease.daemon_pid)


def test_a_control_socket_of_another_user_is_not_the_daemons(bed, users):
    u1, u2 = users[:2]
    mgr = bed.manager()
    lease = mgr.acquire(1, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
    held = _plant(lease.pipe_dir, "socket", u2.pw_uid, u2.pw_gid)
    try:
        with pytest.raises(MpsUserError, match=rf"is a socket of uid {u2.pw_uid}"):
            mgr.acquire(2, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
    finally:
        assert held is not None
        held.close()
    assert mgr.release(1) == [lease.key]


def test_signals_go_only_to_the_process_checked(bed, users, monkeypatch):
    """The pid is held through a pidfd from before the check: a process that is not the
    daemon (here: the check says so) gets no signal, one that is gets it."""
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(1, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
    rec = DaemonRecord(lease.key, "shared", u1.pw_uid, u1.pw_gid, (GPU0,), lease.pipe_dir,
                       lease.log_dir)
    bystander = subprocess.Popen(["/bin/sleep", "60"], user=u1.pw_uid, group=u1.pw_gid)
    try:
        mgr.daemons.signal_if_ours(bystander.pid, rec, signal.SIGKILL)
        assert bystander.poll() is None
        mgr.daemons.signal_if_ours(lease.daemon_pid, rec, signal.SIGKILL)
        proc.wait_for_exit(lease.daemon_pid, 10)
        assert not alive(lease.daemon_pid)
    finally:
        bystander.kill()
        bystander.wait()
    mgr.release(1)


def test_roots_shared_job_gets_a_daemon_no_one_else_can_reach(bed, users):
    """root's daemon runs as root with pipe and log directories of root's alone (0700):
    another user can neither list them nor reach its socket."""
    u1 = users[0]
    mgr = bed.manager()
    lease = mgr.acquire(7, 0, 0, [GPU0], share_percent=25)
    try:
        assert status(lease.daemon_pid)["Uid"].split()[0] == "0"
        for path in (lease.pipe_dir, lease.log_dir):
            info = os.lstat(path)
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
        probe = subprocess.run(
            ["/bin/ls", lease.pipe_dir], user=u1.pw_uid, group=u1.pw_gid, extra_groups=[],
            capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0 and re.search("Permission denied", probe.stderr)
        assert mgr.acquire(8, 0, 0, [GPU0], share_percent=50).key == lease.key
        other = mgr.acquire(9, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
        assert other.key != lease.key and other.daemon_pid != lease.daemon_pid
        assert mgr.release(9) == [other.key]
        assert mgr.release(8) == []
    finally:
        assert mgr.release(7) == [lease.key]
    assert not alive(lease.daemon_pid)


def test_gpushare_mps_shows_where_each_daemon_runs(users, cgroup_parent):
    from gpushare.admin.mps_report import inspect_daemons
    from gpushare.cli.mps import format_views

    u1 = users[0]
    made = Bed(cgroup=cgroup_parent)
    try:
        mgr = made.manager()
        lease = mgr.acquire(1, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
        (view,) = inspect_daemons(made.config)
        assert view.status == "running"
        assert view.cgroup == isolation.cgroup_of(lease.daemon_pid)
        assert view.cgroup.endswith(f"/{os.path.basename(cgroup_parent)}/{lease.key}")
        table = format_views([view], made.config.state_dir, "test").splitlines()
        assert table[2].split()[-1] == "CGROUP" and table[3].split()[-1] == view.cgroup
        assert view.to_dict()["cgroup"] == view.cgroup
        assert mgr.release(1) == [lease.key]
    finally:
        made.close()


def test_auto_without_a_cgroup_root_may_make_leaves_the_daemon_where_it_is(tmp_path,
                                                                          monkeypatch):
    """A container's cgroup hierarchy may be read-only: ``auto`` then means none, while a
    directory the admin named must work."""
    monkeypatch.setattr(isolation, "cgroup_parent",
                        lambda setting, proc_root="/proc": str(tmp_path / "not-a-cgroup"))
    assert isolation.daemon_cgroup("auto", "k") is None
    with pytest.raises(OSError, match="not in a cgroup v2 hierarchy"):
        isolation.daemon_cgroup(str(tmp_path / "not-a-cgroup"), "k")


# ------------------------------------------------------------- the daemon's cgroup ends

def taken_over(key_cgroup: str, user) -> subprocess.Popen:
    """What a user who took over their daemon leaves in its cgroup: a child that is no MPS
    program (here ``sleep``, moved in by root as the daemon's fork would have been)."""
    child = subprocess.Popen(["/bin/sleep", "600"], user=user.pw_uid, group=user.pw_gid,
                             extra_groups=[], start_new_session=True)
    with open(os.path.join(key_cgroup, "cgroup.procs"), "w") as handle:
        handle.write(f"{child.pid}\n")
    assert isolation.cgroup_of(child.pid).endswith("/" + os.path.basename(key_cgroup))
    return child


@pytest.mark.parametrize("kill_file", ["cgroup.kill", "no-such-file"])
def test_a_takeover_child_in_the_daemons_cgroup_ends_with_the_daemon(
        users, cgroup_parent, monkeypatch, kill_file):
    """A user's process in their daemon's cgroup, which procscan never calls the daemon's:
    when the daemon retires, it ends too and the cgroup goes; through ``cgroup.kill``, and
    on a kernel without it (before 5.14) through SIGKILL of each pid checked to be in the
    cgroup. Another process of the same user, outside it, is left alone."""
    u1 = users[0]
    monkeypatch.setattr(teardown, "KILL_FILE", kill_file)
    made = Bed(cgroup=cgroup_parent)
    bystander = subprocess.Popen(["/bin/sleep", "600"], user=u1.pw_uid, group=u1.pw_gid)
    try:
        mgr = made.manager()
        lease = mgr.acquire(1, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
        child = taken_over(os.path.join(cgroup_parent, lease.key), u1)
        assert not mgr.daemons.is_ours(child.pid, DaemonRecord(
            lease.key, "shared", u1.pw_uid, u1.pw_gid, (GPU0,), lease.pipe_dir,
            lease.log_dir))
        assert mgr.release(1) == [lease.key]
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert not alive(lease.daemon_pid)
        assert not os.path.exists(os.path.join(cgroup_parent, lease.key))
        assert bystander.poll() is None
        assert os.listdir(made.config.daemons_dir) == []
    finally:
        bystander.kill()
        bystander.wait()
        made.close()


def test_root_kills_by_pid_only_what_is_in_the_cgroup(users, cgroup_parent):
    """Without ``cgroup.kill``, a pid listed in ``cgroup.procs`` is signalled only once its
    own ``/proc/<pid>/cgroup`` shows it in that cgroup (a pid that left or was reused)."""
    u1 = users[0]
    os.mkdir(cgroup_parent, 0o755)
    outside = subprocess.Popen(["/bin/sleep", "600"], user=u1.pw_uid, group=u1.pw_gid)
    try:
        relative = teardown._relative(cgroup_parent)
        assert relative is not None and isolation.cgroup_of(outside.pid) != relative
        teardown._kill_member(outside.pid, relative)
        assert outside.poll() is None
    finally:
        outside.kill()
        outside.wait()


def test_a_cgroup_that_cannot_be_emptied_is_logged_and_ended_by_the_next_reap(
        users, cgroup_parent, monkeypatch, caplog):
    """A process the kill cannot end yet (stuck in the kernel): the daemon's stop still
    finishes, the cgroup stays with a message naming it, and the key's lock file stays,
    so the next reap (a prolog's, or ``gpushare mps --reap``) ends and removes it."""
    u1 = users[0]
    made = Bed(cgroup=cgroup_parent)
    try:
        mgr = made.manager()
        lease = mgr.acquire(1, u1.pw_uid, u1.pw_gid, [GPU0], share_percent=25)
        key_cgroup = os.path.join(cgroup_parent, lease.key)
        child = taken_over(key_cgroup, u1)
        monkeypatch.setattr(teardown, "_kill_all", lambda path, relative, pids: None)
        assert mgr.release(1) == [lease.key]
        assert not alive(lease.daemon_pid) and child.poll() is None
        assert os.path.isdir(key_cgroup)
        assert f"the cgroup or scope of MPS control daemon {lease.key}" in caplog.text
        assert f"cgroup {key_cgroup} still holds processes after SIGKILL" in caplog.text
        assert os.listdir(made.config.daemons_dir) == [lease.key + ".lock"]
        monkeypatch.undo()
        assert made.manager().reap_stale(lambda job_id: False) == []
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert not os.path.exists(key_cgroup)
        assert os.listdir(made.config.daemons_dir) == []
    finally:
        made.close()


def test_a_cgroup_not_roots_is_left_alone(tmp_path):
    os.chown(tmp_path, 65534, 65534)
    assert "is not a cgroup directory of root's" in teardown.end_cgroup(str(tmp_path), 0)
    assert tmp_path.is_dir()
    assert teardown.end_cgroup(str(tmp_path / "gone"), 0) == ""


def test_gpushare_check_says_when_a_daemon_gets_no_cgroup(monkeypatch):
    """No cgroup: a takeover's child outlives the job; a cgroup or a systemd scope: nothing
    to say."""
    from gpushare.admin.check import WARNING, check_daemon_containment

    monkeypatch.setattr(isolation, "systemd_booted", lambda run_root="/run": False)
    (none,) = check_daemon_containment("none")
    assert none.severity == WARNING and "outlives the job" in none.what
    monkeypatch.setattr(isolation, "cgroup2_mount", lambda proc_root="/proc": None)
    assert "this host has no cgroup v2" in check_daemon_containment("auto")[0].what
    assert check_daemon_containment("/sys/fs/cgroup/mine") == []
    monkeypatch.setattr(isolation, "systemd_booted", lambda run_root="/run": True)
    assert check_daemon_containment("systemd") == []


def test_a_daemon_without_a_cgroup_of_its_own_is_shown_so():
    """Where gpushare made none (mps_cgroup=none, no cgroup v2), the path is the one the
    daemon inherited, which the table must not pass off as the daemon's."""
    from gpushare.cli.mps import _cgroup

    key = "u1001-GPU-0a1b"
    own = f"/sys/fs/cgroup/gpushare-mps/{key}"
    assert _cgroup(key, own) == own
    assert _cgroup(key, f"/gpushare.slice/gpushare-mps-{key}-1f2e.scope").endswith(".scope")
    assert _cgroup(key, "/system.slice/slurmd.service") == \
        "none of its own (in /system.slice/slurmd.service)"
    assert _cgroup(key, "") == "-"
