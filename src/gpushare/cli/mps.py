# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare mps``: the node's MPS daemons, whom they serve, and what needs an administrator.

Settings come from the gpushare line of plugstack.conf, so the command sees the state
directory and control program the plugin uses. ``--reap`` does what the node's next
shared job's prolog would: drop references of jobs whose epilog never ran and stop the
daemons left without jobs, under the same locks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from gpushare.cli import fail, nodeconf, text_table
from gpushare.node.config import ConfigError

if TYPE_CHECKING:
    from gpushare.admin.mps_report import DaemonView

__all__ = ["format_views", "register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mps",
        help="show this node's MPS daemons and their jobs; --reap cleans up after lost epilogs",
        description="List the MPS control daemons gpushare runs on this node: owner, "
        "GPUs, the jobs sharing each with their shares, the daemon's caps, and whether it "
        "is running. A problem (a daemon gone while jobs use it, jobs whose epilog never "
        "ran or that slurmctld no longer runs here, a daemon that could not be stopped, "
        "MPS processes whose record is gone) is "
        "printed with what to do. Run as root. "
        "Exit status: 0 all well, 1 a daemon needs attention, 2 the state cannot be read "
        "or --reap failed.",
        epilog="Examples:\n  gpushare mps\n  gpushare mps --json\n"
        "  gpushare mps --reap      # after fixing a node drained for a stuck daemon",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    nodeconf.add_arguments(parser)
    parser.add_argument("--state-dir", metavar="DIR",
                        help="the plugin's state directory, instead of plugstack.conf's")
    parser.add_argument("--reap", action="store_true",
                        help="drop references of jobs without a gpushare record, stop "
                        "daemons left without jobs and MPS processes left without a record, "
                        "then list what remains")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=_run)


def _age(started_at: Optional[float], now: float) -> str:
    if not started_at:
        return "-"
    seconds = max(0, int(now - started_at))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s"


def usage_lines(views: list[DaemonView], usages: dict[int, Any], node_usage: Any,
                now: float) -> list[str]:
    """The clients' (jobs') GPU use per daemon as the node's sampler last saw it, and each
    device's bandwidth hog with what to do."""
    from gpushare.node.usage.view import compact, hog_lines, short

    rows = [["DAEMON", "JOB", "USER", "SHARE", "USE NOW", "PEAK MEMORY", "MEAN SM",
             "MEAN BW"]]
    for view in views:
        for job, share in view.jobs:
            usage = usages.get(int(job)) if str(job).isdigit() else None
            if usage is None:
                continue
            rows.append([view.key, str(job), view.user or "-", f"{share}%",
                         short(usage, now), compact(usage.peak_mem_bytes),
                         *("-" if mean is None else compact(mean, True)
                           for mean in (usage.mean_sm_pct, usage.mean_bw_pct))])
    lines = ["", "GPU use of the daemons' jobs:", *text_table(rows)] if len(rows) > 1 else []
    hogs = hog_lines(node_usage, now)
    if hogs:
        lines += ["", "bandwidth hogs:", *hogs]
    return lines


def _cgroup(key: str, path: str) -> str:
    """The daemon's cgroup; one gpushare made for it names its key (a scope or a child of
    mps_cgroup=), any other it inherited (mps_cgroup=none, or a host without cgroup v2)."""
    if not path:
        return "-"
    return path if key in path else f"none of its own (in {path})"


def format_views(views: list[DaemonView], state_dir: str, source: str,
                 now: Optional[float] = None, usages: Optional[dict[int, Any]] = None,
                 node_usage: Any = None) -> str:
    """The daemons as a table, then each problem under the daemon it concerns, then the
    jobs' GPU use and the bandwidth hogs (when the node's sampler runs)."""
    now = time.time() if now is None else now
    head = f"MPS daemons in {os.path.join(state_dir, 'daemons')} (settings: {source}): {len(views)}"
    if not views:
        return head
    rows = [["DAEMON", "STATUS", "PID", "UP", "USER", "MODE", "DEVICES", "JOBS (SHARE)",
             "CAP", "CGROUP"]]
    for view in views:
        cap = "-" if view.cap_percent is None else f"{view.cap_percent}%"
        if view.mem_limits:
            cap += " " + ",".join(f"{dev}={size}" for dev, size in view.mem_limits)
        rows.append([
            view.key, view.status, str(view.daemon_pid or "-"), _age(view.started_at, now),
            view.user or "-", view.mode or "-", ",".join(view.devices) or "-",
            " ".join(f"{job}:{share}%" for job, share in view.jobs) or "-", cap,
            _cgroup(view.key, view.cgroup),
        ])
    lines = [head, "", *text_table(rows)]
    for view in views:
        lines += [f"{view.key}: {problem}" for problem in view.problems]
    lines += usage_lines(views, usages or {}, node_usage, now)
    return "\n".join(lines)


def _usage(state_dir: str) -> tuple[dict[int, Any], Any]:
    """The jobs' and the node's figures from the usage sampler; none when it does not run
    (or its files cannot be read: the table says nothing rather than fail)."""
    from gpushare.node.usage.store import UsageStore

    store = UsageStore(state_dir)
    try:
        return store.read_all(), store.read_node()
    except (OSError, ValueError) as err:
        print(f"gpushare mps: the jobs' GPU use cannot be read: {err}", file=sys.stderr)
        return {}, None


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin.mps_report import exit_status, inspect_daemons
    from gpushare.node.mps import MpsError

    try:
        config, source = nodeconf.load(args)
    except ConfigError as err:
        return fail("mps", str(err))
    is_root = os.geteuid() == 0
    node = args.node or nodeconf.this_node()
    reaped: list[str] = []
    forgotten: set[int] = set()
    if args.reap:
        if not is_root:
            return fail("mps", "--reap stops other users' daemons: run it as root")
        from gpushare.node.reaper import reap_mps

        try:
            reaped, forgotten = reap_mps(config, node)
        except MpsError as err:
            return fail("mps", f"--reap: {err}")
    try:
        lost: set[int] = set()
        if is_root:  # only root reads the job records; slurmctld is asked once
            from gpushare.node.reaper import lost_jobs
            from gpushare.node.state import JobStore

            lost = lost_jobs(config, JobStore(config.state_dir), node, force=True)
        views = inspect_daemons(config, check_processes=is_root, lost=lost)
    except MpsError as err:
        return fail("mps", str(err))
    except PermissionError as err:
        return fail("mps", f"cannot read the plugin's state in {config.state_dir} ({err.filename}: "
                     "permission denied): it is root's; run gpushare mps as root")
    status = exit_status(views)
    usages, node_usage = _usage(config.state_dir)
    if args.json:
        print(json.dumps({"state_dir": config.state_dir, "settings": source, "node": node,
                          "status": status, "reaped": reaped,
                          "lost_jobs_forgotten": sorted(forgotten),
                          "daemons": [view.to_dict() for view in views],
                          "usage": {str(job): usage.to_dict() for job, usage in usages.items()},
                          "hogs": [d.to_dict() for d in (node_usage.devices if node_usage
                                                         else []) if d.hog]}, indent=2))
        return status
    if forgotten:
        print(f"forgot {len(forgotten)} job(s) slurmctld no longer runs on {node} (their "
              f"epilog was lost): {', '.join(map(str, sorted(forgotten)))}")
    if reaped:
        print(f"stopped {len(reaped)} daemon(s) left without jobs: {', '.join(reaped)}")
    print(format_views(views, config.state_dir, source, usages=usages,
                       node_usage=node_usage))
    if not os.path.isdir(config.state_dir):
        print(f"note: {config.state_dir} does not exist: no job has shared a GPU on {node} "
              "since it booted (the first one's prolog makes it); with several slurmd on one "
              "host, give the node with --node", file=sys.stderr)
    if not is_root and views:
        print("note: not root, so whether each daemon runs is unknown (only root may read "
              "other users' /proc/<pid>/environ)", file=sys.stderr)
    return status
