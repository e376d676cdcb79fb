# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout node``: the node's step, one GPU of this node to one layout of its
group's menu, run as root on a drained node (the controller runs it through
--node-command). With --apply it holds the node's lock, so a step that a killed run left
behind and the next run's step never change the node's GPUs at once."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import Any

from gpushare.cli import fail, plan_problems

__all__ = ["LOCK_WAIT_S", "run", "state_path"]

# Every gpushare command imports this module (the parser's help): the relayout packages, and
# the python-hostlist they need, are imported only when the step runs.

# How long the node's step waits for another step's lock on the node (one finishing now)
# before it refuses: a step that holds it longer is one a killed run left behind.
LOCK_WAIT_S = 10.0


def run(args: argparse.Namespace) -> int:
    """The node's step: one GPU of this node to one layout of its group's menu."""
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.plan.model import with_slurm_version
    from gpushare.admin.relayout.settings import EXIT_UNKNOWN
    from gpushare.admin.slurm_client import installed_release
    from gpushare.cli import nodeconf

    if args.gpu is None or args.layout is None:
        return fail("relayout node", "give --gpu N and --layout L")
    if not 1 <= args.step_timeout <= 3600:
        return fail("relayout node", "--step-timeout must be between 1 and 3600 seconds")
    if args.gres_conf != "none" and not args.gres_conf.startswith("/"):
        return fail("relayout node", "--gres-conf must be an absolute path or none")
    node = args.node or nodeconf.this_node()
    try:
        plan = load_plan(args.plan)
    except PlanError as err:
        return fail("relayout node", plan_problems(err))
    # The release the node runs, as the controller takes it, where the plan names none.
    release = None if plan.slurm.version_given else installed_release(args.sinfo,
                                                                       args.timeout)
    if release:
        plan = with_slurm_version(plan, release)
    round_layouts: dict[int, str] = {}
    for item in filter(None, args.round.split(",")):
        gpu_text, _sep, layout_text = item.partition("=")
        if not gpu_text.strip().isdigit() or not layout_text.strip():
            return fail("relayout node", f"--round: {item!r} is not N=LAYOUT")
        round_layouts[int(gpu_text)] = layout_text.strip()
    if not args.apply:
        return _node_step(args, plan, node, round_layouts)
    from gpushare.admin.relayout.journal import JournalError, LockBusy, held

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", node):
        return fail("relayout node", f"{node!r} is not a Slurm node name")
    if not args.lock_dir.startswith("/"):
        return fail("relayout node", "--lock-dir must be an absolute path")
    why = _in_service(args, node)
    if why:
        return fail("relayout node", f"GPU {args.gpu} of node {node} not changed: {why}")
    path = os.path.join(args.lock_dir, f"relayout-{node}.lock")
    with contextlib.ExitStack() as stack:
        try:
            _lock_dir(args.lock_dir)
            stack.enter_context(held(
                path, f"another relayout step holds node {node} ({{holder}}; lock {{path}}): "
                "it may still be changing a GPU, so this GPU's layout is not known; once "
                "that step has ended (or been killed), check the node with gpushare check "
                "and resume it", wait_s=min(LOCK_WAIT_S, args.step_timeout),
                record={"gpu": args.gpu, "layout": args.layout},
                advice="run the node's step as root on the node (or name a --lock-dir it "
                "may write)"))
        except LockBusy as err:
            fail("relayout node", str(err))
            return EXIT_UNKNOWN
        except (JournalError, OSError) as err:  # nothing changed yet
            return fail("relayout node", f"cannot take node {node}'s lock {path}: {err}")
        return _node_step(args, plan, node, round_layouts)


def _in_service(args: argparse.Namespace, node: str) -> str:
    """Why slurmctld may have or start a job on ``node`` ("" when it shows the node drained,
    or down, with no job on it): destroying a MIG instance under a job that holds it, even
    one with no process on the GPU yet, breaks that job. A GPU already checked free of
    processes may be changed without asking (``--unchecked``) where slurmctld is down."""
    from gpushare.admin.slurm_client import SlurmClientError, parse_scontrol_nodes, run_slurm

    if args.unchecked:
        return ""
    if not args.scontrol.startswith("/"):
        return f"{args.scontrol}: give the Slurm command as an absolute path"
    try:
        found = parse_scontrol_nodes(run_slurm([args.scontrol, "-d", "show", "-o", "node", node],
                                          args.timeout))
    except SlurmClientError as err:
        return (f"slurmctld cannot say whether the node is drained ({err}); where slurmctld "
                "is down and the node out of service all the same, give --unchecked")
    state = next((n for n in found if n.name == node), None)
    if state is None:
        return f"slurmctld does not know node {node} (--node names the Slurm node)"
    busy = sorted({"ALLOCATED", "MIXED", "COMPLETING"} & set(state.states))
    shown = "+".join(state.states)
    if busy:
        return (f"slurmctld shows it {shown}: a job holds it; drain the node (scontrol "
                f"update NodeName={node} State=DRAIN Reason=...) and wait until it is idle")
    if not (state.draining or state.down):
        return (f"slurmctld shows it {shown}, so a job may start on it meanwhile; drain it "
                f"first (scontrol update NodeName={node} State=DRAIN Reason=...)")
    return ""


def _lock_dir(directory: str) -> None:
    """The node's lock directory, made if missing: root's, checked root-owned all the way
    (a user's directory could hold a lock file that stops every step)."""
    from gpushare.common import safefs

    if os.geteuid() == 0:
        try:
            os.close(safefs.open_root_dir(directory, create=True))
        except safefs.UnsafePathError as err:
            raise OSError(str(err)) from None
    else:
        os.makedirs(directory, exist_ok=True)


def _node_step(args: argparse.Namespace, plan: Any, node: str,
               round_layouts: dict[int, str]) -> int:
    """The node's step once its options are checked (with --apply, under the node's lock)."""
    from gpushare.admin.relayout.apply import (
        ApplyError,
        apply_layout,
        render_node_gres,
        write_atomically,
    )
    from gpushare.admin.relayout.settings import EXIT_UNKNOWN
    from gpushare.admin.relayout.state import StateError, load_state
    from gpushare.gpu.inventory import MIG_MINORS_PATH, collect, load_nvml
    from gpushare.gpu.nvml import SIM_PREFIX, InventoryError

    state_file = state_path(args)

    try:
        applied = load_state(state_file).gpus.get((node, args.gpu)) if state_file else None
    except StateError as err:
        return fail("relayout node", str(err))
    try:
        nvml = load_nvml(args.source)
        result = apply_layout(nvml, plan, node, args.gpu, args.layout,
                              timeout_s=args.step_timeout, dry_run=not args.apply,
                              round_layouts=round_layouts,
                              recorded=applied.layout if applied else None)
    except ApplyError as err:
        code = fail("relayout node", str(err))
        return EXIT_UNKNOWN if err.unknown else code
    except InventoryError as err:
        return fail("relayout node", str(err))
    if not result.changed:
        print(f"GPU {result.gpu} of node {node} already has layout {result.new}")
    elif not args.apply:
        print(f"GPU {result.gpu} of node {node}: {result.old} -> {result.new} (dry run; "
              "--apply changes it)")
    else:
        print(f"GPU {result.gpu} of node {node}: {result.old} -> {result.new}")
    for step in result.steps:
        print(f"  {step}")
    if not args.apply:
        return 0
    if result.changed and state_file:
        try:
            _record(state_file, node, args.gpu, result.new, args.decision)
        except (OSError, ValueError) as err:
            print(f"gpushare relayout node: the GPU changed, but {state_file} was not "
                  f"updated: {err}", file=sys.stderr)
            return EXIT_UNKNOWN
    if args.gres_conf == "none":
        return 0
    try:
        if args.source.startswith(SIM_PREFIX):
            minors, device_dir, host = nvml.mig_minors_text, nvml.device_dir, nvml.hostname
        else:
            with open(MIG_MINORS_PATH, encoding="ascii", errors="replace") as f:
                minors, device_dir, host = f.read(), "/dev", node
        inventory = collect(nvml, args.source, minors, device_dir, host or node,
                            topology=False)
        write_atomically(args.gres_conf,
                         render_node_gres(plan, node, args.gpu, args.layout, inventory))
    except (ApplyError, InventoryError, OSError, ValueError) as err:
        fail("relayout node", f"the GPU changed, but {args.gres_conf} was not "
             f"rewritten: {err}")
        return EXIT_UNKNOWN
    from gpushare.admin.plan.model import release_tuple

    restart = (", then restart slurmctld (Slurm before 23.11 takes a node's new GPU count "
               "only then)" if release_tuple(plan.slurm.version) < (23, 11) else "")
    print(f"rewrote {args.gres_conf}; for Slurm to see it: set the node's Gres= in "
          "slurm.conf (gpushare check --cluster says what it should be), restart slurmd, "
          f"run `scontrol reconfigure`{restart}, and resume the node")
    return 0


def state_path(args: argparse.Namespace) -> str:
    """--state, else relayout-state.json beside the plan; "" for none."""
    from gpushare.admin.relayout.state import default_path

    if args.state == "none":
        return ""
    return args.state or default_path(args.plan)


def _record(path: str, node: str, index: int, layout: str, decision: str) -> None:
    """The node's own copy of the state learns what this step applied (the controller
    writes the same entry into its copy; where the file is shared both are one)."""
    import time

    from gpushare.admin.relayout.state import Applied, locked

    with locked(path) as state:
        state.gpus[(node, index)] = Applied(layout, time.time(), decision)
