# SPDX-License-Identifier: GPL-2.0-or-later
"""The plan's owners for one node: compiled once, read back cheaply, refused when unsafe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gpushare.admin.plan import load_plan
from gpushare.node.ownership import OwnersError, compile_node, node_owners, owner_of

REPO = os.path.join(os.path.dirname(__file__), "..", "..", "..")
EXAMPLE = os.path.join(REPO, "etc", "plan.example.yaml")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the plan must be root's")


def test_each_slice_of_a_gpu_shared_with_kubernetes_has_its_own_owner():
    gpus = compile_node(load_plan(EXAMPLE), "a100-01")
    assert gpus is not None
    assert owner_of(gpus, 2) == "mixed"
    assert owner_of(gpus, 2, "1g.5gb") == "slurm"
    assert owner_of(gpus, 2, "3g.20gb") == "kubernetes"
    assert owner_of(gpus, 0, "2g.10gb") == "kubernetes"
    assert owner_of(gpus, 3, "1g.5gb") == "slurm"
    assert owner_of(gpus, 9) == "unplanned"
    assert compile_node(load_plan(EXAMPLE), "no-such-node") is None


def _root_plan(tmp_path) -> str:
    etc = tmp_path / "etc"
    etc.mkdir()
    for path in (tmp_path, etc):
        path.chmod(0o755)
    plan = etc / "plan.yaml"
    shutil.copy(EXAMPLE, plan)
    plan.chmod(0o644)
    return str(plan)


def test_the_node_part_is_compiled_once_and_recompiled_when_the_plan_changes(tmp_path):
    plan = _root_plan(tmp_path)
    state = str(tmp_path / "state")
    first = node_owners(plan, "a100-01", state)
    compiled = tmp_path / "state" / "owners-a100-01.json"
    assert json.loads(compiled.read_text())["gpus"][2][1]["1g.5gb"] == "slurm"
    # Read back without the plan's parser: a prolog pays neither PyYAML nor the checks.
    code = ("import sys; from gpushare.node.ownership import node_owners; "
            f"print(node_owners({plan!r}, 'a100-01', {state!r})[2]); "
            "print('gpushare.admin.plan' in sys.modules, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "src")))
    assert out.stdout.splitlines()[-1] == "False False", out.stdout
    assert node_owners(plan, "a100-01", state) == first
    # The plan edited: GPU 2 given whole to Kubernetes; the next job sees it at once.
    with open(plan) as handle:
        text = handle.read()
    text = text.replace(
        "          - {profile: 1g.5gb, count: 2, owner: slurm}",
        "          - {profile: 1g.5gb, count: 2, owner: kubernetes}")
    with open(plan, "w") as handle:
        handle.write(text)
    assert owner_of(node_owners(plan, "a100-01", state), 2, "1g.5gb") == "kubernetes"


def test_a_plan_others_can_change_is_refused(tmp_path):
    plan = _root_plan(tmp_path)
    os.chmod(plan, 0o666)
    with pytest.raises(OwnersError, match="must be owned by root and not writable"):
        node_owners(plan, "a100-01", str(tmp_path / "state"))
    os.chmod(plan, 0o644)
    os.chown(plan, 65534, 65534)
    with pytest.raises(OwnersError, match="must be owned by root"):
        node_owners(plan, "a100-01", str(tmp_path / "state"))


def test_a_broken_plan_is_named(tmp_path):
    plan = _root_plan(tmp_path)
    with open(plan, "w") as handle:
        handle.write("version: 1\nnode_groups: [\n")
    with pytest.raises(OwnersError, match=rf"ownership plan {plan}: "):
        node_owners(plan, "a100-01", str(tmp_path / "state"))


def test_a_gpu_tidal_lent_is_its_borrowers_on_the_node_until_it_comes_home(tmp_path):
    from tests.unit.admin.test_tidal_apply import PLAN as LENDING_PLAN

    from gpushare.admin.plan.lending import Device
    from gpushare.admin.tidal.state import STATE_NAME, Lent, TidalState, dump_state
    from gpushare.node.ownership import TIDAL_STATE

    assert TIDAL_STATE == STATE_NAME
    plan = _root_plan(tmp_path)
    with open(plan, "w") as handle:
        handle.write(LENDING_PLAN)
    state_dir = str(tmp_path / "state")
    assert owner_of(node_owners(plan, "h1", state_dir), 0) == "kubernetes"
    lent = tmp_path / "etc" / STATE_NAME
    state = TidalState(str(lent), {Device("h1", 0): Lent("night", 1767225600.0)})
    lent.write_text(dump_state(state))
    lent.chmod(0o644)
    assert owner_of(node_owners(plan, "h1", state_dir), 0) == "slurm"
    assert owner_of(node_owners(plan, "h2", state_dir), 0) == "kubernetes"
    lent.chmod(0o666)  # anyone could lend themselves a GPU: refused
    with pytest.raises(OwnersError, match=r"what gpushare tidal lent, .*tidal-state.json: "
                       r".*must be owned by root and not writable"):
        node_owners(plan, "h1", state_dir)
    lent.unlink()
    assert owner_of(node_owners(plan, "h1", state_dir), 0) == "kubernetes"
