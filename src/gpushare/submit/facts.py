# SPDX-License-Identifier: GPL-2.0-or-later
"""The cluster facts file (docs/cluster-facts.md): loaded once, validated, then read-only.

The submit rules run inside slurmctld under its locks, so everything they need about the
cluster is read here, once, and every problem is reported with the key that holds it.

job_submit.lua validates the same file with the same checks, in the same order, with the
same messages: ``tests/vectors/facts_loading.json`` runs valid and invalid files through
both. A change here needs the same change there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_FACTS_PATH",
    "FACTS_ENV",
    "MAX_INT",
    "MAX_WAIT_S",
    "ON_ERROR",
    "UNTYPED_POLICIES",
    "Facts",
    "FactsError",
    "Policy",
    "TypeFacts",
    "facts_from_dict",
    "facts_path",
    "load_facts",
]

DEFAULT_FACTS_PATH = "/etc/slurm/gpushare-facts.json"  # the constant in job_submit.lua too
FACTS_ENV = "GPUSHARE_FACTS"
SUPPORTED_VERSION = 2
GRES_SYNTAXES = ("22.05", "23.11")
ON_ERROR = ("accept", "reject")
TOPOLOGIES = ("tree", "block")  # how the NVLink domains reach Slurm (optional key, "tree")
UNTYPED_POLICIES = ("whole", "any")  # or the name of one of gpu_types
MAX_INT = 4294967293  # below Slurm's NO_VAL; Lua represents every integer up to it exactly
MAX_WAIT_S = 7 * 86400  # the plan's limit


class FactsError(ValueError):
    """The facts file is missing, not JSON, or a key has a bad value; the message names it."""


@dataclass(frozen=True)
class Policy:
    """What the submit hooks do on their own: switch waits, untyped GPUs, internal errors
    (the plan's ``policy:`` section, docs/cluster-facts.md)."""

    switch_wait_s: int = 300
    max_switch_wait_s: int = 3600
    on_error: str = "accept"
    # An untyped GPU request (--gres=gpu:1): "whole" writes in the type of the whole GPUs
    # Slurm owns so that it never lands on a MIG slice; "any" leaves it to Slurm; a GPU
    # type of the plan (h100) is written in as it is.
    untyped_gpu: str = "whole"
    untyped_gpu_line: int = 0  # where the plan says it (0 in the facts file)


@dataclass(frozen=True)
class TypeFacts:
    """One GRES type Slurm owns: on how many nodes, at most how many per node, and the
    node counts of the NVLink domains that hold it (largest first; none on PCIe nodes)."""

    nodes: int
    per_node: int
    domain_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Facts:
    """What the submit rules know about the cluster."""

    version: int
    gres_syntax: str
    mps_units_per_gpu: int
    gpu_types: tuple[str, ...]
    mig_types: tuple[str, ...]
    types: Mapping[str, TypeFacts]
    domains: Mapping[str, tuple[str, ...]]
    gpus_per_node: Mapping[str, int]
    policy: Policy = field(default_factory=Policy)
    topology: str = "tree"
    # The node feature of every node whose Slurm GPUs are all whole, rendered only where no
    # node has both whole GPUs and MIG slices for Slurm: an untyped request constrained to
    # it never lands on a slice ("" when there is none).
    whole_gpu_feature: str = ""

    @property
    def gres_prefix(self) -> str:
        return "gres:" if self.gres_syntax == "22.05" else "gres/"

    @property
    def domain_sizes(self) -> tuple[int, ...]:
        """Node counts of all NVLink domains, largest first."""
        return tuple(sorted((len(nodes) for nodes in self.domains.values()), reverse=True))

    def untyped_gpu_type(self) -> str | None:
        """The type an untyped GPU request is written in as, or None when it stays untyped
        (policy ``any``, or no MIG slice it could land on) or cannot be decided."""
        policy = self.policy.untyped_gpu
        if policy not in UNTYPED_POLICIES:
            return policy  # the plan names the type
        if policy == "any" or not self.mig_types:
            return None
        return self.gpu_types[0] if len(self.gpu_types) == 1 else None


def facts_path() -> str:
    """``$GPUSHARE_FACTS``, else the default path: where the hooks read the facts."""
    return os.environ.get(FACTS_ENV) or DEFAULT_FACTS_PATH


def _need(data: Mapping[str, Any], key: str, where: str = "") -> Any:
    if key not in data:
        raise FactsError(f'"{where}{key}" is missing')
    return data[key]


def _int(value: Any, key: str, minimum: int, maximum: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise FactsError(f'"{key}" must be a whole number from {minimum} to {maximum}')
    return value


def _names(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FactsError(f'"{key}" must be a list of non-empty strings')
    return tuple(value)


def _object(value: Any, key: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FactsError(f'"{key}" must be an object of {what}')
    return value


def _type_facts(value: Any, key: str) -> TypeFacts:
    entry = _object(value, key, "nodes, per_node and domain_sizes")
    nodes = _int(_need(entry, "nodes", key + "."), key + ".nodes", 1)
    per_node = _int(_need(entry, "per_node", key + "."), key + ".per_node", 1)
    raw = _need(entry, "domain_sizes", key + ".")
    if not isinstance(raw, list):
        raise FactsError(f'"{key}.domain_sizes" must be a list of node counts')
    sizes = tuple(_int(size, f"{key}.domain_sizes", 1) for size in raw)
    if sum(sizes) > nodes:
        raise FactsError(f'"{key}.domain_sizes" add up to more than "{key}.nodes" ({nodes})')
    return TypeFacts(nodes, per_node, tuple(sorted(sizes, reverse=True)))


def facts_from_dict(data: Any) -> Facts:
    """Validate decoded JSON; raise FactsError naming the first bad key (maps in key order)."""
    if not isinstance(data, dict):
        raise FactsError("the top level must be a JSON object")
    version = _need(data, "version")
    if isinstance(version, bool) or not isinstance(version, int) or version != SUPPORTED_VERSION:
        raise FactsError(f'"version" must be {SUPPORTED_VERSION}; '
                         "render the file again with this gpushare")
    syntax = _need(data, "gres_syntax")
    if syntax not in GRES_SYNTAXES:
        raise FactsError(f'"gres_syntax" must be one of {", ".join(GRES_SYNTAXES)}')
    units = _int(_need(data, "mps_units_per_gpu"), "mps_units_per_gpu", 1)
    gpu_types = _names(_need(data, "gpu_types"), "gpu_types")
    mig_types = _names(_need(data, "mig_types"), "mig_types")
    raw_types = _object(_need(data, "types"), "types", "GRES type to its facts")
    types: dict[str, TypeFacts] = {}
    for name in sorted(set(gpu_types + mig_types)):
        if name not in raw_types:
            raise FactsError(f'"types.{name}" is missing')
    for name in sorted(raw_types):
        if name not in gpu_types and name not in mig_types:
            raise FactsError(f'"types.{name}" is in neither "gpu_types" nor "mig_types"')
        types[name] = _type_facts(raw_types[name], f"types.{name}")
    raw_domains = _object(_need(data, "domains"), "domains", "domain name to node names")
    domains = {name: _names(raw_domains[name], f"domains.{name}")
               for name in sorted(raw_domains)}
    raw_gpn = _object(_need(data, "gpus_per_node"), "gpus_per_node", "node name to GPU count")
    gpus_per_node = {node: _int(raw_gpn[node], f"gpus_per_node.{node}", 0)
                     for node in sorted(raw_gpn)}
    raw_policy = _object(_need(data, "policy"), "policy", "policy keys")
    wait = _int(_need(raw_policy, "switch_wait_s", "policy."), "policy.switch_wait_s", 0,
                MAX_WAIT_S)
    max_wait = _int(_need(raw_policy, "max_switch_wait_s", "policy."),
                    "policy.max_switch_wait_s", 0, MAX_WAIT_S)
    if wait > max_wait:
        raise FactsError(f'"policy.switch_wait_s" ({wait}) must not exceed '
                         f'"policy.max_switch_wait_s" ({max_wait})')
    on_error = _need(raw_policy, "on_error", "policy.")
    if on_error not in ON_ERROR:
        raise FactsError(f'"policy.on_error" must be one of {", ".join(ON_ERROR)}')
    untyped = _need(raw_policy, "untyped_gpu", "policy.")
    if not isinstance(untyped, str) or (untyped not in UNTYPED_POLICIES
                                        and untyped not in gpu_types):
        raise FactsError('"policy.untyped_gpu" must be whole, any or one of "gpu_types"')
    topology = data.get("topology", "tree")
    if topology not in TOPOLOGIES:
        raise FactsError(f'"topology" must be one of {", ".join(TOPOLOGIES)}')
    whole_feature = data.get("whole_gpu_feature", "")
    if not isinstance(whole_feature, str) or (whole_feature and not _is_feature(whole_feature)):
        raise FactsError('"whole_gpu_feature" must be a node feature name (letters, digits, '
                         '_, . and -)')
    return Facts(version=version, gres_syntax=syntax, mps_units_per_gpu=units,
                 gpu_types=gpu_types, mig_types=mig_types, types=types, domains=domains,
                 gpus_per_node=gpus_per_node,
                 policy=Policy(switch_wait_s=wait, max_switch_wait_s=max_wait,
                               on_error=on_error, untyped_gpu=untyped), topology=topology,
                 whole_gpu_feature=whole_feature)


def _is_feature(name: str) -> bool:
    """A name Slurm takes as one node feature (no operator of a constraint in it)."""
    return name.isascii() and all(char.isalnum() or char in "_.-" for char in name)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_facts(path: str) -> Facts:
    """Read and validate the facts file; every failure is a FactsError naming ``path``."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle, parse_constant=_no_constant)
    except OSError as err:
        raise FactsError(f"{path}: cannot read ({err.strerror}); render it with "
                         "`gpushare render facts --plan FILE`") from None
    except ValueError as err:  # also bad UTF-8
        raise FactsError(f"{path}: not valid JSON ({err})") from None
    try:
        return facts_from_dict(data)
    except FactsError as err:
        raise FactsError(f"{path}: {err}") from None
