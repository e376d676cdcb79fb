# SPDX-License-Identifier: GPL-2.0-or-later
"""The join ticket: what lets the C glue join a job to its user's running daemon by itself.

A shared job whose user already runs a daemon on the job's GPU, with caps at least the
job's share, needs no decision of its own: its daemon reference, record and task
environment are those of the job before it with its own id, and its GPU passed the check
of that job moments ago. So after each shared prolog the worker writes, under the daemon's
lock, ``<state_dir>/daemons/tickets/u<uid>.g<gpus>.s<share>`` (``name``): the conditions under
which that holds, then the record and the task environment to write with the job's id and
time filled in. The C glue's job prolog (``gs_fast_join`` in ``spank/gs_fastpath.c``)
uses a ticket only while every condition holds:

- the same plugstack arguments, uid and gid, the same values of the environment the prolog
  reads (``TICKET_ENV``) and of gpushare's options;
- the files the GPU check read (gres.conf, the plan, a simulated inventory) unchanged, and
  ``slurm-checked`` too (removing it asks the next prolog to look for lost jobs);
- the daemon's record unchanged (so its pid and caps are), and its process the same one;
- before ``until``: at most plugstack's ``verify_reuse=`` seconds after the check the
  ticket reuses (none is written with 0), and not past the node's next look for jobs whose
  epilog was lost.

Any other job, or any doubt, goes to the worker, which checks and writes a ticket again.
The format is line-based so that C reads it without a parser: ``word value`` lines, then
``--record`` and the record, then ``--env`` and the environment file.
"""

import os
import re
from typing import Mapping, Optional, Sequence

from gpushare.node.state import JobRecord

FORMAT = "gpushare-ticket 1"
# A ticket's file name in <state_dir>/daemons/tickets/; spank/build.py gives the C glue the same.
NAME_FORMAT = "u{uid}.g{gpus}.s{share}"
# What a prolog reads of its environment (gpushare.node.request.JobRequest, gres_conf_path,
# node_name): a ticket holds for a job that reads the same.
TICKET_ENV = ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
              "SLURM_CONF", "SLURMD_NODENAME")
OPTIONS = ("gpu-share", "gpu-mps")
JOB_ID_MARK = "@GPUSHARE_JOB_ID@"
CREATED_MARK = "@GPUSHARE_CREATED@"
_ID_SENTINEL = 4242424242424242
_CREATED_SENTINEL = 4242424242.25
_GPUS = re.compile(r"^[0-9]{1,4}(,[0-9]{1,4}){0,63}$")


def name(uid: int, env: Mapping[str, str]) -> Optional[str]:
    """The ticket a job of ``uid`` with this environment would use (the C glue builds the
    same name); None when its GPUs or share are not plain numbers."""
    gpus = env.get("SLURM_JOB_GPUS", "")
    share = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
    if not _GPUS.match(gpus) or not share.isdigit() or len(share) > 3:
        return None
    return NAME_FORMAT.format(uid=uid, gpus=gpus.replace(",", "_"), share=share)


def stamp(st: os.stat_result) -> str:
    """What must not change about a file: the C glue prints a stat the same way."""
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns}"


def file_lines(paths: Sequence[str]) -> list[str]:
    """``file <stamp> <path>``, or ``nofile <path>`` for one that is absent."""
    lines = []
    for path in paths:
        try:
            lines.append(f"file {stamp(os.stat(path))} {path}")
        except FileNotFoundError:
            lines.append(f"nofile {path}")
    return lines


def _conditions(*, key: str, until: float, uid: int, gid: int, share: int,
                args: Sequence[str], env: Mapping[str, str],
                options: Mapping[str, Optional[str]], files: Sequence[str]) -> list[str]:
    """The ``word value`` lines every condition of a ticket is."""
    lines = [f"key {key}", f"until {until:.6f}", f"uid {uid}", f"gid {gid}", f"share {share}"]
    lines += [f"arg {arg}" for arg in args]
    lines += [f"env {var}={env.get(var, '')}" for var in TICKET_ENV]
    lines += [f"opt {opt}={options[opt]}" if options.get(opt) is not None else f"noopt {opt}"
              for opt in OPTIONS]
    return [*lines, *files]


def _job_sections(record: JobRecord, show: str) -> list[str]:
    """``--record``, the job's record with its id and time as sentinels, ``--env``, the tasks'
    environment: the last part of a ticket."""
    template = JobRecord(**{**record.to_dict(), "job_id": _ID_SENTINEL,
                            "created": _CREATED_SENTINEL})
    if template.mps is not None:
        template.mps = {**template.mps, "job_id": _ID_SENTINEL}
    return ["--record", template.to_json(), "--env", template.to_env_file(show)]


def _marked(lines: Sequence[str], sentinels: Sequence[tuple[str, str]]) -> bytes:
    text = "\n".join(lines)
    for sentinel, mark in sentinels:
        text = text.replace(sentinel, mark)
    return text.encode()


def _no_newlines(lines: Sequence[str]) -> None:
    if any("\n" in line for line in lines):
        raise ValueError("a ticket line holds a newline")


_JOB_SENTINELS = ((str(_ID_SENTINEL), JOB_ID_MARK), (repr(_CREATED_SENTINEL), CREATED_MARK))


def render(*, key: str, until: float, uid: int, gid: int, share: int, args: Sequence[str],
           env: Mapping[str, str], options: Mapping[str, Optional[str]], files: Sequence[str],
           daemon: str, record_stamp: str, record: JobRecord, show: str) -> bytes:
    """The ticket's text. ``record`` is the job's own (its id and time become the marks);
    ``show`` the ``#show=`` line with ``JOB_ID_MARK`` for the job id, or "";
    ``daemon`` is ``<pid> <start time>``."""
    lines = [FORMAT, *_conditions(key=key, until=until, uid=uid, gid=gid, share=share,
                                  args=args, env=env, options=options, files=files),
             f"daemon {daemon}", f"record {record_stamp}"]
    _no_newlines(lines)
    return _marked([*lines, *_job_sections(record, show)], _JOB_SENTINELS)

