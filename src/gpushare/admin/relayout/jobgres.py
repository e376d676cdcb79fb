# SPDX-License-Identifier: GPL-2.0-or-later
"""What a job asks of one node, from squeue's three GPU request fields.

A job asks for GPUs per node (``--gres``, ``--gpus-per-node``: squeue's ``tres-per-node``,
the ``%b`` of ``-o``), for the job (``--gpus``: ``tres-per-job``) or per task
(``--gpus-per-task``: ``tres-per-task``). squeue ``-O`` prints each of them, with
``NumNodes`` and ``NumTasks``, under these names from Slurm 22.05 through 26.05 (names match
without case; ``tres-per-node`` is hidden from ``--helpFormat`` since 24.11 but read as
before); a field given as ``Name:|`` has width 0, printed in full, and ``|`` after it.
Slurm 22.05 writes an item ``gres:gpu:1g.10gb:2``, 23.11 and later ``gres/gpu:1g.10gb:2``,
and in tres-per-task ``gres/gpu:1g.10gb=2`` beside TRES that are not GRES (``cpu=4``); all
read the same here, "N/A" or "(null)" is no request.

A Request is one job's request on one node, so each field turns into what the job asks of
one node:

- tres-per-node as it is (a ``-N 4 --gres=gpu:h100:8`` job asks 8 of one node);
- tres-per-job: ``--gpus=N`` spread over the job's nodes, ``ceil(N / NumNodes)``;
- tres-per-task: ``ceil(NumTasks / NumNodes)`` tasks on a node, each with its GPUs.

NumNodes of a pending job is slurmctld's: its ``-N`` minimum, or the node count its last
scheduling attempt found; 0 or unset counts as one node, so such a job asks all of its
``--gpus`` of one node (a count no node has serves nothing). NumTasks unset counts as one
task per node. A GRES name (gpu, mps) the job asks per node is not counted again from its
per-job or per-task field (``--gpus=8 --gpus-per-node=2``), nor per task where it is asked
per job (``--gpus=8 --gpus-per-task=2``: 4 tasks). A field, item or count that does not
read makes the job count nothing (``None``), never an error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

from gpushare.admin.slurm_client import GRES_ITEM_SPLIT
from gpushare.admin.tres import is_mig_profile
from gpushare.common import units

__all__ = ["FIELDS", "SQUEUE_FORMAT", "JobLine", "gres_items", "parse_line", "per_node"]

# Reason last: its text has commas and spaces ("ReqNodeNotAvail, UnavailableNodes:n3").
FIELDS = ("JobArrayID", "tres-per-node", "SubmitTime", "Partition", "UserName", "Account",
          "TimeLimit", "NumNodes", "NumTasks", "tres-per-job", "tres-per-task", "Reason")
SQUEUE_FORMAT = ",".join(f"{name}:|" for name in FIELDS[:-1]) + f",{FIELDS[-1]}:0"
NO_VAL = 0xFFFFFFFE  # Slurm's unset uint32
_NUMBER = re.compile(r"-?[0-9]+")
_KINDS = ("gpu", "mps")


@dataclass(frozen=True)
class JobLine:
    """One squeue line: SQUEUE_FORMAT's fields, or those of the older ``-o
    "%i|%b|%V|%P|%u|%a|%l|%r"`` (without ``%l`` too), which have no per-job, per-task,
    node or task fields."""

    job: str
    per_node: str
    submitted: str
    partitions: str
    user: str
    account: str
    limit: str
    reason: str
    nodes: str = ""
    tasks: str = ""
    per_job: str = ""
    per_task: str = ""


def parse_line(line: str) -> Optional[JobLine]:
    """The fields of one line; None for a line of neither form."""
    line = line.strip()
    parts = line.split("|", len(FIELDS) - 1)
    if len(parts) == len(FIELDS):
        job, per_node_, submitted, parts_, user, account, limit, nodes, tasks, per_job, \
            per_task, reason = parts
        return JobLine(job, per_node_, submitted, parts_, user, account, limit, reason, nodes,
                       tasks, per_job, per_task)
    parts = line.split("|", 7)
    if len(parts) == 7:
        parts = line.split("|", 6)
        parts.insert(6, "")
    if len(parts) != 8:
        return None
    return JobLine(*parts)


def gres_items(text: str) -> Optional[list[tuple[str, str, int]]]:
    """(GRES name, kind, count) of a field's gpu and mps items: ``gres/gpu:3g.40gb:2`` →
    ("gpu", "3g.40gb", 2), a typed whole GPU or an untyped one → "whole", ``gres:mps:25``
    → ("mps", "mps", 25); other TRES are left out; None where an item does not read."""
    found: list[tuple[str, str, int]] = []
    for item in GRES_ITEM_SPLIT.split(text or ""):
        item = item.split("(", 1)[0].strip()
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        if not item or item in ("(null)", "N/A"):
            continue
        head, eq, count_text = item.partition("=")
        parts = head.split(":")
        name = parts[0].lower()
        if name not in _KINDS:
            continue
        if eq:  # name[:type]=count
            types, count = parts[1:], units.parse_count(count_text.strip())
        elif len(parts) == 3:  # name:type:count
            types, count = parts[1:2], units.parse_count(parts[2])
        elif len(parts) == 2 and units.parse_count(parts[1]) is not None:  # name:count
            types, count = [], units.parse_count(parts[1])
        else:  # name or name:type: one
            types, count = parts[1:], 1
        if count is None or len(types) > 1 or (types and not types[0]):
            return None
        if count == 0:
            continue
        gres_type = types[0] if types else ""
        kind = "mps" if name == "mps" else \
            (gres_type.lower() if is_mig_profile(gres_type) else "whole")
        found.append((name, kind, count))
    return found


def _number(text: str) -> Optional[int]:
    """NumNodes or NumTasks; 0 where unset (0, Slurm's NO_VAL or a negative); None where it
    does not read."""
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    value = int(text)
    return value if 0 < value < NO_VAL else 0


def per_node(line: JobLine) -> Optional[list[tuple[str, int]]]:
    """(kind, count) the job asks of one node, as the module says; None where it does not
    read (the job then counts nothing)."""
    asked = gres_items(line.per_node)
    per_job = gres_items(line.per_job)
    per_task = gres_items(line.per_task)
    if asked is None or per_job is None or per_task is None:
        return None
    found = [(kind, count) for _name, kind, count in asked]
    given = {name for name, _kind, _count in asked}
    spread = [item for item in per_job if item[0] not in given]
    tasks_of = [item for item in per_task
                if item[0] not in given and item[0] not in {i[0] for i in per_job}]
    if spread or tasks_of:
        nodes = _number(line.nodes or "0")
        tasks = _number(line.tasks or "0")
        if nodes is None or tasks is None:
            return None
        nodes = max(nodes, 1)
        found += [(kind, math.ceil(count / nodes)) for _name, kind, count in spread]
        per_node_tasks = math.ceil(tasks / nodes) if tasks else 1
        found += [(kind, count * per_node_tasks) for _name, kind, count in tasks_of]
    return found
