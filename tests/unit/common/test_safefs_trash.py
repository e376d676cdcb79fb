# SPDX-License-Identifier: GPL-2.0-or-later
"""Root removes a tree a user filled without raising, recursing or following a link: any
depth, any entry kind, a writer still at work, a directory swapped for a link."""

from __future__ import annotations

import os
import socket
import stat
import threading

import pytest

from gpushare.common import safefs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership")
NOBODY = 65534


@pytest.fixture
def base(tmp_path):
    os.chmod(tmp_path, 0o755)
    return str(tmp_path)


@pytest.fixture
def base_fd(base):
    fd = safefs.open_root_dir(base)
    yield fd
    os.close(fd)


def deep_chain(top: str, depth: int) -> str:
    """``top/d/d/.../d`` ``depth`` levels below ``top``, made without a long path."""
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
            f.write("x")
    finally:
        os.close(fd)
    return top


@pytest.mark.parametrize("depth", [70, 600])
def test_a_tree_of_any_depth_is_removed(base, base_fd, depth):
    deep_chain(os.path.join(base, "tree"), depth)
    assert safefs.remove_tree_at(base_fd, "tree") is True
    assert not os.path.lexists(os.path.join(base, "tree"))
    assert safefs.trash_entries_at(base_fd) == []


def test_many_entries_and_every_kind_of_entry_are_removed(base, base_fd):
    tree = os.path.join(base, "tree")
    os.makedirs(os.path.join(tree, "sub"))
    for index in range(3000):
        open(os.path.join(tree, f"f{index}"), "w").close()
    os.mkfifo(os.path.join(tree, "sub", "fifo"))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.path.join(tree, "sub", "sock"))
    os.mknod(os.path.join(tree, "null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert safefs.discard_tree_at(base_fd, "tree") is True
    assert not os.path.lexists(tree)
    assert safefs.trash_entries_at(base_fd) == []


def test_links_are_unlinked_never_followed(base, base_fd):
    outside = os.path.join(base, "outside")
    os.makedirs(os.path.join(outside, "inner"))
    keep = os.path.join(outside, "inner", "keep")
    open(keep, "w").close()
    tree = os.path.join(base, "tree")
    os.makedirs(os.path.join(tree, "a"))
    os.symlink(outside, os.path.join(tree, "a", "dirlink"))
    os.symlink(keep, os.path.join(tree, "filelink"))
    os.symlink("/nonexistent", os.path.join(tree, "dangling"))
    assert safefs.discard_tree_at(base_fd, "tree") is True
    assert os.path.exists(keep)
    assert not os.path.lexists(tree)
    os.symlink(outside, os.path.join(base, "toplink"))
    assert safefs.discard_tree_at(base_fd, "toplink") is True
    assert os.path.exists(keep) and not os.path.lexists(os.path.join(base, "toplink"))
    assert safefs.discard_tree_at(base_fd, "absent") is False


def test_the_tree_leaves_its_place_at_once_and_a_small_budget_finishes_later(base, base_fd):
    deep_chain(os.path.join(base, "tree"), 40)
    assert safefs.discard_tree_at(base_fd, "tree", budget=5) is True
    # Gone from where a user could reach it, waiting in root's trash.
    assert not os.path.lexists(os.path.join(base, "tree"))
    assert safefs.trash_entries_at(base_fd)
    trash = os.stat(os.path.join(base, safefs.TRASH))
    assert (trash.st_uid, stat.S_IMODE(trash.st_mode)) == (0, 0o700)
    rounds = 0
    while not safefs.purge_trash_at(base_fd, budget=5):
        rounds += 1
        assert rounds < 200, safefs.trash_entries_at(base_fd)
    assert rounds > 0
    assert safefs.trash_entries_at(base_fd) == []


def test_a_writer_still_filling_the_tree_cannot_make_removal_raise(base, base_fd):
    tree = os.path.join(base, "tree")
    os.makedirs(os.path.join(tree, "w"))
    os.chown(os.path.join(tree, "w"), NOBODY, NOBODY)
    stop = threading.Event()
    writer_fd = os.open(os.path.join(tree, "w"), os.O_RDONLY | os.O_DIRECTORY)
    made = []

    def write() -> None:
        # The writer holds the directory open, as a process with its cwd there does, and
        # keeps adding files and directories by descriptor after the tree moved.
        index = 0
        while not stop.is_set():
            try:
                os.mkdir(f"d{index}", dir_fd=writer_fd)
                os.close(os.open(f"d{index}/f", os.O_WRONLY | os.O_CREAT, 0o600,
                                 dir_fd=writer_fd))
                made.append(index)
            except OSError:
                pass  # its directory is being removed under it
            index += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        started = threading.Event()
        while len(made) < 50 and thread.is_alive():
            started.wait(0.001)
        for _ in range(20):
            safefs.discard_tree_at(base_fd, "tree", budget=200)
            assert not os.path.lexists(tree)
            safefs.purge_trash_at(base_fd, budget=200)
    finally:
        stop.set()
        thread.join()
        os.close(writer_fd)
    # With the writer gone, each bounded purge gets further until nothing is left.
    rounds = 0
    while not safefs.purge_trash_at(base_fd):
        rounds += 1
        assert rounds < 100, safefs.trash_entries_at(base_fd)[:5]
    assert safefs.trash_entries_at(base_fd) == []


def test_a_directory_swapped_for_a_link_mid_walk_is_unlinked_as_a_link(base, base_fd,
                                                                       monkeypatch):
    outside = os.path.join(base, "outside")
    os.mkdir(outside)
    keep = os.path.join(outside, "keep")
    open(keep, "w").close()
    tree = os.path.join(base, "tree")
    os.makedirs(os.path.join(tree, "victim", "x"))
    real_unlink = os.unlink
    swapped = []

    def unlink_then_swap(name, *, dir_fd=None):
        try:
            return real_unlink(name, dir_fd=dir_fd)
        except IsADirectoryError:
            if name == "victim" and not swapped:
                # Between root's unlink (EISDIR) and its open, the user swaps the directory
                # for a link to somewhere root must not walk.
                os.rename(os.path.join(base, safefs.TRASH, trash_name(base), "victim"),
                          os.path.join(base, "moved"))
                os.symlink(outside, os.path.join(base, safefs.TRASH, trash_name(base),
                                                 "victim"))
                swapped.append(name)
            raise

    monkeypatch.setattr(safefs.os, "unlink", unlink_then_swap)
    assert safefs.discard_tree_at(base_fd, "tree") is True
    assert swapped
    assert os.path.exists(keep)
    assert safefs.trash_entries_at(base_fd) == []


def trash_name(base: str) -> str:
    (name,) = os.listdir(os.path.join(base, safefs.TRASH))
    return name


def test_the_trash_must_be_roots(base, base_fd):
    os.mkdir(os.path.join(base, safefs.TRASH))
    os.chown(os.path.join(base, safefs.TRASH), NOBODY, NOBODY)
    os.mkdir(os.path.join(base, "tree"))
    with pytest.raises(safefs.UnsafePathError):
        safefs.discard_tree_at(base_fd, "tree")
    assert os.path.isdir(os.path.join(base, "tree"))


def test_a_trash_another_discard_removes_before_it_is_opened_is_made_again(
        base, base_fd, monkeypatch):
    """Two epilogs discard records in one directory: one tidies the emptied trash away
    between the other's mkdir and its open. The second discard makes it again."""
    os.mkdir(os.path.join(base, "tree"))
    real = safefs.open_dir_at
    raced = []

    def tidied_meanwhile(parent_fd, name, *args, **kwargs):
        if name == safefs.TRASH and not raced:
            raced.append(name)
            os.rmdir(safefs.TRASH, dir_fd=parent_fd)  # the other discard's tidy
        return real(parent_fd, name, *args, **kwargs)

    monkeypatch.setattr(safefs, "open_dir_at", tidied_meanwhile)
    assert safefs.discard_tree_at(base_fd, "tree")
    assert raced and not os.path.exists(os.path.join(base, "tree"))
    assert not os.path.exists(os.path.join(base, safefs.TRASH))
