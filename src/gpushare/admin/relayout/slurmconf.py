# SPDX-License-Identifier: GPL-2.0-or-later
"""The node's ``Gres=`` in slurm.conf: found, set, and checked writable before any node is
drained (a relayout that changed the GPUs but cannot tell slurmctld leaves the node
stranded).

Refused before anything is drained, with what to do: a file that is not there (in a
configless Slurm, ``SlurmctldParameters=enable_configless``, the nodes take slurm.conf from
slurmctld: run on the slurmctld host and name the file it reads), slurmd's configless cache,
a NodeName line that is not in the file (an ``Include``d file holds it: name that file), a
line that goes on over several lines, and a file root may not write: a symlink is written
through to its target only where the target and every directory above it are root's and
not writable by others, so the link stays a link.
"""

from __future__ import annotations

import os
import re

from gpushare.admin.slurm_client import parse_node_gres
from gpushare.common import safefs

__all__ = ["SetGresError", "check_writable", "comparable", "node_gres_in", "set_node_gres",
           "shows", "write_conf"]

_CACHE_MARKS = ("/run/slurm/conf/", "/conf-cache/")


class SetGresError(ValueError):
    """slurm.conf has no line for the node, or one gpushare cannot safely rewrite."""


def _node_names(expression: str) -> list[str]:
    import hostlist

    try:
        return list(hostlist.expand_hostlist(expression))
    except (hostlist.BadHostlist, ValueError):
        return [expression]


def node_gres_in(text: str, node: str) -> str:
    """``Gres=`` of ``node``'s NodeName line in slurm.conf ``text`` ("" when it has none)."""
    for line in text.splitlines():
        words = line.split()
        match = re.match(r"(?i)nodename=(\S+)", words[0]) if words else None
        if match and match.group(1).upper() != "DEFAULT" and node in _node_names(match.group(1)):
            return next((w.split("=", 1)[1] for w in words[1:] if w.lower().startswith("gres=")),
                        "")
    return ""


def set_node_gres(text: str, node: str, gres: str) -> str:
    """slurm.conf ``text`` with ``Gres=`` of ``node``'s NodeName line set to ``gres`` (removed
    when empty). A line naming several nodes is split: the others keep theirs."""
    import hostlist

    lines = text.splitlines(keepends=True)
    for position, line in enumerate(lines):
        stripped = line.strip()
        match = re.match(r"(?i)nodename=(\S+)", stripped)
        if not match or match.group(1).upper() == "DEFAULT":
            continue
        names = _node_names(match.group(1))
        if node not in names:
            continue
        if stripped.endswith("\\"):
            raise SetGresError(f"the NodeName line of {node} goes on over several lines; "
                               "write it on one line")
        words = stripped.split()
        rest = [w for w in words[1:] if not w.lower().startswith("gres=")]
        own = [f"NodeName={node}", *rest] + ([f"Gres={gres}"] if gres else [])
        others = [n for n in names if n != node]
        replacement = []
        if others:
            old = [f"NodeName={hostlist.collect_hostlist(others)}", *words[1:]]
            replacement.append(" ".join(old) + "\n")
        replacement.append(" ".join(own) + "\n")
        lines[position:position + 1] = replacement
        return "".join(lines)
    raise SetGresError(f"no NodeName line names {node}")


def comparable(gres: str) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for (name, gres_type), count in parse_node_gres(gres).items():
        if name not in ("gpu", "mps", "shard"):
            continue
        key = (name, "") if name in ("mps", "shard") else (name, gres_type)
        counts[key] = counts.get(key, 0) + count
    return {k: v for k, v in counts.items() if v}


def shows(seen: dict[tuple[str, str], int], want: dict[tuple[str, str], int]) -> bool:
    """slurmctld shows the wanted GRES: the same types, each at least as many. Slurm 22.05
    counts each file of a MIG slice's ``MultipleFiles=`` line as a GPU of its own once a
    reconfigure has taken the node's count (3 per slice), more than slurm.conf says."""
    return set(seen) == set(want) and all(seen[key] >= count for key, count in want.items())


def _has_line(text: str, node: str) -> bool:
    for line in text.splitlines():
        match = re.match(r"(?i)\s*nodename=(\S+)", line)
        if match and match.group(1).upper() != "DEFAULT" and node in _node_names(match.group(1)):
            return True
    return False


def check_writable(path: str, nodes: list[str], configless: bool = False) -> str:
    """The file to write ``path`` through (itself, or a symlink's safe target), once it holds
    each node's NodeName line on one line; SetGresError, saying what to do, otherwise."""
    where = f"--slurm-conf {path}"
    if not os.path.isabs(path):
        raise SetGresError(f"{where}: give an absolute path")
    if configless and any(mark in os.path.abspath(path) + "/" for mark in _CACHE_MARKS):
        raise SetGresError(f"{where} is slurmd's copy of a configless slurm.conf "
                           "(SlurmctldParameters=enable_configless): run gpushare relayout "
                           "--apply on the slurmctld host and name the file slurmctld reads")
    try:
        link = os.path.islink(path)
        if os.geteuid() == 0:
            target = safefs.check_root_owned_file(path)
        else:
            target = os.path.realpath(path)
            if not os.path.isfile(target):
                raise FileNotFoundError(path)
    except (FileNotFoundError, safefs.UnsafePathError) as err:
        missing = isinstance(err, FileNotFoundError) or not os.path.exists(path)
        if missing and configless:
            raise SetGresError(
                f"{where} does not exist: this Slurm is configless (SlurmctldParameters="
                "enable_configless) and the nodes take slurm.conf from slurmctld; run "
                "gpushare relayout --apply on the slurmctld host and name the file slurmctld "
                "reads") from None
        if missing:
            raise SetGresError(f"{where} does not exist; name the slurm.conf slurmctld reads"
                               ) from None
        raise SetGresError(f"{where}{' (a symbolic link)' if link else ''}: {err}; gpushare "
                           "writes slurm.conf only where root alone may") from None
    with open(target, encoding="utf-8") as handle:
        text = handle.read()
    for node in nodes:
        if not _has_line(text, node):
            includes = re.findall(r"(?im)^\s*include\s+(\S+)", text)
            if includes:
                raise SetGresError(
                    f"no NodeName line names {node} in {target}; it Includes "
                    + ", ".join(includes) + ": gpushare sets Gres= only in the file "
                    "--slurm-conf names, so name the included file that holds the line, or "
                    "move the line into " + target)
            raise SetGresError(f"no NodeName line names {node} in {target}")
        set_node_gres(text, node, "")  # one line, or SetGresError
    return target


def write_conf(target: str, text: str) -> None:
    """Replace ``target`` (check_writable's answer) in one rename, keeping its mode."""
    mode = os.stat(target).st_mode & 0o7777
    safefs.write_file_atomic(target, text.encode("utf-8"), mode, exact_mode=True)
