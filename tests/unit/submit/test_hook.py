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

    def broken(job, facts):
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
