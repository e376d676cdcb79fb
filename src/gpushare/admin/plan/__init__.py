# SPDX-License-Identifier: GPL-2.0-or-later
"""The ownership plan: one YAML file saying who owns every GPU and MIG slice of the cluster.

Slurm's gres.conf, the Kubernetes MIG manager's layout, topology.conf, the plugstack line and
the submit hooks' facts are all rendered from it, so the two schedulers cannot disagree about
a slice. Every problem is reported with the plan's line, because the person fixing it is
looking at the file, not at a traceback.

``model`` holds what is rendered from, ``lines`` the YAML reader and its ``file:line``
checker, ``options`` the cluster-wide sections, ``layout`` the per-GPU rules and
``lending`` the devices one scheduler lends the other (``lent`` renders and proves them).
"""

from __future__ import annotations

from typing import Any, Optional

from gpushare.admin.plan.layout import check_mig_change, node_group
from gpushare.admin.plan.lending import lending_section
from gpushare.admin.plan.lines import Checker, YamlMap, YamlSeq, kind_of, line_of, load_yaml
from gpushare.admin.plan.model import (
    MAX_GPUS_PER_NODE,
    MAX_SWITCH_NAME,
    OWNERS,
    PLAN_VERSION,
    Domain,
    GpuPlan,
    MigSlice,
    NodeGroup,
    Plan,
    PlanError,
    SlurmOptions,
    env_uuid_renders,
    gres_syntax_of,
    release_tuple,
    with_slurm_version,
)
from gpushare.admin.plan.options import (
    check_untyped,
    domains_section,
    policy_section,
    slurm_options,
)
from gpushare.submit.facts import Policy

__all__ = [
    "MAX_GPUS_PER_NODE",
    "MAX_SWITCH_NAME",
    "OWNERS",
    "Domain",
    "GpuPlan",
    "MigSlice",
    "NodeGroup",
    "Plan",
    "PlanError",
    "Policy",
    "SlurmOptions",
    "check_mig_change",
    "env_uuid_renders",
    "gres_syntax_of",
    "load_plan",
    "parse_plan",
    "release_tuple",
    "with_slurm_version",
]

_TOP_KEYS = ("version", "slurm", "kubernetes", "policy", "domains", "node_groups", "lending")


def parse_plan(text: str, path: str = "plan.yaml") -> Plan:
    """Parse and validate a plan; raise PlanError listing every problem with its line."""
    if not isinstance(text, str):
        raise PlanError([f"{path}:1: the plan must be text"])
    data = load_yaml(text, path)
    c = Checker(path)
    if not isinstance(data, YamlMap):
        raise PlanError([f"{path}:1: the plan must be a mapping starting with 'version: 1', "
                         f"not {kind_of(data)}"])
    c.mapping(data, data.line, "the plan", _TOP_KEYS, ("version", "node_groups"))
    version = data.get("version", PLAN_VERSION)
    if isinstance(version, bool) or version != PLAN_VERSION:
        c.error(line_of(data, "version"), f"plan version {data['version']!r} is not supported; "
                f"this gpushare reads version {PLAN_VERSION}")
    slurm = slurm_options(c, data.get("slurm"), line_of(data, "slurm"))
    policy = policy_section(c, data.get("policy"), line_of(data, "policy"))
    prefix = "gpushare"
    if data.get("kubernetes") is not None:
        section = c.mapping(data["kubernetes"], line_of(data, "kubernetes"), "kubernetes",
                            ("mig_config_prefix",))
        if section is not None and "mig_config_prefix" in section:
            prefix = c.string(section["mig_config_prefix"], line_of(section,
                              "mig_config_prefix"), "kubernetes.mig_config_prefix") or prefix
    groups: list[NodeGroup] = []
    raw_groups = data.get("node_groups")
    if "node_groups" in data and (not isinstance(raw_groups, YamlSeq) or not raw_groups):
        c.error(line_of(data, "node_groups"), "node_groups must be a non-empty list of groups "
                "(name, nodes, gpu_model, gpus, layout)")
    elif isinstance(raw_groups, YamlSeq):
        cache: dict[Any, Optional[list[int]]] = {}
        for position, raw in enumerate(raw_groups):
            group = node_group(c, raw, line_of(raw_groups, position), position,
                           slurm.mps_units_per_gpu, cache)
            if group is not None:
                groups.append(group)
    by_node: dict[str, NodeGroup] = {}
    names: dict[str, NodeGroup] = {}
    for group in groups:
        if group.name in names:
            c.error(group.line, f"node group name {group.name!r} used twice (line "
                    f"{names[group.name].line} and line {group.line})")
        names.setdefault(group.name, group)
        for node in group.nodes:
            other = by_node.get(node)
            if other is not None:
                c.error(group.line, f"node {node} is in two node groups ({other.name} at line "
                        f"{other.line}, {group.name} at line {group.line}); a node belongs "
                        "to one")
            else:
                by_node[node] = group
    domains, from_fabric = domains_section(c, data.get("domains"), line_of(data, "domains"),
                                           by_node)
    check_untyped(c, policy, groups)
    lending = lending_section(c, data.get("lending"), line_of(data, "lending"), tuple(groups))
    if slurm.version_given:
        from gpushare.admin.relayout.menu import check_release

        for group in groups:
            if group.relayout is not None:
                check_release(c, slurm.version, group.label, group.relayout)
    if c.problems:
        raise PlanError(c.problems)
    return Plan(path, PLAN_VERSION, tuple(groups), domains, from_fabric, slurm, policy, prefix,
                lending, by_node)


def load_plan(path: str) -> Plan:
    """Read and parse a plan file; a missing or unreadable file is a PlanError too."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise PlanError([f"{path}: cannot read the plan: {err.strerror or err}"]) from None
    except UnicodeDecodeError:
        raise PlanError([f"{path}: the plan is not UTF-8 text"]) from None
    return parse_plan(text, path)

