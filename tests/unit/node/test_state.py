# SPDX-License-Identifier: GPL-2.0-or-later
"""Per-job records: root-owned, atomic, refused when a path could be a user's."""

import os
import stat

import pytest

from gpushare.node.state import JobRecord, JobStore, StateError, check_root_dir


def record(**extra):
    values = dict(job_id=42, uid=1001, gid=1001, node="n1", mode="shared", share_percent=25,
                  slurm_gpus=["3"], env={"CUDA_VISIBLE_DEVICES": "0",
                                         "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
    values.update(extra)
    return JobRecord(**values)


def test_write_read_remove_round_trip(tmp_path):
    store = JobStore(str(tmp_path / "state"))
    store.write(record(), show="gpushare: job 42: 25%")
    info = os.stat(store.path(42))
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.jobs_dir).st_mode) == 0o700
    assert store.read(42) == record(created=store.read(42).created)
    with open(store.path(42, ".env")) as handle:
        lines = handle.read().splitlines()
    assert lines == ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_VISIBLE_DEVICES=0",
                     "#show=gpushare: job 42: 25%"]
    assert store.job_ids() == [42]
    assert store.exists(42) and not store.exists(43)
    assert store.remove(42) is True
    assert store.remove(42) is False  # epilog twice
    assert store.read(42) is None and not store.exists(42)
    assert not os.path.exists(store.path(42, ".env"))


def test_env_file_carries_a_refusal_and_nothing_else(tmp_path):
    store = JobStore(str(tmp_path))
    store.write(record(error="--gpu-share=5 got no GPU\non this node"))
    with open(store.path(42, ".env")) as handle:
        assert handle.read() == "#error=--gpu-share=5 got no GPU on this node\n"


def test_env_file_drops_names_that_are_not_variables(tmp_path):
    rec = record(env={"GOOD_1": "a\nb", "bad-name": "x", "1X": "y"})
    assert rec.to_env_file() == "GOOD_1=a b\n"


def test_symlinked_state_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(StateError, match="is a symbolic link or not a directory"):
        JobStore(str(link)).write(record())


def test_group_writable_dir_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(StateError, match="is writable by group or others"):
        check_root_dir(str(loose))


def test_record_of_another_version_is_refused(tmp_path):
    store = JobStore(str(tmp_path))
    store.write(record())
    with open(store.path(42)) as handle:
        text = handle.read().replace('"version": 1', '"version": 9')
    with open(store.path(42), "w") as handle:
        handle.write(text)
    with pytest.raises(StateError, match="unsupported record version"):
        store.read(42)
