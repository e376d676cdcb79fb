# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare explain -- <sbatch/srun flags>``: what the submit hooks would do to a request.

The flags are turned into job_desc fields the way sbatch fills them (in the cluster's GRES
syntax), then run through the same rules the hooks run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

from gpushare.submit.facts import (
    DEFAULT_FACTS_PATH,
    FACTS_ENV,
    Facts,
    FactsError,
    facts_path,
    load_facts,
)
from gpushare.submit.gres import GresError, parse_field
from gpushare.submit.rules import NO_VAL, SPANK_OPTION_PREFIX, apply, format_wait

__all__ = ["client_refusal", "flags_to_job", "register", "time_str2secs", "untyped_policy"]

# What sbatch/srun/salloc of Slurm 22.05 print, and exit 1, for a --gres they cannot parse:
# the request never reaches slurmctld, so no submit hook sees it
# (tests/slurm/test_submit.py compares this with the real clients).
CLIENT_GRES_ERROR = "error: Invalid generic resource (gres) specification"
# Slurm 24.11's answer (from slurmctld, before the hooks) to an item it cannot parse.
CTLD_TRES_ERROR = "error: Invalid Trackable RESource (TRES) specification"


class FlagError(ValueError):
    """A flag value sbatch itself would refuse."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="show what the submit hooks would do to a job's sbatch/srun flags",
        description="Turn sbatch/srun flags (--gres, --gpus, --gpus-per-node, --gpus-per-task, "
        "--gpus-per-socket, -N, -n, --switches, --array, --constraint, --gpu-share, --gpu-mps) "
        "into the "
        "job_desc fields slurmctld would see, run the submit rules on them, and say what "
        "would change, or why the job would be rejected; a --gres that sbatch/srun refuse "
        "themselves (before any submit hook runs) is reported with Slurm's own answer. "
        "Exit status: 0 accepted, 1 rejected, 2 bad flags or facts.",
        epilog="example: gpushare explain -- -N 3 --gres=gpu:1g.5gb:1",
    )
    parser.add_argument("--facts", default=None,
                        help=f"cluster facts file (default: ${FACTS_ENV} or {DEFAULT_FACTS_PATH})")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--uid", type=int, default=None,
                        help="the user the job would run as (default: the caller)")
    parser.add_argument("flags", nargs=argparse.REMAINDER, metavar="-- FLAGS",
                        help="the job's sbatch/srun flags, after --")
    parser.set_defaults(func=_run, unknown_hint="put the job's sbatch/srun flags after --, "
                        "e.g. gpushare explain -- --gres=mps:25")


def _flag_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sbatch flags", add_help=False, allow_abbrev=False)
    parser.add_argument("--gres", action="append", default=[])
    parser.add_argument("--gpus", "-G")
    parser.add_argument("--gpus-per-node")
    parser.add_argument("--gpus-per-task")
    parser.add_argument("--gpus-per-socket")
    parser.add_argument("--nodes", "-N")
    parser.add_argument("--ntasks", "-n")
    parser.add_argument("--switches")
    parser.add_argument("--array", "-a")
    parser.add_argument("--gpu-share")
    parser.add_argument("--gpu-mps", nargs="?", const="")
    parser.add_argument("--constraint", "-C")
    return parser


_TIME_FORMS = (
    (re.compile(r"(\d+)"), (0, 0, 1, 0)),
    (re.compile(r"(\d+):(\d+)"), (0, 0, 1, 1)),
    (re.compile(r"(\d+):(\d+):(\d+)"), (0, 1, 1, 1)),
    (re.compile(r"(\d+)-(\d+)"), (1, 1, 0, 0)),
    (re.compile(r"(\d+)-(\d+):(\d+)"), (1, 1, 1, 0)),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"), (1, 1, 1, 1)),
)


def time_str2secs(text: str) -> int:
    """Slurm's time syntax (``mm``, ``mm:ss``, ``hh:mm:ss``, ``d-hh[:mm[:ss]]``) in seconds."""
    for pattern, present in _TIME_FORMS:
        match = pattern.fullmatch(text.strip())
        if match:
            values = iter(int(v) for v in match.groups())
            days, hours, minutes, seconds = (next(values) if p else 0 for p in present)
            return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    raise FlagError(f"{text!r} is not a time; use minutes, mm:ss, hh:mm:ss or d-hh:mm:ss")


def _gpu_item(prefix: str, value: str, eq: bool) -> str:
    if eq:  # 23.11 tres_per_task: gres/gpu:a100=1
        type_, _, count = value.rpartition(":")
        return f"{prefix}gpu:{type_}={count}" if type_ else f"{prefix}gpu={count}"
    return f"{prefix}gpu:{value}"


def _parse_flags(flags: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The flags as sbatch/srun read them, and those they ignore. They keep only the last
    --gres (each replaces the one before: 22.05 and 26.05), so ``gres`` holds at most one."""
    # --gpu-mps takes its optional value only after "=" (getopt): the next word is the program
    flags = ["--gpu-mps=" if flag == "--gpu-mps" else flag for flag in flags]
    args, ignored = _flag_parser().parse_known_args(flags)
    ignored += [f"--gres={gres} (a later --gres replaces it)" for gres in args.gres[:-1]]
    args.gres = args.gres[-1:]
    return args, ignored


def flags_to_job(flags: list[str], facts: Facts) -> tuple[dict[str, Any], list[str]]:
    """job_desc fields as slurmctld would give them to job_submit, and the flags ignored."""
    args, ignored = _parse_flags(flags)
    prefix = facts.gres_prefix
    job: dict[str, Any] = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL,
                           "req_switch": NO_VAL, "wait4switch": NO_VAL}
    per_node = [f"{prefix}{item}" for gres in args.gres for item in gres.split(",") if item]
    if args.gpus_per_node:
        per_node.append(_gpu_item(prefix, args.gpus_per_node, False))
    if per_node:
        job["tres_per_node"] = ",".join(per_node)
    if args.gpus:
        job["tres_per_job"] = _gpu_item(prefix, args.gpus, False)
    if args.gpus_per_task:
        job["tres_per_task"] = _gpu_item(prefix, args.gpus_per_task, facts.gres_syntax != "22.05")
    if args.gpus_per_socket:
        job["tres_per_socket"] = _gpu_item(prefix, args.gpus_per_socket, False)
    if args.nodes:
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", args.nodes)
        if not match:
            raise FlagError(f"-N {args.nodes!r}: give a node count or a range such as 2-4")
        job["min_nodes"] = int(match.group(1))
        job["max_nodes"] = int(match.group(2) or match.group(1))
    if args.ntasks:
        if not args.ntasks.isdigit():
            raise FlagError(f"-n {args.ntasks!r}: give a task count")
        job["num_tasks"] = int(args.ntasks)
    if args.switches:
        count, _, wait = args.switches.partition("@")
        if not count.isdigit():
            raise FlagError(f"--switches={args.switches}: use count[@max-time], e.g. 1@5:00")
        job["req_switch"] = int(count)
        if wait:
            job["wait4switch"] = time_str2secs(wait)
    if args.array:
        job["array_inx"] = args.array
    if args.constraint is not None:
        job["features"] = args.constraint
    env = []
    if args.gpu_share is not None:
        env.append(f"{SPANK_OPTION_PREFIX}gpu_share={args.gpu_share}")
    if args.gpu_mps is not None:
        env.append(f"{SPANK_OPTION_PREFIX}gpu_mps={args.gpu_mps}")
    if env:
        job["spank_job_env"] = env
    return job, ignored


def _client_share_ok(text: str) -> bool:
    """Whether the plugin's option callback accepts ``--gpu-share=text``: strtol's syntax
    (leading white space, a sign, decimal digits, nothing after them), 1 to 100."""
    if re.fullmatch(r"[ \t\n\v\f\r]*[+-]?[0-9]+", text) is None:
        return False
    return 1 <= int(text) <= 100


def client_refusal(flags: list[str], facts: Facts | None = None) -> str | None:
    """Slurm's own answer when sbatch/srun refuse the --gres before sending the job, or None;
    also gpushare's, when the plugin's option callback in the client refuses --gpu-share.

    Measured on Slurm 22.05: the clients refuse a --gres item they cannot parse (``gpu:::``,
    ``gpu:h100:-1``, ``:1``) and a --gres asking for gpu and mps together
    (``gpu:1,mps:25``). ``gpu:1g.10gb`` (a type starting with a digit, no count) passes the
    clients and reaches the hooks, which refuse it with their own message. Measured on 24.11
    (facts in 23.11 syntax): the clients pass unparsable items on; slurmctld refuses them
    before the hooks ("Invalid Trackable RESource"), except an item without a name (``:1``),
    which reaches the hooks; gpu with mps is still refused by the clients.
    """
    args, _ = _parse_flags(flags)
    if args.gpu_share is not None and not _client_share_ok(args.gpu_share):
        # The SPANK plugin's option callback in sbatch/srun (gs_parse_share) refuses it.
        return (f"error: gpushare: --gpu-share={args.gpu_share} is invalid: give a whole "
                "percent of one GPU from 1 to 100, e.g. --gpu-share=25")
    items = []
    for gres in args.gres:
        for part in gres.split(","):
            try:
                items.extend(parse_field(part))
            except GresError as err:
                if err.count_missing:
                    continue
                if facts is None or facts.gres_syntax == "22.05":
                    return CLIENT_GRES_ERROR
                if not part.startswith(":"):
                    return CTLD_TRES_ERROR
    names = {item.name for item in items if item.is_gres}
    if {"gpu", "mps"} <= names:
        return CLIENT_GRES_ERROR
    return None


def untyped_policy(facts: Facts) -> str:
    """What an untyped GPU request means on this cluster, in words."""
    policy = facts.policy.untyped_gpu
    if policy == "any":
        return "any (left to Slurm: it may get a MIG slice)"
    if policy != "whole":
        return f"{policy} (written in as the type)"
    written = facts.untyped_gpu_type()
    if written:
        return f"whole (written in as {written}, never a MIG slice)"
    if not facts.mig_types:
        return "whole (no MIG slices here: left as it is)"
    if facts.gpu_types and facts.whole_gpu_feature:
        return (f"whole (kept on the nodes with feature {facts.whole_gpu_feature}, whose "
                "Slurm GPUs are all whole: --constraint gets it added)")
    return ("whole (refused: Slurm owns " + (
        "several whole-GPU types, a node has both them and MIG slices" if facts.gpu_types
        else "no whole GPUs, only MIG slices") + " here; the user must name the type)")


def _shown(field: str, value: Any) -> str:
    if value is None or value == NO_VAL:
        return "(unset)"
    if field == "wait4switch":
        return f"{value} ({format_wait(int(value))})"
    return str(value)


def _unset_as_null(fields: dict[str, Any]) -> dict[str, Any]:
    """Slurm's NO_VAL (unset) as null: the number means nothing to a reader."""
    return {key: None if value == NO_VAL else value for key, value in fields.items()}


def _run(args: argparse.Namespace) -> int:
    flags = list(args.flags)
    if flags and flags[0] == "--":
        flags = flags[1:]
    path = args.facts or facts_path()
    try:
        facts = load_facts(path)
        job, ignored = flags_to_job(flags, facts)
    except (FactsError, FlagError) as err:
        print(f"gpushare explain: {err}")
        return 2
    job["user_id"] = os.getuid() if args.uid is None else args.uid
    refused = client_refusal(flags, facts)
    decision = apply(job, facts)
    if args.json:
        result = decision.to_dict()
        result["changes"] = _unset_as_null(result["changes"])
        print(json.dumps({"facts": path, "job": _unset_as_null(job), "ignored": ignored,
                          "client_refusal": refused, "untyped_gpu": untyped_policy(facts),
                          "decision": result}, indent=2, sort_keys=True))
        return 1 if decision.reject or refused else 0
    print(f"facts: {path}")
    print(f"untyped GPU requests: {untyped_policy(facts)}")
    if refused:
        print("result: refused by Slurm itself (sbatch/srun, or slurmctld on 24.11), before "
              "any submit hook runs")
        print(f"the user sees: sbatch: {refused}")
        if decision.reject:
            print(f"(gpushare's hooks never see it; they would say: {decision.messages[0]})")
        return 1
    print("job_desc: " + " ".join(f"{k}={v}" for k, v in job.items() if v != NO_VAL))
    if ignored:
        print("ignored (not looked at by the hooks): " + " ".join(ignored))
    if decision.reject:
        print(f"result: rejected at submit (error {decision.reject.code}, "
              "Invalid generic resource (gres) specification)")
    elif decision.changes:
        print("result: accepted, with these fields rewritten:")
        for field, value in decision.changes.items():
            print(f"  {field}: {_shown(field, job.get(field))} -> {_shown(field, value)}")
    else:
        print("result: accepted unchanged")
    for message in decision.messages:
        print(f"the user sees: {message}")
    return 1 if decision.reject else 0
