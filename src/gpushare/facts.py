"""The cluster facts file (docs/cluster-facts.md): loaded once, validated, then read-only.

The submit rules run inside slurmctld under its locks, so everything they need about the
cluster is read here, once, and every problem is reported with the key that holds it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_FACTS_PATH",
    "FACTS_ENV",
    "Facts",
    "FactsError",
    "Policy",
    "facts_from_dict",
    "load_facts",
]

DEFAULT_FACTS_PATH = "/etc/slurm/gpushare-facts.json"  # the constant in job_submit.lua too
FACTS_ENV = "GPUSHARE_FACTS"
SUPPORTED_VERSION = 1
GRES_SYNTAXES = ("22.05", "23.11")
ON_ERROR = ("accept", "reject")


class FactsError(ValueError):
    """The facts file is missing, not JSON, or a key has a bad value; the message names it."""


@dataclass(frozen=True)
class Policy:
    """What the hooks may do on their own: the switch wait they give and accept, and errors."""

    switch_wait_s: int = 300
    max_switch_wait_s: int = 3600
    on_error: str = "accept"


@dataclass(frozen=True)
class Facts:
    """What the submit rules know about the cluster."""

    version: int
    gres_syntax: str
    mps_units_per_gpu: int
    gpu_types: tuple[str, ...]
    mig_types: tuple[str, ...]
    domains: Mapping[str, tuple[str, ...]]
    gpus_per_node: Mapping[str, int]
    policy: Policy = field(default_factory=Policy)

    @property
    def gres_prefix(self) -> str:
        return "gres:" if self.gres_syntax == "22.05" else "gres/"

    @property
    def domain_sizes(self) -> tuple[int, ...]:
        """Node counts of the NVLink domains, largest first."""
        return tuple(sorted((len(nodes) for nodes in self.domains.values()), reverse=True))


def _need(data: Mapping[str, Any], key: str, where: str = "") -> Any:
    if key not in data:
        raise FactsError(f'"{where}{key}" is missing')
    return data[key]


def _int(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FactsError(f'"{key}" must be an integer >= {minimum} (got {json.dumps(value)})')
    return value


def _names(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FactsError(f'"{key}" must be a list of non-empty strings (got {json.dumps(value)})')
    return tuple(value)


def facts_from_dict(data: Any) -> Facts:
    """Validate decoded JSON; raise FactsError naming the first bad key."""
    if not isinstance(data, dict):
        raise FactsError("the top level must be a JSON object")
    version = _need(data, "version")
    if version != SUPPORTED_VERSION:
        raise FactsError(f'"version" must be {SUPPORTED_VERSION} (got {json.dumps(version)}); '
                         "render the file again with this gpushare")
    syntax = _need(data, "gres_syntax")
    if syntax not in GRES_SYNTAXES:
        raise FactsError(f'"gres_syntax" must be one of {", ".join(GRES_SYNTAXES)} '
                         f"(got {json.dumps(syntax)})")
    units = _int(_need(data, "mps_units_per_gpu"), "mps_units_per_gpu", 1)
    gpu_types = _names(_need(data, "gpu_types"), "gpu_types")
    mig_types = _names(_need(data, "mig_types"), "mig_types")
    raw_domains = _need(data, "domains")
    if not isinstance(raw_domains, dict):
        raise FactsError('"domains" must be an object of domain name to a list of node names')
    domains = {name: _names(nodes, f"domains.{name}") for name, nodes in raw_domains.items()}
    raw_gpn = _need(data, "gpus_per_node")
    if not isinstance(raw_gpn, dict):
        raise FactsError('"gpus_per_node" must be an object of node name to a GPU count')
    gpus_per_node = {node: _int(n, f"gpus_per_node.{node}", 0) for node, n in raw_gpn.items()}
    raw_policy = _need(data, "policy")
    if not isinstance(raw_policy, dict):
        raise FactsError('"policy" must be an object')
    wait = _int(_need(raw_policy, "switch_wait_s", "policy."), "policy.switch_wait_s", 0)
    max_wait = _int(_need(raw_policy, "max_switch_wait_s", "policy."),
                    "policy.max_switch_wait_s", 0)
    if wait > max_wait:
        raise FactsError(f'"policy.switch_wait_s" ({wait}) must not exceed '
                         f'"policy.max_switch_wait_s" ({max_wait})')
    on_error = _need(raw_policy, "on_error", "policy.")
    if on_error not in ON_ERROR:
        raise FactsError(f'"policy.on_error" must be one of {", ".join(ON_ERROR)} '
                         f"(got {json.dumps(on_error)})")
    return Facts(version=version, gres_syntax=syntax, mps_units_per_gpu=units,
                 gpu_types=gpu_types, mig_types=mig_types, domains=domains,
                 gpus_per_node=gpus_per_node,
                 policy=Policy(switch_wait_s=wait, max_switch_wait_s=max_wait,
                               on_error=on_error))


def load_facts(path: str) -> Facts:
    """Read and validate the facts file; every failure is a FactsError naming ``path``."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as err:
        raise FactsError(f"{path}: cannot read ({err.strerror}); render it with "
                         "`gpushare render facts --plan FILE`") from None
    except ValueError as err:
        raise FactsError(f"{path}: not valid JSON ({err})") from None
    try:
        return facts_from_dict(data)
    except FactsError as err:
        raise FactsError(f"{path}: {err}") from None
