# SPDX-License-Identifier: GPL-2.0-or-later
"""Root-side directory and file operations refuse symlinks and user-placed entries."""

from __future__ import annotations

import os
import stat

import pytest

from gpushare.common import safefs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership")
NOBODY = 65534


@pytest.fixture
def base(tmp_path):
    os.chmod(tmp_path, 0o755)
    return str(tmp_path)


def test_open_root_dir_creates_missing_components_root_owned(base):
    target = os.path.join(base, "a", "b")
    fd = safefs.open_root_dir(target)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(target))
    finally:
        os.close(fd)
    for path in (os.path.join(base, "a"), target):
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)


def test_open_root_dir_without_create_reports_absence(base):
    with pytest.raises(FileNotFoundError):
        safefs.open_root_dir(os.path.join(base, "missing"), create=False)


def test_open_root_dir_refuses_a_symlinked_component(base):
    os.mkdir(os.path.join(base, "real"))
    os.symlink(os.path.join(base, "real"), os.path.join(base, "link"))
    with pytest.raises(safefs.UnsafePathError, match=r"link is a symbolic link"):
        safefs.open_root_dir(os.path.join(base, "link", "x"))
    assert os.listdir(os.path.join(base, "real")) == []


def test_open_root_dir_refuses_user_owned_and_writable_components(base):
    owned = os.path.join(base, "owned")
    os.mkdir(owned)
    os.chown(owned, NOBODY, NOBODY)
    with pytest.raises(safefs.UnsafePathError, match=r"owned is not owned by root"):
        safefs.open_root_dir(os.path.join(owned, "x"))
    writable = os.path.join(base, "writable")
    os.mkdir(writable)
    os.chmod(writable, 0o777)
    with pytest.raises(safefs.UnsafePathError, match=r"writable by group or others"):
        safefs.open_root_dir(os.path.join(writable, "x"))
    sticky = os.path.join(base, "sticky")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    os.close(safefs.open_root_dir(os.path.join(sticky, "x")))


def test_open_root_dir_refuses_a_sticky_directory_writable_by_others_as_itself(base):
    """Above the directory, sticky is enough (nobody can replace root's entries); the
    directory itself is where root makes its own names, which any user could take first."""
    sticky = os.path.join(base, "sticky")
    os.mkdir(sticky)
    for mode in (0o1777, 0o1775, 0o1757):
        os.chmod(sticky, mode)
        with pytest.raises(safefs.UnsafePathError,
                           match=r"sticky is writable by group or others \(.*\), sticky or "
                                 r"not: .* chmod go-w it, or use a directory below it"):
            safefs.open_root_dir(sticky, create=False)
    os.close(safefs.open_root_dir(os.path.join(sticky, "below")))
    os.chmod(sticky, 0o1755)
    os.close(safefs.open_root_dir(sticky, create=False))


def test_make_owned_dir_gives_the_user_a_private_dir_and_refuses_existing(base):
    fd = safefs.open_root_dir(base)
    try:
        safefs.make_owned_dir(fd, "mine", "mine", NOBODY, NOBODY)
        st = os.lstat(os.path.join(base, "mine"))
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o700)
        with pytest.raises(safefs.UnsafePathError, match=r"exists already"):
            safefs.make_owned_dir(fd, "mine", "mine", NOBODY, NOBODY)
        os.symlink("/etc", os.path.join(base, "planted"))
        with pytest.raises(safefs.UnsafePathError, match=r"a symbolic link"):
            safefs.make_owned_dir(fd, "planted", "planted", NOBODY, NOBODY)
        assert os.lstat("/etc").st_uid == 0
    finally:
        os.close(fd)


def test_remove_tree_never_follows_symlinks(base):
    outside = os.path.join(base, "outside")
    os.mkdir(outside)
    keep = os.path.join(outside, "keep")
    open(keep, "w").close()
    tree = os.path.join(base, "tree", "sub")
    os.makedirs(tree)
    os.symlink(outside, os.path.join(tree, "dirlink"))
    os.symlink(keep, os.path.join(tree, "filelink"))
    open(os.path.join(tree, "file"), "w").close()
    fd = safefs.open_root_dir(base)
    try:
        assert safefs.remove_tree_at(fd, "tree") is True
        assert safefs.remove_tree_at(fd, "tree") is False
        os.symlink(outside, os.path.join(base, "toplink"))
        assert safefs.remove_tree_at(fd, "toplink") is True
    finally:
        os.close(fd)
    assert os.path.exists(keep)
    assert not os.path.lexists(os.path.join(base, "tree"))
    assert not os.path.lexists(os.path.join(base, "toplink"))


def test_atomic_write_and_read_refuse_symlinks(base):
    fd = safefs.open_root_dir(base)
    try:
        safefs.write_file_atomic_at(fd, "rec.json", b"{}")
        assert safefs.read_small_file_at(fd, "rec.json") == b"{}"
        assert safefs.read_small_file_at(fd, "absent") is None
        os.symlink("/etc/passwd", os.path.join(base, "link"))
        with pytest.raises(safefs.UnsafePathError, match=r"symbolic link"):
            safefs.read_small_file_at(fd, "link")
        assert safefs.remove_file_at(fd, "link") is True
        assert safefs.remove_file_at(fd, "link") is False
    finally:
        os.close(fd)
    assert stat.S_IMODE(os.stat(os.path.join(base, "rec.json")).st_mode) == 0o644
    assert os.path.exists("/etc/passwd")


def test_check_root_owned_file(base):
    prog = os.path.join(base, "prog")
    with open(prog, "w") as handle:
        handle.write("#!/bin/sh\n")
    os.chmod(prog, 0o755)
    assert safefs.check_root_owned_file(prog) == os.path.realpath(prog)
    with pytest.raises(safefs.UnsafePathError, match=r"not an absolute path"):
        safefs.check_root_owned_file("prog")
    with pytest.raises(safefs.UnsafePathError, match=r"does not exist"):
        safefs.check_root_owned_file(prog + "-absent")
    os.chmod(prog, 0o757)
    with pytest.raises(safefs.UnsafePathError, match=r"chmod go-w"):
        safefs.check_root_owned_file(prog)
    os.chmod(prog, 0o755)
    os.chown(prog, NOBODY, NOBODY)
    with pytest.raises(safefs.UnsafePathError, match=r"must be owned by root"):
        safefs.check_root_owned_file(prog)
    os.chown(prog, 0, 0)
    os.chmod(base, 0o775)
    with pytest.raises(safefs.UnsafePathError, match=r"writable by group or others"):
        safefs.check_root_owned_file(prog)


def test_a_refused_link_names_its_target_and_no_program(base):
    """Through a symlink the target is what must change, and the file may be a
    configuration file (slurm.conf, the plan), not a program."""
    users = os.path.join(base, "users")
    os.mkdir(users, 0o755)
    target = os.path.join(users, "slurm.conf")
    with open(target, "w") as handle:
        handle.write("ClusterName=c\n")
    link = os.path.join(base, "slurm.conf")
    os.symlink(target, link)
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(safefs.UnsafePathError) as err:
        safefs.check_root_owned_file(link)
    assert str(err.value).startswith(f"{target} (where {link} leads) must be owned by root")
    os.chown(target, 0, 0)
    os.chmod(users, 0o777)
    with pytest.raises(safefs.UnsafePathError, match=r"writable by group or others") as err:
        safefs.check_root_owned_file(link)
    assert "program" not in str(err.value) and "move the file elsewhere" in str(err.value)
