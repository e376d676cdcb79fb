# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --apply``: one run at a time, the repair of what a killed run left,
then the round, each node's outcome reported."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any, Callable

from gpushare.cli import fail

__all__ = ["DEFAULT_SLURMCTLD_RESTART", "apply", "locked_round", "restart_command",
           "slurm_version"]

DEFAULT_SLURMCTLD_RESTART = "systemctl restart slurmctld"


def locked_round(args: argparse.Namespace, plan: Any, menus: Any, state_path: str,
                 round_fn: Callable[[argparse.Namespace, Any, Any, str], int]) -> int:
    """Hold the run lock; finish or roll back what a killed run left (a run that cannot
    stops there); then decide and apply (``round_fn``)."""
    from gpushare.admin.relayout.journal import JournalError, LockBusy, load_journal, run_lock

    try:
        with run_lock(state_path):
            journal = load_journal(state_path)
            if journal is not None and journal.open_nodes:
                status = _recover(args, plan, journal, state_path)
                if status:
                    return status
            return round_fn(args, plan, menus, state_path)
    except LockBusy as err:
        return fail("relayout", str(err))
    except (JournalError, OSError) as err:
        return fail("relayout", f"{err}; nothing was changed")


def slurm_version(plan: Any) -> str:
    """The Slurm release the plan names, else the installed one's."""
    from gpushare.admin.slurm_client import installed_release

    return plan.slurm.version if plan.slurm.version_given else \
        (installed_release() or plan.slurm.version)


def restart_command(option: Any, version: str) -> str:
    """--slurmctld-restart as given: by default systemctl's before 23.11 (whose reconfigure
    keeps a node's GPU count) and none from 23.11; "none": never."""
    from gpushare.admin.plan.model import release_tuple

    if option is None:
        return DEFAULT_SLURMCTLD_RESTART if release_tuple(version) < (23, 11) else ""
    return "" if option == "none" else str(option)


def _settings(args: argparse.Namespace, version: str, state_path: str) -> Any:
    """The Settings the options give; ValueError saying which option is wrong."""
    from gpushare.admin.relayout.controller import Settings, command_argv
    from gpushare.admin.relayout.menu import one_profile_per_node

    slurmctld_restart = restart_command(args.slurmctld_restart, version)
    for option, value in (("--drain-timeout", args.drain_timeout),
                          ("--settle-timeout", args.settle_timeout)):
        if value is not None and not 1 <= value <= 86400:
            raise ValueError(f"{option} must be between 1 and 86400 seconds")
    if not 1 <= args.step_timeout <= 3600:
        raise ValueError("--step-timeout must be between 1 and 3600 seconds")
    if not 1 <= args.parallel <= 64:
        raise ValueError("--parallel must be between 1 and 64")
    for option, template in (("--node-command", args.node_command),
                             ("--slurmd-restart", args.slurmd_restart),
                             ("--slurmctld-restart", slurmctld_restart)):
        try:
            if template or option == "--node-command":
                command_argv(template)
        except ValueError as err:
            raise ValueError(f"{option}: {err}") from None
    slurm_conf = args.slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if args.cluster_gres_conf and not args.cluster_gres_conf.startswith("/"):
        raise ValueError("--cluster-gres-conf must be an absolute path")
    return Settings(node_command=args.node_command, slurmd_restart=args.slurmd_restart,
                    slurm_conf=slurm_conf, state_path=state_path,
                    cluster_gres_conf=args.cluster_gres_conf,
                    slurmctld_restart=slurmctld_restart,
                    one_profile_per_node=one_profile_per_node(version),
                    drain_timeout_s=args.drain_timeout or args.max_drain,
                    step_timeout_s=args.step_timeout, settle_timeout_s=args.settle_timeout,
                    parallel=args.parallel)


def _slurm(args: argparse.Namespace, settings: Any) -> Any:
    """scontrol, and whether slurmctld serves slurm.conf (configless)."""
    from gpushare.admin.relayout.controller import Scontrol

    slurm = Scontrol(args.scontrol, args.timeout)
    settings.configless = slurm.configless()
    return slurm


def _report(args: argparse.Namespace, outcomes: list[Any]) -> int:
    status = 0
    for outcome in outcomes:
        status = max(status, 2 if outcome.failed else 1 if outcome.skipped else 0)
        if args.json:
            continue
        for line in outcome.log:
            print(line)
        if outcome.failed:
            print(f"{outcome.node}: LEFT DRAINED: {outcome.failed}")
        elif outcome.skipped:
            print(f"{outcome.node}: unchanged: {outcome.skipped}")
    return status


def _nodes_json(outcomes: list[Any]) -> list[dict[str, Any]]:
    return [{"node": o.node, "applied": [[c.index, c.new] for c in o.applied],
             "restored": [[c.index, why] for c, why in o.restored],
             "failed": o.failed, "skipped": o.skipped, "log": o.log} for o in outcomes]


def _recover(args: argparse.Namespace, plan: Any, journal: Any, state_path: str) -> int:
    """Finish or roll back an interrupted run's nodes; non-zero when one is still open (no
    new round starts then)."""
    from gpushare.admin.plan.model import with_slurm_version
    from gpushare.admin.relayout.controller import recover
    from gpushare.admin.slurm_client import SlurmClientError

    version = slurm_version(plan)
    try:
        settings = _settings(args, version, state_path)
        slurm = _slurm(args, settings)
    except (ValueError, SlurmClientError) as err:
        return fail("relayout", str(err))
    if not args.json:
        print(f"an interrupted run ({journal.decision}) left "
              + ", ".join(e.node for e in journal.open_nodes) + " unsettled; settling first")
    outcomes = recover(with_slurm_version(plan, version), journal, slurm, settings)
    status = _report(args, outcomes)
    if args.json:  # stdout stays the round's one JSON document
        print(json.dumps({"recovered": journal.decision, "nodes": _nodes_json(outcomes)},
                         indent=2), file=sys.stderr)
    if journal.open_nodes:
        return fail("relayout", "an interrupted run's nodes "
                    + ", ".join(e.node for e in journal.open_nodes) + " are still unsettled "
                    f"({journal.path}); no new round starts until they are")
    return 2 if status == 2 else 0


def apply(args: argparse.Namespace, plan: Any, decision: Any, state_path: str,
          version: str, text: str, payload: dict[str, Any]) -> int:
    """Carry the decision out; 0 when every node is back in service (changed or laid back
    unchanged), 1 when a node was left as it was, 2 when one is left drained or nothing
    could start (slurm.conf cannot take the new Gres=). ``text`` and ``payload``: the
    decision as printed and as JSON."""
    from gpushare.admin.relayout.controller import RelayoutError, apply_decision
    from gpushare.admin.slurm_client import SlurmClientError

    try:
        settings = _settings(args, version, state_path)
    except ValueError as err:
        return fail("relayout", str(err))
    decision_id = "r" + datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if not args.json:
        print(text)
    try:
        slurm = _slurm(args, settings)
        outcomes = apply_decision(plan, decision, decision_id, slurm, settings)
    except (SlurmClientError, RelayoutError) as err:
        return fail("relayout", str(err))
    status = _report(args, outcomes)
    if args.json:
        payload["decision_id"] = decision_id
        payload["nodes"] = _nodes_json(outcomes)
        print(json.dumps(payload, indent=2))
    return status
