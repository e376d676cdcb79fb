# SPDX-License-Identifier: GPL-2.0-or-later
"""The ownership plan: one YAML file saying who owns every GPU and MIG slice of the cluster.

Slurm's gres.conf, the Kubernetes MIG manager's layout, topology.conf, the plugstack line and
the submit hooks' facts are all rendered from it, so the two schedulers cannot disagree about
a slice. Every problem is reported with the plan's line, because the person fixing it is
looking at the file, not at a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional

import hostlist
import yaml

from gpushare.admin.mig_profiles import GpuModel, find_model, model_names, place_slices
from gpushare.submit.facts import MAX_WAIT_S, ON_ERROR, UNTYPED_POLICIES, Policy

__all__ = [
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
    "load_plan",
    "parse_plan",
]

OWNERS = ("slurm", "kubernetes")
PLAN_VERSION = 1
MAX_GPUS_PER_NODE = 64
MAX_SWITCH_NAME = 64


class PlanError(ValueError):
    """The plan is wrong; ``problems`` holds one ``file:line: what`` message per problem."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------------------------
# The model


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


@dataclass(frozen=True)
class NodeGroup:
    name: str
    nodes_expr: str
    nodes: tuple[str, ...]
    model: GpuModel
    gpus: tuple[GpuPlan, ...]
    line: int

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


def release_tuple(version: str) -> tuple[int, int]:
    """``"24.11.5"`` -> (24, 11); the caller has checked the form."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


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
    _by_node: dict[str, NodeGroup] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self._by_node:
            self._by_node = {node: group for group in self.groups for node in group.nodes}

    def group_of(self, node: str) -> Optional[NodeGroup]:
        return self._by_node.get(node)

    @property
    def nodes(self) -> list[str]:
        return list(self._by_node)


# --------------------------------------------------------------------------------------------
# YAML with line numbers


class _Map(dict):
    """A YAML mapping that remembers its own line and each key's line."""

    line = 0
    lines: dict[Any, int]


class _Seq(list):
    line = 0
    lines: list[int]


_MAX_DEPTH = 50


def _convert(node: yaml.Node, loader: yaml.SafeLoader, path: str, depth: int = 0) -> Any:
    line = node.start_mark.line + 1
    if depth > _MAX_DEPTH:
        raise PlanError([f"{path}:{line}: the plan nests deeper than {_MAX_DEPTH} levels"])
    if isinstance(node, yaml.MappingNode):
        result = _Map()
        result.line, result.lines = line, {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise PlanError([f"{path}:{key_line}: a key must be a plain word, not a list "
                                 "or mapping"])
            key = _scalar(key_node, loader, path)
            if key in result:
                raise PlanError([f"{path}:{key_line}: key {key!r} given twice (first at line "
                                 f"{result.lines[key]}); keep one"])
            result[key] = _convert(value_node, loader, path, depth + 1)
            result.lines[key] = key_line
        return result
    if isinstance(node, yaml.SequenceNode):
        seq = _Seq(_convert(item, loader, path, depth + 1) for item in node.value)
        seq.line, seq.lines = line, [item.start_mark.line + 1 for item in node.value]
        return seq
    return _scalar(node, loader, path)


def _scalar(node: yaml.Node, loader: yaml.SafeLoader, path: str) -> Any:
    try:
        value = loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as err:
        line = node.start_mark.line + 1
        raise PlanError([f"{path}:{line}: cannot read the value {node.value!r}: "
                         f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"]
                        ) from None
    if isinstance(value, (list, dict)):  # only reachable through odd tags
        raise PlanError([f"{path}:{node.start_mark.line + 1}: expected a plain value"])
    return value


def _load_yaml(text: str, path: str) -> Any:
    loader: Optional[yaml.SafeLoader] = None
    try:
        loader = yaml.SafeLoader(text)
        root = loader.get_single_node()
        if root is None:
            raise PlanError([f"{path}:1: the plan is empty; start with 'version: 1'"])
        return _convert(root, loader, path)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise PlanError([f"{path}:{line}: not valid YAML: {err.problem or err.context}"]
                        ) from None
    except yaml.reader.ReaderError as err:
        line = text[:max(err.position, 0)].count("\n") + 1
        raise PlanError([f"{path}:{line}: not valid YAML text: character {err.character!r} "
                         "is not allowed"]) from None
    except yaml.YAMLError as err:
        raise PlanError([f"{path}:1: not valid YAML: {err}"]) from None
    except RecursionError:
        raise PlanError([f"{path}:1: the plan nests too deeply"]) from None
    finally:
        if loader is not None:
            loader.dispose()


# --------------------------------------------------------------------------------------------
# Validation helpers


class _Checker:
    """Collects problems so that one run of the parser reports all of them."""

    def __init__(self, path: str):
        self.path = path
        self.problems: list[str] = []

    def error(self, line: int, message: str) -> None:
        self.problems.append(f"{self.path}:{line}: {message}")

    def mapping(self, value: Any, line: int, what: str, allowed: Iterable[str],
                required: Iterable[str] = ()) -> Optional[_Map]:
        if not isinstance(value, _Map):
            self.error(line, f"{what} must be a mapping of keys to values, not "
                       f"{_kind(value)}")
            return None
        allowed = tuple(allowed)
        for key in value:
            if key not in allowed:
                self.error(value.lines[key], f"{what}: unknown key {key!r}; accepted: "
                           + ", ".join(allowed))
        for key in required:
            if key not in value:
                self.error(value.line, f"{what}: missing key {key!r}")
        return value

    def integer(self, value: Any, line: int, what: str, low: int, high: int) -> Optional[int]:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(line, f"{what} must be a whole number, not {_kind(value)}")
            return None
        if not low <= value <= high:
            self.error(line, f"{what} must be between {low} and {high}, not {value}")
            return None
        return value

    def string(self, value: Any, line: int, what: str) -> Optional[str]:
        if not isinstance(value, str) or not value.strip():
            self.error(line, f"{what} must be a non-empty string, not {_kind(value)}")
            return None
        return value.strip()

    def choice(self, value: Any, line: int, what: str, choices: Iterable[str]) -> Optional[str]:
        choices = tuple(choices)
        if not isinstance(value, str) or value not in choices:
            self.error(line, f"{what} must be one of {', '.join(choices)}, not {value!r}")
            return None
        return value

    def hostlist(self, value: Any, line: int, what: str) -> Optional[tuple[str, ...]]:
        if isinstance(value, _Seq) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        text = self.string(value, line, what)
        if text is None:
            return None
        try:
            nodes = hostlist.expand_hostlist(text)
        except (hostlist.BadHostlist, ValueError, TypeError) as err:
            self.error(line, f"{what}: bad hostlist {text!r} ({err}); write e.g. n[001-016]")
            return None
        if len(set(nodes)) != len(nodes):
            self.error(line, f"{what}: hostlist {text!r} names a node twice")
        return tuple(nodes)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _line_of(parent: Any, key: Any) -> int:
    if isinstance(parent, _Map):
        return parent.lines.get(key, parent.line)
    if isinstance(parent, _Seq) and isinstance(key, int) and key < len(parent.lines):
        return parent.lines[key]
    return getattr(parent, "line", 1)


# --------------------------------------------------------------------------------------------
# Sections

_TOP_KEYS = ("version", "slurm", "kubernetes", "policy", "domains", "node_groups")
_SLURM_KEYS = ("version", "device_root", "mps_units_per_gpu", "sharing_flag", "topology",
               "imex", "plugin",
               "plugin_args")
_POLICY_KEYS = ("switch_wait_s", "max_switch_wait_s", "on_error", "untyped_gpu")
_GROUP_KEYS = ("name", "nodes", "gpu_model", "gpus", "layout")
_GPU_KEYS = ("owner", "mps", "shard", "mig")
_SLICE_KEYS = ("profile", "owner", "count", "placement")


def _slurm_options(c: _Checker, raw: Any, line: int) -> SlurmOptions:
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
        text = c.string(value, _line_of(section, "version"), "slurm.version")
        parts = (text or "").split(".")
        if text is not None:
            if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
                c.error(_line_of(section, "version"),
                        f"slurm.version must look like \"22.05\" or \"23.11.4\", not {text!r}")
            else:
                version = text
                syntax = gres_syntax_of(version)
    device_root = opts.device_root
    if "device_root" in section:
        root = c.string(section["device_root"], _line_of(section, "device_root"),
                        "slurm.device_root")
        if root is not None:
            if not root.startswith("/"):
                c.error(_line_of(section, "device_root"),
                        f"slurm.device_root must be an absolute directory, not {root!r}")
            else:
                device_root = root.rstrip("/") or "/"
    units = opts.mps_units_per_gpu
    if "mps_units_per_gpu" in section:
        units = c.integer(section["mps_units_per_gpu"], _line_of(section, "mps_units_per_gpu"),
                          "slurm.mps_units_per_gpu", 1, 100000) or units
    flag = ""
    if "sharing_flag" in section:
        flag = c.choice(section["sharing_flag"], _line_of(section, "sharing_flag"),
                        "slurm.sharing_flag", ("none", "one_sharing", "all_sharing")) or ""
        # Slurm 22.05.8 accepts the flag too: with all_sharing, mps jobs use every GPU
        # of a node, not only the first one (one_sharing, the default).
        flag = "" if flag == "none" else flag
    plugin = opts.plugin
    if "plugin" in section:
        text = c.string(section["plugin"], _line_of(section, "plugin"), "slurm.plugin")
        if text is not None and not text.startswith("/"):
            c.error(_line_of(section, "plugin"), "slurm.plugin must be an absolute path")
        elif text is not None:
            plugin = text
    args: tuple[tuple[str, str], ...] = ()
    if "plugin_args" in section:
        args = _plugin_args(c, section["plugin_args"], _line_of(section, "plugin_args"))
    topology = "tree"
    if "topology" in section:
        topology = c.choice(section["topology"], _line_of(section, "topology"),
                            "slurm.topology", ("tree", "block")) or topology
        if topology == "block" and "version" in section and release_tuple(version) < (24, 5):
            c.error(_line_of(section, "topology"),
                    f"slurm.topology: block needs Slurm 24.05 or later (BlockSizes, --segment); "
                    f"slurm.version is {version}")
    imex = False
    if "imex" in section:
        value = section["imex"]
        if not isinstance(value, bool):
            c.error(_line_of(section, "imex"), "slurm.imex must be true or false")
        elif value and "version" in section and release_tuple(version) < (24, 5):
            c.error(_line_of(section, "imex"),
                    f"slurm.imex needs Slurm 24.05 or later (switch/nvidia_imex); "
                    f"slurm.version is {version}")
        else:
            imex = value
    return SlurmOptions(version, syntax, device_root, units, flag, plugin, args,
                        version_given="version" in section and version == text,
                        topology=topology, imex=imex)


def _plugin_args(c: _Checker, raw: Any, line: int) -> tuple[tuple[str, str], ...]:
    from gpushare.node.config import ConfigError, parse_plugin_args

    if not isinstance(raw, _Map):
        c.error(line, "slurm.plugin_args must be a mapping such as {verify: strict}")
        return ()
    pairs: list[tuple[str, str]] = []
    for key, value in raw.items():
        if isinstance(value, bool):
            value = "yes" if value else "no"
        if not isinstance(key, str) or isinstance(value, (list, dict)) or value is None:
            c.error(_line_of(raw, key), f"slurm.plugin_args: {key!r} needs a plain value")
            continue
        pairs.append((key, str(value)))
    try:
        parse_plugin_args(f"{k}={v}" for k, v in pairs)
    except ConfigError as err:
        c.error(line, f"slurm.plugin_args: {err}")
    return tuple(pairs)


def _policy(c: _Checker, raw: Any, line: int) -> Policy:
    if raw is None:
        return Policy()
    section = c.mapping(raw, line, "policy", _POLICY_KEYS)
    if section is None:
        return Policy()
    default = Policy()
    wait = default.switch_wait_s
    if "switch_wait_s" in section:
        given = c.integer(section["switch_wait_s"], _line_of(section, "switch_wait_s"),
                          "policy.switch_wait_s", 0, MAX_WAIT_S)
        wait = default.switch_wait_s if given is None else given
    max_wait = default.max_switch_wait_s
    if "max_switch_wait_s" in section:
        given = c.integer(section["max_switch_wait_s"], _line_of(section, "max_switch_wait_s"),
                          "policy.max_switch_wait_s", 0, MAX_WAIT_S)
        max_wait = default.max_switch_wait_s if given is None else given
    if wait > max_wait:
        c.error(section.line, f"policy.switch_wait_s ({wait}) is longer than "
                f"policy.max_switch_wait_s ({max_wait})")
    on_error = default.on_error
    if "on_error" in section:
        on_error = c.choice(section["on_error"], _line_of(section, "on_error"),
                            "policy.on_error", ON_ERROR) or on_error
    untyped, untyped_line = default.untyped_gpu, 0
    if "untyped_gpu" in section:
        untyped_line = _line_of(section, "untyped_gpu")
        untyped = c.string(section["untyped_gpu"], untyped_line, "policy.untyped_gpu") or untyped
    return Policy(wait, max_wait, on_error, untyped, untyped_line)


def _check_untyped(c: _Checker, policy: Policy, groups: Iterable[NodeGroup]) -> None:
    """``policy.untyped_gpu`` is whole, any, or the type of whole GPUs Slurm owns."""
    if policy.untyped_gpu in UNTYPED_POLICIES:
        return
    whole = sorted({group.model.gres_type for group in groups
                    if any(not gpu.mig and gpu.owner == "slurm" for gpu in group.gpus)})
    if policy.untyped_gpu not in whole:
        c.error(policy.untyped_gpu_line, f"policy.untyped_gpu {policy.untyped_gpu!r} must be "
                "whole, any, or a type of whole GPUs Slurm owns here "
                f"({', '.join(whole) or 'none'})")


def _gpu_indices(c: _Checker, key: Any, line: int, where: str, count: int) -> Optional[list[int]]:
    """``all``, ``3``, ``"0-3"``, ``"0,2,5"`` or ``"0-1,4"`` → GPU indices."""
    if isinstance(key, int) and not isinstance(key, bool):
        text = str(key)
    elif isinstance(key, str):
        text = key.strip()
    else:
        c.error(line, f"{where}: layout key {key!r} must be all, a GPU index, or a range "
                "like 0-3")
        return None
    if text == "all":
        return list(range(count))
    indices: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            c.error(line, f"{where}: layout key {key!r} must be all, a GPU index, or a range "
                    "like 0-3")
            return None
        first, last = int(low), int(high) if sep else int(low)
        if first > last or last >= count:
            c.error(line, f"{where}: GPUs {part.strip()} are not within 0-{count - 1} "
                    f"(the group has {count} GPUs per node)")
            return None
        indices.extend(range(first, last + 1))
    return indices


def _gpu_plan(c: _Checker, raw: Any, line: int, where: str, index: int, model: GpuModel,
              units_default: int, cache: dict[Any, Optional[list[int]]]) -> Optional[GpuPlan]:
    spec = c.mapping(raw, line, f"{where} GPU {index}", _GPU_KEYS)
    if spec is None:
        return None
    owner = None
    if "owner" in spec:
        owner = c.choice(spec["owner"], _line_of(spec, "owner"), f"{where} GPU {index}: owner",
                         OWNERS)
    if "mig" not in spec:
        if "owner" not in spec:
            c.error(spec.line, f"{where} GPU {index}: say who owns it (owner: slurm or "
                    "owner: kubernetes), or give its MIG slices (mig: [...])")
            return None
        mps = shard = 0
        if "mps" in spec:
            value = spec["mps"]
            if value is True:
                mps = units_default
            else:
                mps = c.integer(value, _line_of(spec, "mps"), f"{where} GPU {index}: mps",
                                1, 100000) or 0
        if "shard" in spec:
            shard = c.integer(spec["shard"], _line_of(spec, "shard"),
                              f"{where} GPU {index}: shard", 1, 100000) or 0
        if mps and shard:
            c.error(spec.line, f"{where} GPU {index}: a GPU is shared through mps or shard, "
                    "not both; keep one")
        if (mps or shard) and owner == "kubernetes":
            c.error(spec.line, f"{where} GPU {index}: mps/shard are Slurm's sharing, but the "
                    "GPU belongs to kubernetes; remove them or set owner: slurm")
        if owner is None:
            return None
        return GpuPlan(index, False, owner, (), mps, shard, spec.line)
    for key in ("mps", "shard"):
        if key in spec:
            c.error(_line_of(spec, key), f"{where} GPU {index}: {key} applies to whole GPUs; "
                    "a MIG GPU is shared through its slices")
    if not model.mig_capable:
        c.error(_line_of(spec, "mig"), f"{where} GPU {index}: a {model.name} has no MIG; "
                "give it as a whole GPU (owner: ...)")
        return None
    raw_slices = spec["mig"]
    slice_line = _line_of(spec, "mig")
    if not isinstance(raw_slices, _Seq) or not raw_slices:
        c.error(slice_line, f"{where} GPU {index}: mig must be a non-empty list of slices like "
                "{profile: 1g.10gb, owner: slurm}")
        return None
    slices: list[tuple[str, str, Optional[int], int]] = []  # profile, owner, placement, line
    ok = True
    for pos, item in enumerate(raw_slices):
        item_line = _line_of(raw_slices, pos)
        what = f"{where} GPU {index} slice {pos + 1}"
        entry = c.mapping(item, item_line, what, _SLICE_KEYS, ("profile",))
        if entry is None or "profile" not in entry:
            ok = False
            continue
        profile = c.string(entry["profile"], _line_of(entry, "profile"), f"{what}: profile")
        if profile is not None and model.profile(profile) is None:
            c.error(_line_of(entry, "profile"), f"{what}: a {model.name} has no MIG profile "
                    f"{profile!r}; it has " + ", ".join(p.name for p in model.profiles))
            profile = None
        slice_owner = owner
        if "owner" in entry:
            slice_owner = c.choice(entry["owner"], _line_of(entry, "owner"), f"{what}: owner",
                                   OWNERS)
        elif owner is None:
            c.error(entry.line, f"{what}: say who owns it (owner: slurm or owner: kubernetes) "
                    "here or for the whole GPU")
        count = 1
        if "count" in entry:
            count = c.integer(entry["count"], _line_of(entry, "count"), f"{what}: count",
                              1, model.compute_slices) or 0
        placement: Optional[int] = None
        if "placement" in entry:
            placement = c.integer(entry["placement"], _line_of(entry, "placement"),
                                  f"{what}: placement", 0, model.memory_slices - 1)
            if placement is not None and count > 1:
                c.error(_line_of(entry, "placement"), f"{what}: a placement fixes one slice; "
                        "use count: 1 with it")
                placement = None
        if profile is None or slice_owner is None or not count:
            ok = False
            continue
        slices.extend((profile, slice_owner, placement, entry.line) for _ in range(count))
    if not ok:
        return None
    owners_by_profile: dict[str, tuple[str, int]] = {}
    for profile, slice_owner, _placement, slice_line_no in slices:
        seen = owners_by_profile.setdefault(profile, (slice_owner, slice_line_no))
        if seen[0] != slice_owner:
            c.error(slice_line_no, f"{where} GPU {index}: slice {profile} owned twice "
                    f"({seen[0]} at line {seen[1]}, {slice_owner} at line {slice_line_no}); "
                    "slices of one profile on one GPU cannot be told apart by gres.conf or "
                    "the MIG manager, so give each owner a different profile or GPU")
            return None
    cache_key = (model.name, tuple(s[0] for s in slices), tuple(s[2] for s in slices))
    if cache_key not in cache:
        cache[cache_key] = place_slices(model, cache_key[1], cache_key[2])
    placements = cache[cache_key]
    if placements is None:
        c.error(slice_line, f"{where} GPU {index}: a {model.name} cannot hold "
                f"{' + '.join(s[0] for s in slices)}: {_why_not(model, slices)}")
        return None
    mig_slices = tuple(MigSlice(s[0], s[1], start, s[2] is not None, s[3])
                       for s, start in zip(slices, placements))
    owners = {s.owner for s in mig_slices}
    gpu_owner = owners.pop() if len(owners) == 1 else "mixed"
    return GpuPlan(index, True, gpu_owner, mig_slices, 0, 0, spec.line)


def _why_not(model: GpuModel, slices: list[tuple[str, str, Optional[int], int]]) -> str:
    counts: dict[str, int] = {}
    compute = memory = 0
    for name, *_ in slices:
        profile = model.profile(name)
        assert profile is not None
        counts[name] = counts.get(name, 0) + 1
        compute += profile.compute_slices
        memory += profile.memory_slices
        if counts[name] > profile.max_instances:
            return f"at most {profile.max_instances} × {name} fit on one GPU"
    if compute > model.compute_slices:
        return f"they need {compute} compute slices and the GPU has {model.compute_slices}"
    if memory > model.memory_slices:
        return f"they need {memory} memory slices and the GPU has {model.memory_slices}"
    return ("no placement fits them together under NVIDIA's MIG placement rules "
            "(see `nvidia-smi mig -lgipp`); choose other profiles or remove fixed placements")


def _group(c: _Checker, raw: Any, line: int, position: int, units_default: int,
           cache: dict[Any, Optional[list[int]]]) -> Optional[NodeGroup]:
    what = f"node_groups[{position}]"
    section = c.mapping(raw, line, what, _GROUP_KEYS, _GROUP_KEYS)
    if section is None or any(key not in section for key in _GROUP_KEYS):
        return None
    name = c.string(section["name"], _line_of(section, "name"), f"{what}.name")
    if name is not None:
        what = f"node group {name}"
    nodes = c.hostlist(section["nodes"], _line_of(section, "nodes"), f"{what}: nodes")
    model_name = c.string(section["gpu_model"], _line_of(section, "gpu_model"),
                          f"{what}: gpu_model")
    model = find_model(model_name) if model_name is not None else None
    if model_name is not None and model is None:
        c.error(_line_of(section, "gpu_model"), f"{what}: unknown gpu_model {model_name!r}; "
                "known: " + ", ".join(model_names()))
    count = c.integer(section["gpus"], _line_of(section, "gpus"), f"{what}: gpus", 1,
                      MAX_GPUS_PER_NODE)
    if name is None or nodes is None or model is None or count is None:
        return None
    expr = hostlist.collect_hostlist(list(nodes))
    where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {expr}"
    layout = section["layout"]
    if not isinstance(layout, _Map) or not layout:
        c.error(_line_of(section, "layout"), f"{what}: layout must map GPUs (all, 0, 0-3) to "
                "their owner or MIG slices")
        return None
    default_key = next((k for k in layout if k == "all"), None)
    chosen: dict[int, tuple[Any, int]] = {}  # gpu index -> (raw spec, line)
    for key in layout:
        if key == "all":
            continue
        key_line = _line_of(layout, key)
        indices = _gpu_indices(c, key, key_line, where, count)
        for index in indices or ():
            if index in chosen:
                c.error(key_line, f"{where} GPU {index}: laid out twice (line {chosen[index][1]} "
                        f"and line {key_line}); give each GPU once")
            chosen[index] = (layout[key], key_line)
    gpus: list[GpuPlan] = []
    built: dict[int, Optional[GpuPlan]] = {}  # one parse (and one report) per distinct spec
    for index in range(count):
        if index in chosen:
            raw_spec, spec_line = chosen[index]
        elif default_key is not None:
            raw_spec, spec_line = layout[default_key], _line_of(layout, default_key)
        else:
            c.error(layout.line, f"{where} GPU {index}: not in the layout; add it or an "
                    "'all:' entry")
            continue
        if id(raw_spec) in built:
            previous = built[id(raw_spec)]
            if previous is not None:
                gpus.append(_reindex(previous, index))
            continue
        gpu = _gpu_plan(c, raw_spec, spec_line, where, index, model, units_default, cache)
        built[id(raw_spec)] = gpu
        if gpu is not None:
            gpus.append(gpu)
    if len(gpus) != count:
        return None
    return NodeGroup(name, expr, nodes, model, tuple(gpus), section.line)


def _reindex(gpu: GpuPlan, index: int) -> GpuPlan:
    return GpuPlan(index, gpu.mig, gpu.owner, gpu.slices, gpu.mps, gpu.shard, gpu.line)


def _domains(c: _Checker, raw: Any, line: int, by_node: dict[str, NodeGroup]
             ) -> tuple[tuple[Domain, ...], bool]:
    if raw is None:
        return (), False
    if raw == "fabric":
        return (), True
    if not isinstance(raw, _Map):
        c.error(line, "domains must map each NVLink domain name to its nodes (nvl0: n[1-4]), "
                "or be 'fabric' to take them from the GPUs' fabric clique")
        return (), False
    domains: list[Domain] = []
    owner_of: dict[str, tuple[str, int]] = {}
    for name, value in raw.items():
        key_line = _line_of(raw, name)
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


# --------------------------------------------------------------------------------------------
# Entry points


def parse_plan(text: str, path: str = "plan.yaml") -> Plan:
    """Parse and validate a plan; raise PlanError listing every problem with its line."""
    if not isinstance(text, str):
        raise PlanError([f"{path}:1: the plan must be text"])
    data = _load_yaml(text, path)
    c = _Checker(path)
    if not isinstance(data, _Map):
        raise PlanError([f"{path}:1: the plan must be a mapping starting with 'version: 1', "
                         f"not {_kind(data)}"])
    c.mapping(data, data.line, "the plan", _TOP_KEYS, ("version", "node_groups"))
    version = data.get("version", PLAN_VERSION)
    if isinstance(version, bool) or version != PLAN_VERSION:
        c.error(_line_of(data, "version"), f"plan version {data['version']!r} is not supported; "
                f"this gpushare reads version {PLAN_VERSION}")
    slurm = _slurm_options(c, data.get("slurm"), _line_of(data, "slurm"))
    policy = _policy(c, data.get("policy"), _line_of(data, "policy"))
    prefix = "gpushare"
    if data.get("kubernetes") is not None:
        section = c.mapping(data["kubernetes"], _line_of(data, "kubernetes"), "kubernetes",
                            ("mig_config_prefix",))
        if section is not None and "mig_config_prefix" in section:
            prefix = c.string(section["mig_config_prefix"], _line_of(section,
                              "mig_config_prefix"), "kubernetes.mig_config_prefix") or prefix
    groups: list[NodeGroup] = []
    raw_groups = data.get("node_groups")
    if "node_groups" in data and (not isinstance(raw_groups, _Seq) or not raw_groups):
        c.error(_line_of(data, "node_groups"), "node_groups must be a non-empty list of groups "
                "(name, nodes, gpu_model, gpus, layout)")
    elif isinstance(raw_groups, _Seq):
        cache: dict[Any, Optional[list[int]]] = {}
        for position, raw in enumerate(raw_groups):
            group = _group(c, raw, _line_of(raw_groups, position), position,
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
    domains, from_fabric = _domains(c, data.get("domains"), _line_of(data, "domains"), by_node)
    _check_untyped(c, policy, groups)
    if c.problems:
        raise PlanError(c.problems)
    return Plan(path, PLAN_VERSION, tuple(groups), domains, from_fabric, slurm, policy, prefix,
                by_node)


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


def check_mig_change(plan: Plan, inventory: Any, busy_gpus: Iterable[int]) -> list[int]:
    """GPUs of this node whose MIG mode the plan changes; PlanError if that hits busy GPUs.

    The MIG manager (mig-parted) resets *every* GPU of a node after any MIG mode change, so a
    mode change on one Kubernetes GPU would kill the Slurm jobs on all the others.
    """
    group = plan.group_of(inventory.hostname)
    if group is None:
        raise PlanError([f"{plan.path}: node {inventory.hostname} is in no node group"])
    planned = {gpu.index: gpu for gpu in group.gpus}
    changes = [gpu.nvml_index for gpu in inventory.gpus
               if gpu.nvml_index in planned
               and planned[gpu.nvml_index].mig != bool(gpu.mig_current)]
    busy = sorted(set(busy_gpus))
    if changes and busy:
        first = planned[changes[0]]
        modes = ", ".join(f"GPU {i} to MIG {'on' if planned[i].mig else 'off'}" for i in changes)
        raise PlanError([
            f"{plan.path}:{first.line}: node {inventory.hostname}: the plan switches {modes}; "
            f"the MIG manager then resets every GPU of the node, but Slurm is using GPU "
            f"{', '.join(str(i) for i in busy)}; drain the node and wait for its jobs to end "
            "before applying this layout"])
    return changes
