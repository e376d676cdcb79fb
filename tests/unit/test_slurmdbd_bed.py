# SPDX-License-Identifier: GPL-2.0-or-later
"""The accounting bed's choice of slurmdbd's client library (scripts/slurmdbd_bed.py): Debian
13's and forky's slurmdbd load Debian 12's, fetched into a directory of its own; Debian 12's
loads its own; a missing one makes the accounting test skip with the reason."""

from __future__ import annotations

import os

import pytest

import slurmdbd_bed


def release(root, codename: str) -> str:
    os.makedirs(root / "etc", exist_ok=True)
    (root / "etc" / "os-release").write_text(f'NAME="Debian"\nVERSION_CODENAME={codename}\n')
    return str(root)


def test_codename_is_read_from_the_roots_os_release(tmp_path):
    assert slurmdbd_bed.codename(release(tmp_path, "trixie")) == "trixie"
    assert slurmdbd_bed.codename(str(tmp_path / "nothing")) == ""


@pytest.mark.parametrize("codename, needs", [("bookworm", False), ("trixie", True),
                                             ("forky", True)])
def test_which_releases_load_another_client_library(tmp_path, monkeypatch, codename, needs):
    monkeypatch.setattr(slurmdbd_bed, "codename", lambda root="/": codename)
    monkeypatch.setattr(slurmdbd_bed, "CLIENT_DIR", str(tmp_path / "lib"))
    if not needs:
        assert slurmdbd_bed.client_library() == ""
        return
    with pytest.raises(slurmdbd_bed.AccountingError, match=r"holds no libmariadb\.so\.3"):
        slurmdbd_bed.client_library()
    unpacked = tmp_path / "lib" / "usr" / "lib" / "x86_64-linux-gnu"
    unpacked.mkdir(parents=True)
    (unpacked / "libmariadb.so.3").write_bytes(b"")
    assert slurmdbd_bed.client_library() == str(unpacked)


def test_a_missing_library_is_the_reason_the_test_skips(tmp_path, monkeypatch):
    monkeypatch.setattr(slurmdbd_bed, "codename", lambda root="/": "trixie")
    monkeypatch.setattr(slurmdbd_bed, "CLIENT_DIR", str(tmp_path / "lib"))
    monkeypatch.setattr(slurmdbd_bed.shutil, "which", lambda name: f"/usr/sbin/{name}")
    assert "holds no libmariadb.so.3" in slurmdbd_bed.unusable_reason()
    monkeypatch.setattr(slurmdbd_bed.shutil, "which", lambda name: None)
    assert "slurmdbd and mariadb-server packages" in slurmdbd_bed.unusable_reason()


def test_fetching_is_nothing_where_the_release_needs_no_other_library(tmp_path, monkeypatch):
    monkeypatch.setattr(slurmdbd_bed.subprocess, "run", lambda *a, **k: pytest.fail("ran"))
    slurmdbd_bed.fetch_client_library("http://deb.invalid/debian",
                                      root=release(tmp_path, "bookworm"))
    assert not (tmp_path / slurmdbd_bed.CLIENT_DIR.lstrip("/")).exists()
