# SPDX-License-Identifier: GPL-2.0-or-later
"""The Python job_submit entry: facts once, reload, never raising, on_error policy."""

from __future__ import annotations

import json
import logging

import pytest

from gpushare.submit import hook as submit_hook
from luahook import facts_path


@pytest.fixture()
def facts_file(tmp_path):
    with open(facts_path("h100-2205"), encoding="utf-8") as handle:
        data = json.load(handle)
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    return path, data


@pytest.fixture(autouse=True)
def fresh_hook(monkeypatch):
    monkeypatch.setattr(submit_hook, "_facts", None)
    monkeypatch.setattr(submit_hook, "_facts_path", None)
    for name in ("_running_syntax", "_running_release", "_running_version"):
        monkeypatch.setattr(submit_hook, name, None)


def test_submit_rewrites_and_tells(facts_file):
    assert submit_hook.init(str(facts_file[0])) == 0
    rc, changes, message = submit_hook.job_submit(
        {"tres_per_node": "gres:gpu:nvidia_a100_1g.10gb:1", "min_nodes": 2}, 1000)
    assert rc == 0
    assert changes == {"tres_per_node": "gres:gpu:1g.10gb:1", "req_switch": 1,
                       "wait4switch": 300}
    assert message.startswith("gpushare: --gres=gpu:nvidia_a100_1g.10gb:1 -> ")


def test_submit_rejects_with_2072(facts_file):
    submit_hook.init(str(facts_file[0]))
    rc, changes, message = submit_hook.job_submit({"tres_per_node": "gres:mps:150"}, 1000)
    assert (rc, changes) == (2072, {})
    assert "at most mps:100" in message


def test_without_facts_jobs_pass_and_the_error_is_logged(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="gpushare.submit"):
        assert submit_hook.init(str(tmp_path / "missing.json")) == 0
    assert "missing.json: cannot read" in caplog.text
    assert submit_hook.job_submit({"tres_per_node": "gres:mps:150"}, 1) == (0, {}, "")


def test_reload_keeps_old_facts_when_new_are_bad(facts_file):
    path, data = facts_file
    submit_hook.init(str(path))
    path.write_text("{broken")
    submit_hook.reload()
    assert submit_hook.current_facts() is not None
    data["mps_units_per_gpu"] = 1000
    path.write_text(json.dumps(data))
    submit_hook.reload()
    _rc, changes, _ = submit_hook.job_submit(
        {"spank_job_env": ["_SLURM_SPANK_OPTION_gpushare_gpu_share=25"]}, 1)
    assert changes == {"tres_per_node": "gres:mps:250"}


@pytest.mark.parametrize("on_error, expected_rc", [("accept", 0), ("reject", -1)])
def test_internal_error_follows_policy(facts_file, monkeypatch, caplog, on_error, expected_rc):
    path, data = facts_file
    data["policy"]["on_error"] = on_error
    path.write_text(json.dumps(data))
    submit_hook.init(str(path))

    def broken(job, facts, release=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(submit_hook, "apply", broken)
    with caplog.at_level(logging.ERROR, logger="gpushare.submit"):
        rc, changes, message = submit_hook.job_submit({"tres_per_node": "gres:gpu:1"}, 7)
    assert (rc, changes) == (expected_rc, {})
    assert "boom" in caplog.text and "uid 7" in caplog.text
    assert (message != "") == (on_error == "reject")
    monkeypatch.setattr(submit_hook, "apply_modify", broken)
    assert submit_hook.job_modify({"tres_per_node": "gres:gpu:1"}, 7) == (0, {}, "")


def test_modify_applies_gres_rules_only(facts_file):
    submit_hook.init(str(facts_file[0]))
    rc, changes, _ = submit_hook.job_modify(
        {"tres_per_node": "gres:gpu:H100:1", "min_nodes": 4}, 0)
    assert (rc, changes) == (0, {"tres_per_node": "gres:gpu:h100:1"})
    assert submit_hook.job_modify({"min_nodes": 4}, 0) == (0, {}, "")


@pytest.mark.parametrize("number, rc", [(0x1A0505, 2072), (0x190B02, 0), (None, 0)])
def test_the_running_release_reaches_the_rules(number, rc):
    """job_submit/gpushare is told the release it was built for (26.05.5, 25.11.2, none):
    only 26.05 refuses --gpus-per-node beside --gres=gpu, in a submission and an update."""
    submit_hook.init(facts_path("a100-2311"), number)
    job = {"tres_per_node": "gres/gpu:2,gres/gpu:1"}
    for entry in (submit_hook.job_submit, submit_hook.job_modify):
        got, changes, message = entry(job, 1000)
        assert (got, changes) == (rc, {})
        assert ("and Slurm 26.05 no longer takes both; ask once, e.g. --gres=gpu:1 or "
                "--gpus-per-node=1" in message) == (rc != 0)


def test_a_segment_slurm_24_11_cannot_place_is_refused_there():
    job = {"tres_per_node": "gres/gpu:a100:1", "min_nodes": 4, "segment_size": 4}
    submit_hook.init(facts_path("block-2311"), 0x180B05)  # 24.11.5
    assert submit_hook.job_submit(job, 1000)[0] == 2072
    submit_hook.init(facts_path("block-2311"), 0x190B00)  # 25.11.0: kept, and said
    rc, changes, message = submit_hook.job_submit(job, 1000)
    assert (rc, changes) == (0, {}) and "--segment=4 kept" in message
