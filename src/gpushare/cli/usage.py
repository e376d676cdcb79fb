# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare usage``: sample what each running job uses of this node's GPUs.

One round by default (a cron job, a test); ``--loop`` samples every ``usage_interval=``
seconds, as the ``gpushare-usage`` service does. Settings come from the gpushare line of
plugstack.conf, so it reads the plugin's state directory and NVML source. The figures go
to ``<state_dir>/usage`` for ``gpushare job``, ``gpushare mps`` and ``gpushare metrics``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from gpushare.cli import fail, nodeconf
from gpushare.node.config import ConfigError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "usage",
        help="sample what each running job uses of this node's GPUs (SM, memory, bandwidth "
        "share), name bandwidth hogs, keep dcgm-exporter's job mapping files",
        description="Read NVML once (or every usage_interval= seconds with --loop): each "
        "running job's SM %, device memory and share of its GPU's or MIG slice's DRAM "
        "bandwidth, labelled measured, estimated or unavailable, written to "
        "<state_dir>/usage for gpushare job, gpushare mps and gpushare metrics. A shared "
        "device whose bandwidth stays above hog_bw_pct= for hog_seconds= names the job with "
        "the largest share, with what to do, in the log (nothing is stopped). With "
        "dcgm_mapping_dir= it keeps dcgm-exporter's --hpc-job-mapping-dir files. Run as "
        "root. Exit status: 0 sampled, 2 the settings, NVML or the state cannot be used.",
        epilog="Examples:\n  gpushare usage\n  gpushare usage --loop --syslog",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    nodeconf.add_arguments(parser)
    parser.add_argument("--state-dir", metavar="DIR",
                        help="the plugin's state directory, instead of plugstack.conf's")
    parser.add_argument("--loop", action="store_true",
                        help="sample every usage_interval= seconds until stopped")
    parser.add_argument("--syslog", action="store_true",
                        help="also send hog lines to syslog (facility daemon, as slurmd)")
    parser.add_argument("--proc-root", default="/proc", metavar="DIR",
                        help="where the node's processes are seen (default /proc)")
    parser.add_argument("--cgroup-root", default="/sys/fs/cgroup", metavar="DIR",
                        help="where the cgroup file system is mounted (default /sys/fs/cgroup)")
    parser.set_defaults(func=_run)


def _log_to(use_syslog: bool) -> None:
    """Hog lines to stderr (the service's journal) and, if asked, to syslog."""
    import logging

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if use_syslog:
        from logging.handlers import SysLogHandler

        if os.path.exists("/dev/log"):
            # The lines start "gpushare: ", as the plugin's do in slurmd's log.
            handlers.append(SysLogHandler("/dev/log", SysLogHandler.LOG_DAEMON))
    logger = logging.getLogger("gpushare.usage")
    logger.setLevel(logging.INFO)
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)


def _run(args: argparse.Namespace) -> int:
    from gpushare.gpu.inventory import load_nvml
    from gpushare.gpu.nvml import InventoryError, describe_nvml_error
    from gpushare.node.state import StateError
    from gpushare.node.usage.sampler import Sampler, UsageSettings

    try:
        config, _source = nodeconf.load(args)
    except ConfigError as err:
        return fail("usage", str(err))
    if os.geteuid() != 0:
        return fail("usage", "it reads every job's record and processes and writes "
                    f"{config.state_dir}/usage: run it as root")
    settings = UsageSettings(config.usage_interval, config.hog_bw_pct, config.hog_seconds,
                             config.dcgm_mapping_dir, config.dcgm_mapping_names)
    _log_to(args.syslog)
    try:
        nvml = load_nvml(config.inventory)
        nvml.nvmlInit()
    except InventoryError as err:
        return fail("usage", str(err))
    except Exception as err:  # NVMLError of either implementation
        return fail("usage", describe_nvml_error(nvml, err, "initialise NVML"))
    sampler = Sampler(config.state_dir, nvml, settings, proc_root=args.proc_root,
                      cgroup_root=args.cgroup_root)
    try:
        while True:
            started = time.monotonic()
            try:
                sampler.round()
            except (OSError, StateError, ValueError) as err:
                if not args.loop:
                    return fail("usage", f"cannot sample: {err}")
                print(f"gpushare usage: round failed: {err}", file=sys.stderr)
            except nvml.NVMLError as err:
                message = describe_nvml_error(nvml, err, "read the node's GPUs")
                if not args.loop:
                    return fail("usage", message)
                print(f"gpushare usage: round failed: {message}", file=sys.stderr)
            if not args.loop:
                return 0
            time.sleep(max(0.0, settings.interval - (time.monotonic() - started)))
    finally:
        sampler.reader.close()
        nvml.nvmlShutdown()
