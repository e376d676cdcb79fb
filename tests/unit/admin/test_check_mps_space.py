# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check`` on the users' MPS space: a daemon's own tmpfs that its user filled
is named by its key; job_container/tmpfs without Shared=yes is a warning while each
daemon gets a mount of its own."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpushare.admin.check import WARNING
from gpushare.admin.check_space import check_job_container, check_key_spaces, space_findings

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
KEY = "u1001-GPU-11111111-2222-3333-4444-555555555555"


@needs_root
def test_a_nearly_full_daemon_space_is_reported_with_its_key_and_uid(tmp_path):
    mps = tmp_path / "mps"
    key_dir = mps / KEY
    key_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64,mode=0755",
                    "gpushare-mps", str(key_dir)], check=True)
    try:
        assert check_key_spaces(str(mps)) == []
        with open(key_dir / "fill", "wb") as handle, pytest.raises(OSError):
            handle.write(b"\0" * (2 << 20))
            handle.flush()
        (finding,) = check_key_spaces(str(mps))
        assert finding.severity == WARNING and finding.where == str(key_dir)
        assert finding.what.startswith("uid 1001's MPS space is 100% full (1024 of 1024 KiB")
        assert "only that user's jobs on that daemon are hurt" in finding.fix
    finally:
        subprocess.run(["umount", str(key_dir)], check=True)
    assert check_key_spaces(str(mps)) == []  # a directory without a mount: nothing to say


def test_job_container_tmpfs_without_shared_is_a_warning_with_what_to_set(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nJobContainerType=job_container/tmpfs\n")
    (finding,) = check_job_container({}, "16M,4096", str(conf))
    assert finding.where == str(tmp_path / "job_container.conf")
    assert "Shared=yes" in finding.fix and "mps_space=shared" in finding.fix
    (tmp_path / "job_container.conf").write_text("AutoBasePath=true\nBasePath=/var/nvme\n"
                                                 "# Shared=yes\n")
    assert len(check_job_container({}, "16M,4096", str(conf))) == 1  # a comment is no setting
    (tmp_path / "job_container.conf").write_text("AutoBasePath=true\nBasePath=/var/nvme\n"
                                                 "Shared=yes\n")
    assert check_job_container({}, "16M,4096", str(conf)) == []
    conf.write_text("NamespaceType=namespace/tmpfs\n")  # Slurm 25.11's name
    (tmp_path / "job_container.conf").write_text("BasePath=/var/nvme\n")
    assert len(check_job_container({"SLURM_CONF": str(conf)}, "16M,4096")) == 1
    conf.write_text("ClusterName=c\n# JobContainerType=job_container/tmpfs\n")
    assert check_job_container({}, "16M,4096", str(conf)) == []


def test_with_shared_space_job_containers_need_nothing(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("JobContainerType=job_container/tmpfs\n")
    findings = space_findings(str(tmp_path / "absent"), "shared", {"SLURM_CONF": str(conf)})
    assert findings == []
    (finding,) = space_findings(str(tmp_path / "absent"), "16M,4096",
                                {"SLURM_CONF": str(conf)})
    assert "job_container/tmpfs without Shared=yes" in finding.what
