# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare job``: inside a job, what gpushare set up for it and whether its MPS daemon answers.

Runs as the job's user, so it reads only what the user can read: the task environment the
plugin applied (the root-owned job record is not readable), the job's own MPS pipe
directory, through which it asks the daemon ``get_server_list`` with a time limit, and the
figures the node's usage sampler keeps for the job (readable by all). ``gpushare job ID``
on the node shows only those figures, for any job there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from gpushare.cli import nodeconf
from gpushare.common import proc
from gpushare.node.config import ConfigError
from gpushare.node.devices import is_uuid

__all__ = ["DaemonProbe", "JobView", "format_view", "job_view", "probe_daemon", "register"]

DEFAULT_MPS_CONTROL = "/usr/bin/nvidia-cuda-mps-control"
PROBE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NOT_IN_JOB = ("not inside a Slurm job (SLURM_JOB_ID is unset); run it in the job, e.g. "
              "srun --gres=mps:25 gpushare job")


@dataclass
class JobView:
    """What the job's tasks were given, read from the task environment."""

    job_id: Optional[int]
    node: str
    node_gpus: list[str]  # the node's GPU indices Slurm allocated (SLURM_STEP/JOB_GPUS)
    visible_devices: str  # CUDA_VISIBLE_DEVICES as the task sees it
    mps: str  # shared, private or none
    share_percent: Optional[int]
    pinned_mem_limit: dict[str, str] = field(default_factory=dict)  # device -> size
    pipe_dir: str = ""
    log_dir: str = ""
    problems: list[str] = field(default_factory=list)


@dataclass
class DaemonProbe:
    """The answer of the job's MPS control daemon to ``get_server_list``."""

    status: str  # answers, no-answer, timeout, no-program, not-asked
    servers: list[int] = field(default_factory=list)
    detail: str = ""


def _ints(text: str) -> Optional[int]:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _parse_pinned(text: str, problems: list[str]) -> dict[str, str]:
    limits: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        device, sep, size = item.partition("=")
        if not sep or not device.strip() or not size.strip():
            problems.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT item {item!r} is not "
                            "<device>=<size>")
            continue
        limits[device.strip()] = size.strip()
    return limits


def job_view(env: Mapping[str, str]) -> JobView:
    """Interpret the task environment; inconsistencies go to ``problems``, never raise."""
    problems: list[str] = []
    job_id = _ints(env.get("SLURM_JOB_ID", ""))
    # Slurm gives an mps job's tasks no GPU index; gpushare's prolog does (GPUSHARE_GPUS).
    # GPU_DEVICE_ORDINAL is CUDA_VISIBLE_DEVICES' twin: UUIDs with 26.05's Flags=env_uuid,
    # which are no index (SLURM_*_GPUS stay indices).
    ordinal = env.get("GPU_DEVICE_ORDINAL", "")
    gpus_text = (env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
                 or env.get("GPUSHARE_GPUS")
                 or ("" if any(map(is_uuid, ordinal.split(","))) else ordinal))
    share_text = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
    share = _ints(share_text)
    if share_text and (share is None or not 1 <= share <= 100):
        problems.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share_text} is not a percent "
                        "from 1 to 100")
        share = None
    pipe_dir = env.get("CUDA_MPS_PIPE_DIRECTORY", "")
    if not pipe_dir:
        mps = "none"
    elif os.path.basename(os.path.dirname(pipe_dir.rstrip("/"))).startswith("job"):
        mps = "private"  # private daemons are keyed job<id> (gpushare.node.mps.daemon_key)
    else:
        mps = "shared"
    if share is not None and mps == "none":
        problems.append("a share is set but no MPS pipe directory: Slurm's gres/mps ran "
                        "without gpushare's daemon, so the share is not enforced by MPS")
    return JobView(
        job_id=job_id, node=env.get("SLURMD_NODENAME", ""),
        node_gpus=[g for g in gpus_text.split(",") if g],
        visible_devices=env.get("CUDA_VISIBLE_DEVICES", ""), mps=mps, share_percent=share,
        pinned_mem_limit=_parse_pinned(env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""),
                                       problems),
        pipe_dir=pipe_dir, log_dir=env.get("CUDA_MPS_LOG_DIRECTORY", ""), problems=problems)


def probe_daemon(view: JobView, program: str, timeout: float) -> DaemonProbe:
    """Ask the job's daemon for its server list through the job's pipe directory."""
    if not view.pipe_dir:
        return DaemonProbe("not-asked", detail="this job has no MPS daemon")
    env = {"PATH": PROBE_PATH, "CUDA_MPS_PIPE_DIRECTORY": view.pipe_dir}
    if view.log_dir:
        env["CUDA_MPS_LOG_DIRECTORY"] = view.log_dir
    try:
        result = proc.run([program], input_text="get_server_list\n", env=env,
                          timeout=timeout)
    except proc.CommandNotFound as err:
        return DaemonProbe("no-program", detail=f"{err}; give the control program with "
                           "--mps-control PATH")
    except proc.CommandTimeout:
        return DaemonProbe("timeout", detail=f"no answer within {timeout:g} s")
    except proc.ProcError as err:
        return DaemonProbe("no-answer", detail=str(err))
    if result.returncode != 0:
        return DaemonProbe("no-answer", detail=f"exit {result.returncode}: "
                           f"{result.output or 'no output'}")
    servers = [int(word) for word in result.stdout.split() if word.isdigit()]
    return DaemonProbe("answers", servers=servers)


def _probe_line(probe: DaemonProbe) -> str:
    if probe.status == "answers":
        running = (", ".join(map(str, probe.servers))
                   or "none yet (one starts with the first CUDA client)")
        return f"answers; MPS servers: {running}"
    if probe.status == "not-asked":
        return probe.detail
    return f"does not answer ({probe.status}): {probe.detail}"


def format_view(view: JobView, probe: DaemonProbe,
                usage_rows: Optional[list[tuple[str, str]]] = None) -> str:
    """A few lines a user reads to see what the job got."""
    if view.mps == "none" and view.share_percent is None:
        sharing = "none (whole GPUs, no MPS)" if view.node_gpus else "no GPU"
    elif view.mps == "private":
        sharing = "private MPS daemon over the job's GPUs (its ranks share them)"
    else:
        sharing = f"MPS share of one GPU, {view.share_percent}% of its SMs" \
            if view.share_percent is not None else "MPS share of one GPU"
    pinned = ", ".join(f"device {dev}: {size}" for dev, size in
                       sorted(view.pinned_mem_limit.items())) or "none"
    rows = [
        ("job", f"{view.job_id}" + (f" on {view.node}" if view.node else "")),
        ("node GPU(s)", ",".join(view.node_gpus) or "none"),
        ("CUDA_VISIBLE_DEVICES", view.visible_devices or "unset"),
        ("sharing", sharing),
        ("pinned memory limit", pinned),
        ("MPS pipe directory", view.pipe_dir or "none"),
        ("MPS log directory", view.log_dir or "none"),
        ("MPS daemon", _probe_line(probe)),
        *(usage_rows or []),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
    lines += [f"warning: {problem}" for problem in view.problems]
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "job",
        help="inside a job: show the GPUs, share, memory limit and MPS daemon gpushare set up",
        description="Run inside a job (as its user): print what gpushare set up for it from "
        "the task environment (the node's GPUs, CUDA_VISIBLE_DEVICES, the share of the GPU's "
        "SMs, the pinned device memory limit, the MPS pipe and log directories) and whether "
        "the job's MPS control daemon answers, and the job's GPU use now, its peak and means as "
        "the node's usage sampler saw them. With JOB_ID, only that job's GPU use. Exit "
        "status: 0 fine, 1 not in a job, the daemon does not answer, or (with JOB_ID) "
        "nothing sampled for the job.",
        epilog="examples:\n  srun --gres=mps:25 gpushare job\n"
        "  gpushare job 4242        # on the job's node: its GPU use now, peak and means",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("job_id", nargs="?", type=_job_id_text, metavar="JOB_ID",
                        help="on a node, show only this job's GPU use as the node's sampler "
                        "saw it (any job of the node; no need to run inside it); an array "
                        "task as squeue prints it (4242_7) is asked of squeue for its own "
                        "job id")
    parser.add_argument("--squeue", default="/usr/bin/squeue", metavar="PATH",
                        help="squeue, for an array task's job id (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--mps-control", metavar="PATH",
                        help="the nvidia-cuda-mps-control program (default: the plugin's "
                        f"mps_control= from plugstack.conf, else {DEFAULT_MPS_CONTROL})")
    nodeconf.add_arguments(parser)
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="how long to wait for the daemon's answer (default 5)")
    parser.set_defaults(func=_run)


def _job_id_text(text: str) -> str:
    """JOB_ID as typed: a job id (digits), or an array task's ARRAY_TASK (int() alone would
    read 10_3 as 103, another job)."""
    head, underscore, tail = text.partition("_")
    if all(part.isascii() and part.isdigit() for part in ((head, tail) if underscore else (head,))):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a job id: give digits (4242), or an "
                                     "array task as squeue prints it (4242_7)")


def _job_id(args: argparse.Namespace) -> int:
    """JOB_ID's job id; SlurmClientError when an array task's cannot be found."""
    text = args.job_id
    if "_" not in text:
        return int(text)
    from gpushare.admin.slurm_client import array_task_job_id

    return array_task_job_id(text, args.squeue)


def _usage(args: argparse.Namespace, job_id: int) -> tuple[Any, list[tuple[str, str]]]:
    """The job's figures from the node's sampler, and their rows; a problem is a row too."""
    from gpushare.node.usage.store import UsageStore
    from gpushare.node.usage.view import job_rows

    try:
        usage = UsageStore(nodeconf.load(args)[0].state_dir).read_job(job_id)
    except (ConfigError, OSError, ValueError) as err:
        return None, [("GPU use", f"unknown: {err}")]
    return usage, job_rows(usage, time.time())


def _run(args: argparse.Namespace) -> int:
    if not 0.1 <= args.timeout <= 600:
        print("gpushare: --timeout must be between 0.1 and 600 seconds", file=sys.stderr)
        return 2
    view = job_view(os.environ)
    job_id: Optional[int] = None
    if args.job_id is not None:
        from gpushare.admin.slurm_client import SlurmClientError

        try:
            job_id = _job_id(args)
        except SlurmClientError as err:
            print(f"gpushare job: {err}", file=sys.stderr)
            return 2
    if job_id is not None and job_id != view.job_id:
        usage, rows = _usage(args, job_id)
        if args.json:
            print(json.dumps({"job_id": job_id,
                              "usage": usage.to_dict() if usage else None}, indent=2))
        else:
            shown = str(job_id) if str(job_id) == args.job_id else f"{job_id} ({args.job_id})"
            rows = [("job", f"{shown} on {args.node or nodeconf.this_node()}"), *rows]
            width = max(len(name) for name, _ in rows)
            print("\n".join(f"{name.ljust(width)}  {value}" for name, value in rows))
        return 0 if usage is not None else 1
    if view.job_id is None:
        print(f"gpushare: {NOT_IN_JOB}", file=sys.stderr)
        return 1
    program = args.mps_control
    if not program:
        try:
            program = nodeconf.load(args)[0].mps_control
        except ConfigError as err:
            print(f"gpushare job: {err}; or give the control program with --mps-control",
                  file=sys.stderr)
            return 2
    probe = probe_daemon(view, program, args.timeout)
    usage, rows = _usage(args, view.job_id)
    if args.json:
        print(json.dumps({"job": asdict(view), "daemon": asdict(probe),
                          "usage": usage.to_dict() if usage else None}, indent=2))
    else:
        print(format_view(view, probe, rows))
    return 1 if probe.status not in ("answers", "not-asked") else 0
