# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check`` as HealthCheckProgram also compiles the plan for the node's prologs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpushare.cli import main
from gpushare.node.ownership import node_owners

PLAN = Path(__file__).resolve().parents[3] / "etc" / "plan.example.yaml"
NODE = "a100-01"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A node's slurm.conf directory whose plugstack line names ``plan.yaml``."""
    plan = tmp_path / "plan.yaml"
    shutil.copy(PLAN, plan)
    plan.chmod(0o644)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("")
    monkeypatch.setenv("SLURM_CONF", str(etc / "slurm.conf"))
    return tmp_path


def plugstack(site: Path, plan: Path) -> None:
    (site / "etc" / "plugstack.conf").write_text(
        f"required /usr/lib64/slurm/spank_gpushare.so state_dir={site}/state/%n "
        f"plan={plan}\n")


def run_check(capsys, plan: Path) -> None:
    main(["check", "--plan", str(plan), "--node", NODE, "--source", "none", "--gres-conf",
          "none"])
    capsys.readouterr()


def test_the_plan_is_compiled_for_the_prologs_of_the_node(site, capsys):
    plugstack(site, site / "plan.yaml")
    run_check(capsys, site / "plan.yaml")
    compiled = site / "state" / NODE / f"owners-{NODE}.json"
    data = json.loads(compiled.read_text())
    assert (data["plan"], data["node"]) == (str(site / "plan.yaml"), NODE)
    stamp = compiled.stat().st_mtime_ns
    # What the node's prologs read: the same answer, from the compiled file as it is.
    owners = node_owners(str(site / "plan.yaml"), NODE, str(site / "state" / NODE))
    assert owners is not None and [list(o) for o in owners] == data["gpus"]
    assert compiled.stat().st_mtime_ns == stamp


def test_a_plan_the_plugin_does_not_use_is_not_compiled(site, capsys):
    other = site / "other.yaml"
    shutil.copy(PLAN, other)
    plugstack(site, other)
    run_check(capsys, site / "plan.yaml")
    assert not (site / "state").exists()
    plugstack(site, site / "plan.yaml")
    (site / "etc" / "plugstack.conf").write_text("")  # no gpushare line at all
    run_check(capsys, site / "plan.yaml")
    assert not (site / "state").exists()
