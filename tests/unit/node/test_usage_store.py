# SPDX-License-Identifier: GPL-2.0-or-later
"""The usage files: typed and versioned, root's directory, readable by all, refused when
planted or of another version."""

import json
import os

import pytest

from gpushare.common import safefs
from gpushare.node.usage.store import DeviceUsage, Figures, JobUsage, NodeUsage, UsageStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the usage directory is root's")


def job(job_id: int = 7) -> JobUsage:
    return JobUsage(job_id, 1001, "alice", [{"uuid": "GPU-a", "gpu": 0, "mig_profile": "",
                                             "share": 25}], 100.0, 100.0, 10.0)


def test_a_jobs_figures_fold_into_now_peak_and_means(tmp_path):
    usage = job()
    usage.add(Figures(40.0, 2 << 30, 10.0), 110.0)
    usage.add(Figures(20.0, 1 << 30, None), 120.0)
    assert usage.now == Figures(20.0, 1 << 30, None)
    assert usage.peak_mem_bytes == 2 << 30
    assert usage.mean_sm_pct == 30.0 and usage.mean_bw_pct == 5.0
    assert job().mean_sm_pct is None


def test_a_round_trip_keeps_every_field_and_the_file_is_readable_by_all(tmp_path):
    store = UsageStore(str(tmp_path))
    usage = job()
    usage.add(Figures(12.5, 4096, 3.0), 111.0)
    usage.quality = {"sm": "measured", "mem": "measured", "bw": "estimated"}
    usage.unsupported = ["nvmlGpmMigSampleGet"]
    store.write_job(usage)
    assert store.read_job(7) == usage
    assert os.stat(tmp_path / "usage" / "7.json").st_mode & 0o777 == 0o644
    assert store.job_ids() == [7] and list(store.read_all()) == [7]
    node = NodeUsage(111.0, 10.0, [DeviceUsage("GPU-a", 0, "", 55.0, "measured", [7],
                                               {"job_id": 7, "user": "alice"})])
    store.write_node(node)
    assert store.read_node().to_dict() == node.to_dict()
    assert store.remove_job(7) and store.read_job(7) is None and not store.remove_job(7)


def test_nothing_sampled_yet_is_none_not_an_error(tmp_path):
    store = UsageStore(str(tmp_path))
    assert store.read_job(1) is None and store.read_node() is None and store.job_ids() == []


def test_a_planted_link_or_another_version_is_refused(tmp_path):
    store = UsageStore(str(tmp_path))
    store.write_job(job())
    os.symlink("/etc/shadow", tmp_path / "usage" / "8.json")
    with pytest.raises(safefs.UnsafePathError):
        store.read_job(8)
    data = job(9).to_dict()
    data["version"] = 2
    (tmp_path / "usage" / "9.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="version 2"):
        store.read_job(9)
    os.chmod(tmp_path / "usage", 0o777)
    with pytest.raises(safefs.UnsafePathError):
        store.read_job(7)


def test_a_bad_quality_or_figure_names_the_field(tmp_path):
    data = job().to_dict()
    data["quality"] = {"sm": "guessed"}
    with pytest.raises(ValueError, match=r"quality\.sm"):
        JobUsage.from_dict(data)
    data = job().to_dict()
    data["now"] = {"sm_pct": -1}
    with pytest.raises(ValueError, match=r"now\.sm_pct"):
        JobUsage.from_dict(data)
