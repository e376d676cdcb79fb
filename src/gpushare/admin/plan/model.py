# SPDX-License-Identifier: GPL-2.0-or-later
"""What the plan says, as frozen data: everything gres.conf, the MIG manager's layout,
topology.conf, the plugstack line and the submit hooks' facts are rendered from."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Optional

from gpushare.admin.mig_profiles import GpuModel
from gpushare.submit.facts import Policy

if TYPE_CHECKING:
    from gpushare.admin.plan.lending import LendingRule
    from gpushare.admin.relayout.menu import Menu

OWNERS = ("slurm", "kubernetes")
PLAN_VERSION = 1
MAX_GPUS_PER_NODE = 64
MAX_SWITCH_NAME = 64
ENV_UUID_RELEASE = (26, 5)  # the first Slurm whose gres.conf takes Flags=env_uuid


class PlanError(ValueError):
    """The plan is wrong; ``problems`` holds one ``file:line: what`` message per problem."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class MigSlice:
    """One MIG slice; ``placement`` is its memory-slice start (given in the plan or solved)."""

    profile: str
    owner: str
    placement: int
    placement_fixed: bool
    line: int


@dataclass(frozen=True)
class GpuPlan:
    """One GPU of a node group: whole (owner, optional mps/shard) or MIG with slices."""

    index: int
    mig: bool
    owner: str  # whole GPU: slurm | kubernetes; MIG: slurm | kubernetes | mixed
    slices: tuple[MigSlice, ...] = ()
    mps: int = 0  # MPS units Slurm offers on this GPU (0: none)
    shard: int = 0  # shards Slurm offers on this GPU (0: none)
    line: int = 0

    def slices_of(self, owner: str) -> list[MigSlice]:
        return [s for s in self.slices if s.owner == owner]

    @property
    def changeable(self) -> bool:
        """Whether a relayout may change it: every slice (or the whole GPU) is Slurm's."""
        return self.owner == "slurm"


@dataclass(frozen=True)
class NodeGroup:
    name: str
    nodes_expr: str
    nodes: tuple[str, ...]
    model: GpuModel
    gpus: tuple[GpuPlan, ...]
    line: int
    relayout: Optional[Menu] = None  # the layouts its Slurm-only GPUs may take

    @property
    def label(self) -> str:
        return f"node {self.nodes[0]}" if len(self.nodes) == 1 else f"nodes {self.nodes_expr}"

    @property
    def has_mig(self) -> bool:
        return any(gpu.mig for gpu in self.gpus)


@dataclass(frozen=True)
class Domain:
    """An NVLink domain: nodes whose GPUs share one NVLink/NVSwitch fabric."""

    name: str
    nodes: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class SlurmOptions:
    version: str = "22.05"
    gres_syntax: str = "22.05"  # "22.05" before 23.11, else "23.11"
    device_root: str = "/dev"
    mps_units_per_gpu: int = 100
    sharing_flag: str = ""  # "", one_sharing, all_sharing (gres.conf Flags=)
    plugin: str = "/usr/lib64/slurm/spank_gpushare.so"
    plugin_args: tuple[tuple[str, str], ...] = ()
    version_given: bool = False  # the plan names slurm.version (else: the installed Slurm's)
    # How the NVLink domains reach Slurm: "tree" (each a leaf switch, --switches) or "block"
    # (each a block of topology/block, --segment; rack-scale domains such as GB200 NVL72).
    topology: str = "tree"
    imex: bool = False  # multi-node NVLink jobs get an IMEX channel (switch/nvidia_imex)
    # gres.conf Flags=env_uuid on the gpu lines (26.05+): Slurm then names a job's GPUs by
    # UUID in CUDA_VISIBLE_DEVICES (where slurmd knows them), not by index.
    env_uuid: bool = False


def release_tuple(version: str) -> tuple[int, int]:
    """``"24.11.5"`` -> (24, 11); the caller has checked the form."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def env_uuid_renders(slurm: SlurmOptions) -> bool:
    """Whether gres.conf gets ``Flags=env_uuid``: the plan asks for it and its release
    (26.05 on) knows the flag. An older slurmd ignores the word, but any ``Flags=`` on a
    gpu line turns its default environment off there (24.11's gres.c): jobs would get no
    ``CUDA_VISIBLE_DEVICES`` at all."""
    return slurm.env_uuid and release_tuple(slurm.version) >= ENV_UUID_RELEASE


def gres_syntax_of(version: str) -> str:
    """The request-string syntax of a Slurm release: ``gres:gpu:1`` before 23.11
    ("22.05"), ``gres/gpu:1`` (``gres/gpu=1`` per task) from 23.11 on ("23.11")."""
    return "22.05" if release_tuple(version) < (23, 11) else "23.11"


def with_slurm_version(plan: Plan, version: str) -> Plan:
    """The plan rendered for Slurm ``version`` (e.g. the installed one): its GRES syntax
    and the limits of that release follow it."""
    slurm = replace(plan.slurm, version=version, gres_syntax=gres_syntax_of(version))
    return replace(plan, slurm=slurm, _by_node={})


@dataclass
class Plan:
    path: str
    version: int
    groups: tuple[NodeGroup, ...]
    domains: tuple[Domain, ...] = ()
    domains_from_fabric: bool = False
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    policy: Policy = field(default_factory=Policy)
    mig_config_prefix: str = "gpushare"
    lending: tuple[LendingRule, ...] = ()  # devices lent between the schedulers, by rule
    _by_node: dict[str, NodeGroup] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self._by_node:
            self._by_node = {node: group for group in self.groups for node in group.nodes}

    def group_of(self, node: str) -> Optional[NodeGroup]:
        return self._by_node.get(node)

    @property
    def nodes(self) -> list[str]:
        return list(self._by_node)

