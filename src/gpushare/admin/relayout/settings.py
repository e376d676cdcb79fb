# SPDX-License-Identifier: GPL-2.0-or-later
"""What every part of ``gpushare relayout --apply`` shares: its settings, what it asks of
slurmctld, what one node's round came to, and how a drain is recognised as ours."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Protocol

from gpushare.admin.relayout import DEFAULT_NODE_COMMAND
from gpushare.admin.relayout.decide import Change
from gpushare.admin.slurm_client import SlurmNode

__all__ = ["EXIT_UNKNOWN", "REASON_PREFIX", "Outcome", "RelayoutError", "Settings", "Slurm",
           "fit", "idle", "ours"]

REASON_PREFIX = "gpushare relayout"
EXIT_UNKNOWN = 3  # the node's step: the GPU's layout is not known; keep the node drained
_BUSY_STATES = {"ALLOCATED", "MIXED", "COMPLETING"}


class RelayoutError(RuntimeError):
    """A step of the orchestration failed; the message is the node's drain reason."""


class Slurm(Protocol):
    """What the orchestration asks of slurmctld (scontrol, or a fake in the tests)."""

    def node(self, name: str) -> Optional[SlurmNode]: ...

    def drain(self, name: str, reason: str) -> None: ...

    def resume(self, name: str) -> None: ...

    def reconfigure(self) -> None: ...


@dataclass
class Settings:
    """Where things are and how long each step may take."""

    node_command: str = DEFAULT_NODE_COMMAND
    slurmd_restart: str = ""  # e.g. "ssh {node} systemctl restart slurmd"; "": none
    # Slurm before 23.11 keeps a node's GPU count across `scontrol reconfigure` ("invalid with
    # File configuration") and takes a new one only when slurmctld restarts; "": reconfigure.
    slurmctld_restart: str = ""
    slurm_conf: str = "/etc/slurm/slurm.conf"
    cluster_gres_conf: str = ""  # a gres.conf every node shares, re-rendered; "": none
    one_profile_per_node: bool = False  # Slurm before 23.11 with AutoDetect=off
    state_path: str = "/etc/gpushare/relayout-state.json"
    drain_timeout_s: float = 5400.0
    step_timeout_s: float = 120.0
    step_grace_s: float = 30.0  # beyond twice the step's own limit, before it is killed
    settle_timeout_s: float = 120.0
    poll_s: float = 2.0
    parallel: int = 4  # nodes changed at once (each node's failure stays its own)
    configless: bool = False  # SlurmctldParameters=enable_configless
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class Outcome:
    """What happened on one node."""

    node: str
    applied: list[Change] = field(default_factory=list)
    restored: list[tuple[Change, str]] = field(default_factory=list)
    failed: Optional[str] = None  # the node stays drained with this reason
    skipped: str = ""  # nothing was done, and why
    log: list[str] = field(default_factory=list)

    @property
    def resumed(self) -> bool:
        return self.failed is None and not self.skipped


def ours(node: Optional[SlurmNode]) -> bool:
    return node is not None and node.reason.startswith(REASON_PREFIX)


def idle(node: SlurmNode) -> bool:
    return "IDLE" in node.states and not _BUSY_STATES.intersection(node.states)


def fit(reason: str, limit: int = 240) -> str:
    """A drain reason on one line that scontrol stores whole."""
    flat = " ".join(reason.replace('"', "'").split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."
