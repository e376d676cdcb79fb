# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check``: compare the node's gres.conf, its GPUs and the ownership plan (or, with
``--cluster``, slurmctld's view of every node); usable as slurm.conf's HealthCheckProgram."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from gpushare.cli import add_slurm_arguments, fail, nodeconf

DEFAULT_PLAN = "/etc/gpushare/plan.yaml"
DEFAULT_GRES_CONF = "/etc/slurm/gres.conf"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="check this node (or the cluster) against the ownership plan",
        description="Compare the node's real gres.conf, its GPUs (NVML or a simulated profile) "
        "and the ownership plan; print each finding with where it is and how to fix it. Exit "
        "status: 0 all well, 1 warnings, 2 errors. As slurm.conf's HealthCheckProgram, "
        "--drain drains the node with a readable reason when there is an error; with --drain "
        "warnings alone exit 0, as slurmd logs every other status as a failed health check "
        "(the warnings are in the output). Run as root "
        "on a node whose plugstack line names the same plan=, it also compiles the plan for "
        "the plugin's prologs (<state_dir>/owners-<node>.json), and where the line names the "
        "same inventory= source, it leaves NVML's answer for their GPU checks "
        "(<state_dir>/inventory.json, used for verify_reuse= seconds). A plan whose "
        "slurm.version is not the running Slurm's release is reported: an error on the "
        "controller (--cluster, --all-nodes) where what is rendered from it cannot work "
        "there, else a warning. On a node whose plugstack line has the plugin, it also warns "
        "where kernel.yama.ptrace_scope is 0 or the kernel has no Yama: a job could take "
        "over its user's MPS daemon, which runs outside the job's cgroup.",
        epilog="examples:\n"
        "  gpushare check --plan /etc/gpushare/plan.yaml\n"
        "  gpushare check --plan plan.yaml --source sim:/path/node.json --json\n"
        "  gpushare check --plan plan.yaml --cluster\n"
        "  slurm.conf: HealthCheckProgram=/usr/bin/gpushare-check  (a wrapper running\n"
        "              gpushare check --drain)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--plan", default=DEFAULT_PLAN, metavar="FILE",
                        help=f"the ownership plan (default {DEFAULT_PLAN})")
    parser.add_argument("--gres-conf", default=DEFAULT_GRES_CONF, metavar="FILE",
                        help=f"the node's gres.conf (default {DEFAULT_GRES_CONF}; 'none' skips "
                        "it; --all-nodes needs one)")
    parser.add_argument("--source", default="nvml", metavar="nvml|sim:PATH|none",
                        help="where the node's GPU facts come from (default nvml)")
    parser.add_argument("--node", metavar="NAME",
                        help="Slurm node name (default $SLURMD_NODENAME, else the short host "
                        "name)")
    parser.add_argument("--device-root", metavar="DIR",
                        help="directory of the device files in gres.conf (default: the plan's)")
    parser.add_argument("--cluster", action="store_true",
                        help="compare slurmctld's view of every node with the plan instead")
    parser.add_argument("--all-nodes", action="store_true",
                        help="check a cluster-wide gres.conf against the plan for every node "
                        "(no inventory; e.g. on the controller before distributing it)")
    parser.add_argument("--state", metavar="FILE",
                        help="the layouts `gpushare relayout` applied (default "
                        "relayout-state.json beside the plan, when it exists; 'none': the "
                        "plan's alone)")
    parser.add_argument("--proc-root", default="/proc", metavar="DIR",
                        help="where the kernel's settings and mounts are read (default "
                        "/proc; sys/kernel/yama/ptrace_scope and self/mountinfo below it)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--drain", action="store_true",
                        help="on errors, drain this node with a reason naming the worst one")
    add_slurm_arguments(parser, "--cluster: ")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin import check
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.relayout.state import StateError, as_applied
    from gpushare.admin.slurm_client import SlurmClientError, installed_release, open_client
    from gpushare.gpu.gresconf import GresConfError, load_gres_conf
    from gpushare.gpu.nvml import InventoryError

    for option, path in (("--scontrol", args.scontrol), ("--sinfo", args.sinfo)):
        if not path.startswith("/"):
            return fail("check", f"{option} must be an absolute path, not {path!r}")
    if not 0.1 <= args.timeout <= 600:
        return fail("check", "--timeout must be between 0.1 and 600 seconds")
    if args.all_nodes and args.gres_conf == "none":
        return fail("check", "--all-nodes checks a cluster-wide gres.conf against the plan: "
                    f"give it with --gres-conf FILE (default {DEFAULT_GRES_CONF}), not none")
    node = args.node or nodeconf.this_node()
    # What a plan or state problem is reported for: the scope asked about, not this host.
    scope = "cluster" if args.cluster else "all nodes" if args.all_nodes else node
    try:
        plan = load_plan(args.plan)
    except PlanError as err:
        findings = [check.Finding(check.ERROR, p.split(": ", 1)[-1], p.split(": ", 1)[0],
                                  "fix the plan") for p in err.problems]
        return _report(args, scope, findings, "plan")
    try:
        plan = as_applied(plan, args.state)
    except StateError as err:
        where, _sep, what = str(err).partition(": ")
        return _report(args, scope, [check.Finding(
            check.ERROR, what, where, "fix or remove the relayout state file")], "state")
    release = check.check_release(plan, installed_release(args.sinfo, args.timeout),
                                  controller=args.cluster or args.all_nodes)
    if args.cluster or args.all_nodes:
        release += check.check_lending(plan)
    if args.cluster:
        try:
            client = open_client(args.backend, args.sinfo, args.scontrol, args.timeout)
            findings = release + check.check_cluster(plan, client.nodes())
        except SlurmClientError as err:
            return fail("check", str(err))
        findings += _accounting(plan, args)
        return _report(args, "cluster", findings, client.backend)
    if args.all_nodes:
        try:
            conf = load_gres_conf(args.gres_conf)
        except GresConfError as err:
            return fail("check", str(err))
        findings = release + check.check_gres_all_nodes(plan, conf, args.device_root)
        return _report(args, "all nodes", findings, args.gres_conf)
    findings = release
    gres = inventory = None
    if args.gres_conf != "none":
        try:
            gres = load_gres_conf(args.gres_conf)
        except GresConfError as err:
            findings.append(check.Finding(check.ERROR, str(err), args.gres_conf,
                                          "fix gres.conf or render it from the plan"))
    asked = time.time()
    if args.source != "none":
        try:
            from gpushare.gpu.inventory import open_inventory

            inventory = open_inventory(args.source)
        except InventoryError as err:
            findings.append(check.Finding(check.ERROR, f"cannot read the GPUs: {err}",
                                          args.source, "see the message; nvidia-smi should "
                                          "work on the node"))
    findings.extend(check.check_node(plan, node, gres, inventory, args.device_root))
    findings.extend(_state_findings(node, args.proc_root))
    _prepare_for_prologs(args, node, inventory, asked)
    return _report(args, node, findings, args.source)


def _state_findings(node: str, proc_root: str) -> list[Any]:
    """Where the plugin's state lives on this node, by its plugstack line, and whether its
    users can take over their MPS daemons (none without a line: no daemons here)."""
    from gpushare.admin import check
    from gpushare.node.config import ConfigError

    try:
        config, source = nodeconf.load(argparse.Namespace(plugstack=None, node=node))
    except ConfigError:
        return []
    from gpushare.admin.check_space import space_findings

    node_config = config.for_node(node)
    plugin_here = not source.startswith(nodeconf.DEFAULTS)
    return (space_findings(node_config.state_dir, node_config.mps_space, os.environ)
            + check.check_daemon_cgroup(node_config.mps_cgroup)
            + (check.check_daemon_containment(node_config.mps_cgroup, proc_root)
               + check.check_ptrace_scope(proc_root) if plugin_here else []))


def _prepare_for_prologs(args: argparse.Namespace, node: str, inventory: Any,
                         asked: float) -> None:
    """Leave this node's prologs what this check found, when run as root (slurmd runs
    HealthCheckProgram when it starts, and then every HealthCheckInterval):

    - the plan compiled for the node, when the plugin's line names the same plan, so the
      node's first shared job reads the compiled file instead of parsing the plan;
    - NVML's answer about the GPU layout, when the plugin's line names the same source, so
      a shared job within ``verify_reuse=`` seconds of the check runs its GPU check on it
      instead of asking NVML (gpushare.node.inventory_cache).

    Anything in the way is left to the prologs, which do it themselves."""
    import contextlib
    import os

    from gpushare.node.config import ConfigError
    from gpushare.node.ownership import OwnersError, node_owners

    if os.geteuid() != 0:
        return
    try:
        config, _ = nodeconf.load(argparse.Namespace(plugstack=None, node=node))
    except ConfigError:
        return
    if config.plan and os.path.realpath(config.plan) == os.path.realpath(args.plan):
        with contextlib.suppress(OwnersError):
            node_owners(config.plan, node, config.state_dir)
    source = config.for_node(node).inventory
    if inventory is not None and config.verify_reuse > 0 and args.source == source:
        from gpushare.node import inventory_cache
        from gpushare.node.job import checked_files

        inventory_cache.save(config.state_dir, source, checked_files(config, os.environ),
                             inventory, asked, {})


def _report(args: argparse.Namespace, node: str, findings: list[Any], source: str) -> int:
    """Print the findings; the exit status (with --drain, warnings alone are 0)."""
    status = _print_report(args, node, findings, source)
    return 0 if args.drain and status == 1 else status


def _print_report(args: argparse.Namespace, node: str, findings: list[Any],
                  source: str) -> int:
    from gpushare.admin import check

    status = check.exit_status(findings)
    drained = None
    if args.drain and status == 2 and not (args.cluster or args.all_nodes):
        reason = check.drain_reason(findings)
        failure = check.drain_node(node, reason, args.scontrol, args.timeout)
        drained = {"reason": reason, "ok": failure is None, "error": failure or ""}
    if args.json:
        payload: dict[str, Any] = {"node": node, "source": source, "status": status,
                                   "findings": [f.to_dict() for f in findings]}
        if drained is not None:
            payload["drain"] = drained
        print(json.dumps(payload, indent=2))
        return status
    errors = sum(1 for f in findings if f.severity == check.ERROR)
    warnings = len(findings) - errors
    summary = "all well" if not findings else f"{errors} error(s), {warnings} warning(s)"
    print(f"gpushare check: {node}: {summary}")
    for finding in sorted(findings, key=lambda f: f.severity != check.ERROR):
        print(f"{finding.severity.upper():8}{finding.where}")
        print(f"        {finding.what}")
        print(f"        fix: {finding.fix}")
    if drained is not None:
        if drained["ok"]:
            print(f"drained {node}: {drained['reason']}")
        else:
            print(f"could not drain {node}: {drained['error']}", file=sys.stderr)
    return status


def _accounting(plan: Any, args: argparse.Namespace) -> list[Any]:
    """check_accounting against slurmctld's AccountingStorageTRES; nothing where scontrol
    cannot say (the cluster's other findings stand)."""
    from gpushare.admin import check
    from gpushare.admin.slurm_client import SlurmClientError
    from gpushare.admin.tres import recorded

    if not any(group.relayout is not None for group in plan.groups):
        return []
    try:
        return check.check_accounting(plan, recorded(args.scontrol, args.timeout))
    except SlurmClientError as err:
        return [check.Finding(check.WARNING, f"cannot read AccountingStorageTRES: {err}",
                              "slurmctld", "check that scontrol show config works here")]
