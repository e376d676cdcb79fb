# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check`` as HealthCheckProgram also compiles the plan for the node's prologs."""

from __future__ import annotations

import argparse
import json
import os
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


PROFILE = Path(__file__).resolve().parents[3] / "src" / "gpushare" / "gpu" / "profiles" / \
    "a100-mig-mixed.json"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's check prepares the prologs")
@pytest.mark.parametrize("reuse", ["60", "0"])
def test_the_check_leaves_nvmls_answer_for_the_prologs_of_the_node(site, capsys, reuse):
    """Run as HealthCheckProgram, the check leaves what NVML said where the node's shared
    jobs' checks look first (verify_reuse=), when the plugin's line asks the same source."""
    from gpushare.cli import nodeconf
    from gpushare.node import inventory_cache
    from gpushare.node.job import checked_files

    profile = site / "node.json"
    shutil.copy(PROFILE, profile)
    (site / "etc" / "plugstack.conf").write_text(
        f"required /usr/lib64/slurm/spank_gpushare.so state_dir={site}/state/%n "
        f"plan={site / 'plan.yaml'} inventory=sim:{profile} verify_reuse={reuse}\n")
    (site / "etc" / "gres.conf").write_text("")
    args = ["check", "--plan", str(site / "plan.yaml"), "--node", NODE, "--gres-conf",
            str(site / "etc" / "gres.conf")]
    main([*args, "--source", f"sim:{PROFILE}"])  # not the plugin's source: nothing left
    state = site / "state" / NODE
    assert not (state / inventory_cache.FILE_NAME).exists()
    main([*args, "--source", f"sim:{profile}"])
    capsys.readouterr()
    if reuse == "0":
        assert not (state / inventory_cache.FILE_NAME).exists()
        return
    config, _ = nodeconf.load(argparse.Namespace(plugstack=None, node=NODE))
    found = inventory_cache.load(config.state_dir, f"sim:{profile}",
                                 checked_files(config, os.environ), 60)
    assert found is not None and found.checks == {}
    assert [g.uuid for g in found.inventory().gpus] == \
        [g["uuid"] for g in json.loads(PROFILE.read_text())["gpus"]]
    # An edited gres.conf, as for a prolog's own answer, makes the prologs ask NVML.
    (site / "etc" / "gres.conf").write_text("# edited\n")
    assert inventory_cache.load(config.state_dir, f"sim:{profile}",
                                checked_files(config, os.environ), 60) is None


@pytest.mark.parametrize("drain, severities, status", [
    (False, ["warning"], 1), (True, ["warning"], 0), (True, [], 0),
    (False, ["warning", "error"], 2)])
def test_as_health_check_warnings_alone_are_no_failure(capsys, drain, severities, status):
    """slurmd logs every non-zero HealthCheckProgram status as a failed health check."""
    from gpushare.cli.check import _report
    from gpushare.node.verify import Finding

    args = argparse.Namespace(drain=drain, cluster=False, all_nodes=False, json=False,
                              scontrol="/nonexistent/scontrol", timeout=1.0)
    findings = [Finding(severity, f"{severity} found", "here", "mend it")
                for severity in severities]
    assert _report(args, NODE, findings, "none") == status
    out = capsys.readouterr().out
    assert all(f"{severity} found" in out for severity in severities)


def test_all_nodes_without_a_gres_conf_says_what_it_needs(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.read_text())
    assert main(["check", "--plan", str(plan), "--all-nodes", "--gres-conf", "none"]) == 2
    err = capsys.readouterr().err
    assert "cannot read none" not in err
    assert "--all-nodes checks a cluster-wide gres.conf against the plan: give it with " \
        "--gres-conf FILE" in err


@pytest.mark.parametrize("scope, argv", [("all nodes", ["--all-nodes"]),
                                         ("cluster", ["--cluster"])])
def test_a_plan_error_names_the_scope_asked_about_not_this_host(tmp_path, capsys, scope, argv):
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\nnode_groups: []\n")
    assert main(["check", "--plan", str(plan), "--node", "here", *argv,
                 "--gres-conf", str(tmp_path / "gres.conf")]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"gpushare check: {scope}: 1 error(s)"), out
