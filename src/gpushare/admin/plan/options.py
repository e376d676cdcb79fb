# SPDX-License-Identifier: GPL-2.0-or-later
"""The plan's cluster-wide sections: slurm, policy and the NVLink domains."""

from __future__ import annotations

from typing import Any, Iterable

from gpushare.admin.plan.lines import Checker, YamlMap, line_of
from gpushare.admin.plan.model import (
    ENV_UUID_RELEASE,
    MAX_SWITCH_NAME,
    Domain,
    NodeGroup,
    SlurmOptions,
    gres_syntax_of,
    release_tuple,
)
from gpushare.submit.facts import MAX_WAIT_S, ON_ERROR, UNTYPED_POLICIES, Policy

_SLURM_KEYS = ("version", "device_root", "mps_units_per_gpu", "sharing_flag", "topology",
               "imex", "env_uuid", "plugin", "plugin_args")
_POLICY_KEYS = ("switch_wait_s", "max_switch_wait_s", "on_error", "untyped_gpu")


def slurm_options(c: Checker, raw: Any, line: int) -> SlurmOptions:
    opts = SlurmOptions()
    if raw is None:
        return opts
    section = c.mapping(raw, line, "slurm", _SLURM_KEYS)
    if section is None:
        return opts
    version, syntax = opts.version, opts.gres_syntax
    if "version" in section:
        value = section["version"]
        if isinstance(value, float):
            value = f"{value:.2f}"
        text = c.string(value, line_of(section, "version"), "slurm.version")
        parts = (text or "").split(".")
        if text is not None:
            if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
                c.error(line_of(section, "version"),
                        f"slurm.version must look like \"22.05\" or \"23.11.4\", not {text!r}")
            else:
                version = text
                syntax = gres_syntax_of(version)
    device_root = opts.device_root
    if "device_root" in section:
        root = c.string(section["device_root"], line_of(section, "device_root"),
                        "slurm.device_root")
        if root is not None:
            if not root.startswith("/"):
                c.error(line_of(section, "device_root"),
                        f"slurm.device_root must be an absolute directory, not {root!r}")
            else:
                device_root = root.rstrip("/") or "/"
    units = opts.mps_units_per_gpu
    if "mps_units_per_gpu" in section:
        units = c.integer(section["mps_units_per_gpu"], line_of(section, "mps_units_per_gpu"),
                          "slurm.mps_units_per_gpu", 1, 100000) or units
    flag = ""
    if "sharing_flag" in section:
        flag = c.choice(section["sharing_flag"], line_of(section, "sharing_flag"),
                        "slurm.sharing_flag", ("none", "one_sharing", "all_sharing")) or ""
        # Slurm 22.05.8 accepts the flag too: with all_sharing, mps jobs use every GPU
        # of a node, not only the first one (one_sharing, the default).
        flag = "" if flag == "none" else flag
    plugin = opts.plugin
    if "plugin" in section:
        path = c.string(section["plugin"], line_of(section, "plugin"), "slurm.plugin")
        if path is not None and not path.startswith("/"):
            c.error(line_of(section, "plugin"), "slurm.plugin must be an absolute path")
        elif path is not None:
            plugin = path
    args: tuple[tuple[str, str], ...] = ()
    if "plugin_args" in section:
        args = _plugin_args(c, section["plugin_args"], line_of(section, "plugin_args"))
    topology = "tree"
    if "topology" in section:
        topology = c.choice(section["topology"], line_of(section, "topology"),
                            "slurm.topology", ("tree", "block")) or topology
        if topology == "block" and "version" in section and release_tuple(version) < (24, 5):
            c.error(line_of(section, "topology"),
                    f"slurm.topology: block needs Slurm 24.05 or later (BlockSizes, --segment); "
                    f"slurm.version is {version}")
    imex = False
    if "imex" in section:
        value = section["imex"]
        if not isinstance(value, bool):
            c.error(line_of(section, "imex"), "slurm.imex must be true or false")
        elif value and "version" in section and release_tuple(version) < (24, 5):
            c.error(line_of(section, "imex"),
                    f"slurm.imex needs Slurm 24.05 or later (switch/nvidia_imex); "
                    f"slurm.version is {version}")
        else:
            imex = value
    env_uuid = False
    if "env_uuid" in section:
        value = section["env_uuid"]
        if not isinstance(value, bool):
            c.error(line_of(section, "env_uuid"), "slurm.env_uuid must be true or false")
        elif value and "version" in section and release_tuple(version) < ENV_UUID_RELEASE:
            c.error(line_of(section, "env_uuid"),
                    f"slurm.env_uuid needs Slurm 26.05 or later (gres.conf Flags=env_uuid); "
                    f"slurm.version is {version}")
        else:
            env_uuid = value
    return SlurmOptions(version, syntax, device_root, units, flag, plugin, args,
                        version_given="version" in section and version == text,
                        topology=topology, imex=imex, env_uuid=env_uuid)


def _plugin_args(c: Checker, raw: Any, line: int) -> tuple[tuple[str, str], ...]:
    from gpushare.node.config import ConfigError, parse_plugin_args

    if not isinstance(raw, YamlMap):
        c.error(line, "slurm.plugin_args must be a mapping such as {verify: strict}")
        return ()
    pairs: list[tuple[str, str]] = []
    for key, value in raw.items():
        if isinstance(value, bool):
            value = "yes" if value else "no"
        if not isinstance(key, str) or isinstance(value, (list, dict)) or value is None:
            c.error(line_of(raw, key), f"slurm.plugin_args: {key!r} needs a plain value")
            continue
        pairs.append((key, str(value)))
    try:
        parse_plugin_args(f"{k}={v}" for k, v in pairs)
    except ConfigError as err:
        c.error(line, f"slurm.plugin_args: {err}")
    return tuple(pairs)


def policy_section(c: Checker, raw: Any, line: int) -> Policy:
    if raw is None:
        return Policy()
    section = c.mapping(raw, line, "policy", _POLICY_KEYS)
    if section is None:
        return Policy()
    default = Policy()
    wait = default.switch_wait_s
    if "switch_wait_s" in section:
        given = c.integer(section["switch_wait_s"], line_of(section, "switch_wait_s"),
                          "policy.switch_wait_s", 0, MAX_WAIT_S)
        wait = default.switch_wait_s if given is None else given
    max_wait = default.max_switch_wait_s
    if "max_switch_wait_s" in section:
        given = c.integer(section["max_switch_wait_s"], line_of(section, "max_switch_wait_s"),
                          "policy.max_switch_wait_s", 0, MAX_WAIT_S)
        max_wait = default.max_switch_wait_s if given is None else given
    if wait > max_wait:
        c.error(section.line, f"policy.switch_wait_s ({wait}) is longer than "
                f"policy.max_switch_wait_s ({max_wait})")
    on_error = default.on_error
    if "on_error" in section:
        on_error = c.choice(section["on_error"], line_of(section, "on_error"),
                            "policy.on_error", ON_ERROR) or on_error
    untyped, untyped_line = default.untyped_gpu, 0
    if "untyped_gpu" in section:
        untyped_line = line_of(section, "untyped_gpu")
        untyped = c.string(section["untyped_gpu"], untyped_line, "policy.untyped_gpu") or untyped
    return Policy(wait, max_wait, on_error, untyped, untyped_line)


def check_untyped(c: Checker, policy: Policy, groups: Iterable[NodeGroup]) -> None:
    """``policy.untyped_gpu`` is whole, any, or the type of whole GPUs Slurm owns."""
    if policy.untyped_gpu in UNTYPED_POLICIES:
        return
    whole = sorted({group.model.gres_type for group in groups
                    if any(not gpu.mig and gpu.owner == "slurm" for gpu in group.gpus)})
    if policy.untyped_gpu not in whole:
        c.error(policy.untyped_gpu_line, f"policy.untyped_gpu {policy.untyped_gpu!r} must be "
                "whole, any, or a type of whole GPUs Slurm owns here "
                f"({', '.join(whole) or 'none'})")



def domains_section(c: Checker, raw: Any, line: int, by_node: dict[str, NodeGroup]
             ) -> tuple[tuple[Domain, ...], bool]:
    if raw is None:
        return (), False
    if raw == "fabric":
        return (), True
    if not isinstance(raw, YamlMap):
        c.error(line, "domains must map each NVLink domain name to its nodes (nvl0: n[1-4]), "
                "or be 'fabric' to take them from the GPUs' fabric clique")
        return (), False
    domains: list[Domain] = []
    owner_of: dict[str, tuple[str, int]] = {}
    for name, value in raw.items():
        key_line = line_of(raw, name)
        if not isinstance(name, str) or not name or len(name) > MAX_SWITCH_NAME \
                or any(ch.isspace() or ch in "=,[]#" for ch in name):
            c.error(key_line, f"domain name {name!r} must be a word of at most "
                    f"{MAX_SWITCH_NAME} characters (it becomes a SwitchName in topology.conf)")
            continue
        nodes = c.hostlist(value, key_line, f"domain {name}")
        if nodes is None:
            continue
        for node in nodes:
            if node in owner_of:
                other, other_line = owner_of[node]
                c.error(key_line, f"node {node} is in two NVLink domains ({other} at line "
                        f"{other_line}, {name} at line {key_line}); a node belongs to one")
            elif node not in by_node:
                c.error(key_line, f"domain {name}: node {node} is in no node group; add it to "
                        "one or remove it from the domain")
            owner_of.setdefault(node, (name, key_line))
        domains.append(Domain(name, nodes, key_line))
    return tuple(domains), False

