# SPDX-License-Identifier: GPL-2.0-or-later
"""Each user's MPS space is their own (plugstack ``mps_space=``): a tmpfs per daemon key,
filled by one user without touching another's start; removed with one unmount; a full
shared mount never needs an inode to remove a tree; ENOSPC charged where it came from."""

from __future__ import annotations

import errno
import os
import stat
import subprocess

import pytest
from tests.unit.node.test_mps import GPU0, GPU1, REASON, alive, mounts_below

from gpushare.node import faults
from gpushare.node.mps import MpsUserError, RecordStore, space

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SMALL = "1M,64"


def fill(directory: str) -> str:
    """Write into ``directory`` until its file system says ENOSPC; the file written."""
    path = os.path.join(directory, "fill")
    # Unbuffered: nothing is left to flush (and fail again) at close.
    with open(path, "wb", buffering=0) as handle, pytest.raises(OSError) as caught:
        for _ in range(1 << 12):
            handle.write(b"\0" * (1 << 16))
            handle.flush()
    assert caught.value.errno == errno.ENOSPC
    return path


def mountinfo_line(path: str) -> str:
    with open("/proc/self/mountinfo") as handle:
        return next(line for line in handle if line.split()[4] == path)


def test_each_daemon_gets_a_small_tmpfs_of_its_own_that_goes_with_it(bed, users):
    """The key directory is the root (root's, 0755) of a tmpfs of the configured size and
    inodes, nosuid, nodev, noexec; pipe and log in it are the user's; the daemon's last
    release unmounts it and removes the empty directory."""
    u1 = users[0]
    mgr = bed.manager(mps_space="2M,128")
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    key_dir = os.path.join(bed.mps_dir, lease.key)
    line = mountinfo_line(key_dir)
    options = set(line.split()[5].split(","))
    assert {"nosuid", "nodev", "noexec"} <= options, line
    assert line.split(" - ")[1].split()[:2] == ["tmpfs", space.FSNAME], line
    room = os.statvfs(key_dir)
    assert room.f_blocks * room.f_frsize == 2 << 20 and room.f_files == 128
    info = os.lstat(key_dir)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o755)
    assert info.st_dev != os.stat(bed.mps_dir).st_dev
    for name in ("pipe", "log"):
        info = os.lstat(os.path.join(key_dir, name))
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (u1.pw_uid, 0o700)
    assert mgr.release(1) == [lease.key]
    assert bed.mounts() == [] and bed.entries() == []


def test_a_user_who_fills_their_space_leaves_another_users_start_working(bed, users):
    """User 1 fills their daemon's tmpfs from their log directory. User 2's daemon on the
    same GPU starts; a start of user 1 on another GPU gets a space of its own and works.
    User 1's next job on the full daemon fails as theirs (naming their uid and key, what to
    do; the node stays in service), and joins once they freed room. When user 1's daemon
    retires its tmpfs goes with one unmount, and their next start there works again."""
    u1, u2 = users
    mgr = bed.manager(mps_space=SMALL)
    mine = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                       share_percent=25)
    filled = fill(mine.log_dir)
    other = mgr.acquire(job_id=2, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0],
                        share_percent=25)
    assert alive(other.daemon_pid) and other.key != mine.key
    with pytest.raises(MpsUserError, match=rf"its own MPS space .*{mine.key} \(uid "
                                           rf"{u1.pw_uid}'s, plugstack mps_space=1M,64\) is "
                                           rf"full: the jobs of uid {u1.pw_uid} filled") as err:
        mgr.acquire(job_id=3, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0], share_percent=25)
    fault = faults.classify("job_prolog", err.value, bed.state_dir)
    assert fault.who == faults.USER and "Remove what they wrote there" in fault.detail
    os.unlink(filled)  # as the user may, in their own log directory
    joined = mgr.acquire(job_id=3, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                         share_percent=25)
    assert joined.daemon_pid == mine.daemon_pid
    fill(mine.log_dir)
    elsewhere = mgr.acquire(job_id=4, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU1],
                            share_percent=25)
    assert alive(elsewhere.daemon_pid)
    with open(os.path.join(elsewhere.log_dir, "room"), "wb") as handle:
        handle.write(b"x" * 4096)  # user 1's other space is untouched
    with RecordStore(bed.daemons_dir, bed.mps_dir).users_fd() as users_fd:
        used = space.usage(users_fd, mine.key, os.path.join(bed.mps_dir, mine.key))
    assert used is not None and used.full()
    assert mgr.release(1) == [] and mgr.release(3) == [mine.key]
    again = mgr.acquire(job_id=5, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    assert alive(again.daemon_pid) and os.listdir(again.log_dir) != ["fill"]
    assert not os.path.exists(os.path.join(again.log_dir, "fill"))
    for job in (2, 4, 5):
        mgr.release(job)
    assert bed.mounts() == [] and bed.entries() == []


def test_a_tree_of_3000_files_goes_with_one_unmount(bed, users):
    """What a user leaves in their space (a deep tree, many files, a FIFO) goes with the
    daemon, without a walk: nothing is left in the users' directory, not even a trash."""
    u1 = users[0]
    mgr = bed.manager(mps_space="4M,4096")
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    code = (f"import os\nb={lease.log_dir!r}\nfor i in range(3000): open(f'{{b}}/f{{i}}', 'w')"
            "\np=b\nfor i in range(70):\n p=os.path.join(p,'d')\n os.mkdir(p)\n"
            "os.mkfifo(os.path.join(b,'fifo'))\n")
    subprocess.run(["/usr/bin/python3", "-c", code], user=u1.pw_uid, group=u1.pw_gid,
                   check=True, timeout=60)
    assert mgr.release(1) == [lease.key]
    assert bed.mounts() == [] and bed.entries() == []
    assert not os.path.exists(os.path.join(bed.mps_dir, ".trash"))


def test_reap_unmounts_the_space_a_restart_left_behind_and_nothing_a_user_placed(
        bed, users, caplog):
    """A slurmd restart that lost a daemon's record leaves its tmpfs mounted: the reap ends
    the daemon and unmounts it. A key directory that is a mount point but not root's
    (not what gpushare mounts) is never unmounted: it is logged, left for the admin, and
    nothing fails."""
    u1 = users[0]
    mgr = bed.manager(mps_space=SMALL)
    lost = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                       share_percent=25)
    os.unlink(os.path.join(bed.daemons_dir, lost.key + ".json"))
    foreign = os.path.join(bed.mps_dir, "u1001-GPU-foreign")
    os.mkdir(foreign)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "other", foreign], check=True)
    os.chown(foreign, u1.pw_uid, u1.pw_gid)
    try:
        assert mgr.reap_stale(lambda job: False) == [lost.key]
        assert not alive(lost.daemon_pid)
        assert not os.path.exists(os.path.join(bed.mps_dir, lost.key))
        assert mounts_below(bed.base) == [foreign]  # left alone
        assert "cannot remove MPS directory " + foreign in caplog.text
        assert mgr.reap_stale(lambda job: False) == []  # again: logged, never a failure
    finally:
        subprocess.run(["umount", "-l", foreign], check=False)
        os.rmdir(foreign)
    assert bed.entries() == []


def test_with_shared_space_a_full_mount_still_lets_a_daemon_retire(bed, users):
    """``mps_space=shared`` on a users' mount whose every inode a user took: the filling
    user's daemon retires and its directory goes (the trash was made before anything could
    fill the mount), never "state_dir= full"; another user's next start works."""
    u1, u2 = users
    os.makedirs(bed.mps_dir, 0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=4m,nr_inodes=64",
                    "gpushare-test-users", bed.mps_dir], check=True)
    try:
        mgr = bed.manager(mps_space="shared")
        lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                            share_percent=25)
        code = (f"import os\ni=0\nwhile True:\n try: open(f'{lease.log_dir}/f{{i}}', 'w')\n"
                " except OSError: break\n i+=1\n")
        subprocess.run(["/usr/bin/python3", "-c", code], user=u1.pw_uid, group=u1.pw_gid,
                       check=True, timeout=60)
        assert os.statvfs(bed.mps_dir).f_favail == 0
        assert mgr.release(1) == [lease.key]
        assert bed.entries() == []
        other = mgr.acquire(job_id=2, uid=u2.pw_uid, gid=u2.pw_gid, devices=[GPU0],
                            share_percent=25)
        assert alive(other.daemon_pid)
        assert mgr.release(2) == [other.key] and bed.entries() == []
    finally:
        subprocess.run(["umount", "-l", bed.mps_dir], check=False)


def test_enospc_is_the_nodes_only_when_it_came_from_state_dirs_file_system(bed, users):
    """faults.state_dir_full names state_dir= full for an ENOSPC from its file system
    (or of unknown origin), never for one from a daemon's own space."""
    u1 = users[0]
    mgr = bed.manager(mps_space=SMALL)
    lease = mgr.acquire(job_id=1, uid=u1.pw_uid, gid=u1.pw_gid, devices=[GPU0],
                        share_percent=25)
    try:
        users_err = OSError(errno.ENOSPC, "No space left on device",
                            os.path.join(lease.log_dir, "x"))
        assert faults.state_dir_full(bed.state_dir, users_err) == ""
        assert faults.classify("job_prolog", users_err, bed.state_dir).brief != (
            faults.STATE_DIR_FULL.format(state_dir=bed.state_dir))
        state_err = OSError(errno.ENOSPC, "No space left on device",
                            os.path.join(bed.daemons_dir, "x.json"))
        assert "no space left in state_dir=" in faults.state_dir_full(bed.state_dir,
                                                                      state_err)
        unknown = OSError(errno.ENOSPC, "No space left on device", "relative")
        assert faults.state_dir_full(bed.state_dir, unknown)
    finally:
        mgr.release(1)
    assert bed.mounts() == [] and bed.entries() == []
