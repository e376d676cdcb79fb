# SPDX-License-Identifier: GPL-2.0-or-later
"""Slurm's gres.conf, read the way slurmd reads it: per node, each device with its GRES index.

Verification needs Slurm's own numbering: ``SLURM_JOB_GPUS`` (and integer
``CUDA_VISIBLE_DEVICES`` in the prolog) are indices into the node's list of gpu devices (or mps
devices for an mps job), counted in gres.conf order — one per ``File`` entry, one per
``MultipleFiles`` record — and those devices' files are what ties Slurm to NVML.

Syntax (Slurm 22.05+): ``key=value`` words, keys case-insensitive, ``#`` comments, ``\\`` at the
end of a line continues it; ``NodeName=`` takes a hostlist (``gpu[01-04]``); ``File=`` and
``MultipleFiles=`` take ranges (``/dev/nvidia[0-3]``); ``AutoDetect=`` on a line of its own is
global, with ``NodeName=`` it is that node's.
"""

import os
from typing import NamedTuple, Optional, Sequence

import hostlist

from gpushare.common import units
from gpushare.gpu.inventory import Inventory

__all__ = [
    "AUTODETECT_VALUES",
    "GresConf",
    "GresConfError",
    "GresDevice",
    "GresLine",
    "load_gres_conf",
    "parse_gres_conf",
    "slurm_gpu_type",
]

AUTODETECT_VALUES = ("nvml", "nvidia", "rsmi", "oneapi", "nrt", "off", "full")
_KEYS = {
    "autodetect": "AutoDetect", "count": "Count", "cores": "Cores", "cpus": "Cores",
    "file": "File", "files": "File", "multiplefiles": "MultipleFiles", "flags": "Flags",
    "links": "Links", "name": "Name", "nodename": "NodeName", "type": "Type",
}
_FLAGS = {"countonly", "explicit", "one_sharing", "all_sharing", "nvidia_gpu_env",
          "amd_gpu_env", "intel_gpu_env", "opencl_env", "no_gpu_env", "env_uuid"}
_SHARED = ("mps", "shard")


class GresConfError(ValueError):
    """gres.conf is malformed; the message starts with ``<path>:<line>:``."""


class GresLine(NamedTuple):
    """One gres.conf record (after joining continued lines)."""

    line: int
    nodes: Optional[list[str]]  # None: every node
    name: str = ""  # "" for an AutoDetect-only line
    type: str = ""
    files: Sequence[str] = ()
    multiple_files: bool = False
    gres_count: Optional[int] = None  # Count=
    flags: Sequence[str] = ()
    cores: str = ""
    links: str = ""
    autodetect: str = ""
    # ``nodes`` as a set: a cluster-wide gres.conf names thousands of nodes per line.
    node_set: Optional[frozenset[str]] = None

    def applies_to(self, node: str) -> bool:
        if self.nodes is None:
            return True
        return node in (self.node_set if self.node_set is not None else self.nodes)


class GresDevice(NamedTuple):
    """One device as Slurm numbers it on a node: ``slurm_index`` is its place among ``name``
    devices."""

    name: str  # gpu | mps | shard | ...
    slurm_index: int
    type: str
    files: Sequence[str]
    gres_count: int  # 1 for a gpu; this device's share count for mps/shard
    line: int  # gres.conf line it came from (0: AutoDetect)
    flags: Sequence[str] = ()


class GresConf(NamedTuple):
    path: str
    lines: list[GresLine]

    def autodetect(self, node: str) -> str:
        """The AutoDetect mode for ``node``: its own NodeName line wins over the global one."""
        mode = ""
        for line in self.lines:
            if line.autodetect and line.nodes is None:
                mode = line.autodetect
        for line in self.lines:
            if line.autodetect and line.nodes is not None and line.applies_to(node):
                mode = line.autodetect
        return mode

    def devices(self, node: str, name: str = "gpu",
                inventory: Optional[Inventory] = None) -> list[GresDevice]:
        """``node``'s devices of GRES ``name`` in Slurm's index order.

        With AutoDetect=nvml|nvidia and an ``inventory``, gpu devices are those NVML reports
        (NVML index order, a MIG-mode GPU contributing its slices in MIG index order), as
        slurmd's AutoDetect builds them; explicit File lines then only act as Slurm's sanity
        check and do not add devices.
        """
        lines = [ln for ln in self.lines if ln.name == name and ln.applies_to(node)]
        if name == "gpu":
            if inventory is not None and self.autodetect(node) in ("nvml", "nvidia"):
                return autodetect_gpus(inventory, self.autodetect(node))
            return _explicit_devices(lines)
        if name in _SHARED:
            gpus = self.devices(node, "gpu", inventory)
            return _shared_devices(name, lines, gpus)
        return _explicit_devices(lines)


def slurm_gpu_type(gpu_name: str, mig_profile: str = "") -> str:
    """The GRES Type AutoDetect=nvml gives a GPU or MIG slice (``nvidia_a100_3g.20gb``)."""
    base = gpu_name.strip().lower().replace(" ", "_")
    if not mig_profile:
        return base
    return f"{base.split('-', 1)[0]}_{mig_profile}"


def autodetect_gpus(inventory: Inventory, mode: str = "nvml") -> list[GresDevice]:
    devices: list[GresDevice] = []
    for gpu in inventory.gpus:
        if gpu.mig_current and mode == "nvml":
            for mig in gpu.mig_devices:
                devices.append(GresDevice("gpu", len(devices),
                                          slurm_gpu_type(gpu.name, mig.profile),
                                          [gpu.device_file, *mig.caps_files], 1, 0))
        else:
            devices.append(GresDevice("gpu", len(devices), slurm_gpu_type(gpu.name),
                                      [gpu.device_file], 1, 0))
    return devices


def _explicit_devices(lines: list[GresLine]) -> list[GresDevice]:
    devices: list[GresDevice] = []
    for line in lines:
        if line.multiple_files:
            devices.append(GresDevice(line.name, len(devices), line.type, list(line.files),
                                      1, line.line, list(line.flags)))
        elif line.files:
            for path in line.files:
                devices.append(GresDevice(line.name, len(devices), line.type, [path], 1,
                                          line.line, list(line.flags)))
        else:
            devices.append(GresDevice(line.name, len(devices), line.type, [],
                                      line.gres_count if line.gres_count is not None else 1,
                                      line.line,
                                      list(line.flags)))
    return devices


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _shared_devices(name: str, lines: list[GresLine],
                    gpus: list[GresDevice]) -> list[GresDevice]:
    """mps/shard: one device per file (Count split across files), or, without File, the
    Count split evenly across the node's gpus in their order."""
    devices: list[GresDevice] = []
    for line in lines:
        count = line.gres_count if line.gres_count is not None else 0
        if line.files:
            for path, share in zip(line.files, _split(count, len(line.files))):
                devices.append(GresDevice(name, len(devices), line.type, [path], share,
                                          line.line, list(line.flags)))
        elif gpus:
            for gpu, share in zip(gpus, _split(count, len(gpus))):
                devices.append(GresDevice(name, len(devices), line.type or gpu.type,
                                          list(gpu.files), share, line.line, list(line.flags)))
        else:
            devices.append(GresDevice(name, len(devices), line.type, [], count, line.line,
                                      list(line.flags)))
    return devices


def _logical_lines(content: str) -> list[tuple[int, str]]:
    """Strip comments and join ``\\``-continued lines; keep each record's first line number."""
    out: list[tuple[int, str]] = []
    pending = ""
    start = 0
    for number, raw in enumerate(content.splitlines(), start=1):
        text = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        pending += text
        if pending.strip():
            out.append((start, pending.strip()))
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _count(value: str) -> int:
    count = units.parse_count(value)
    if count is None:
        raise ValueError("a whole number, optionally with K, M, G, T or P")
    return count


def _parse_line(number: int, text: str, where: str) -> GresLine:
    def fail(message: str) -> GresConfError:
        return GresConfError(f"{where}:{number}: {message}")

    values: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        canonical = _KEYS.get(key.lower())
        if not sep or canonical is None:
            raise fail(f"unknown gres.conf word {word!r}; expected key=value with keys "
                       "AutoDetect, Name, Type, File, MultipleFiles, Count, Flags, Cores, "
                       "Links, NodeName")
        if canonical in values:
            raise fail(f"{canonical}= given twice")
        if not value:
            raise fail(f"{canonical}= has no value")
        values[canonical] = value
    nodes: Optional[list[str]] = None
    files: list[str] = []
    try:
        if "NodeName" in values:
            nodes = hostlist.expand_hostlist(values["NodeName"])
        for key in ("File", "MultipleFiles"):
            if key in values:
                files = hostlist.expand_hostlist(values[key])
    except hostlist.BadHostlist as err:
        raise fail(f"bad host or file range {text!r}: {err}") from None
    if "File" in values and "MultipleFiles" in values:
        raise fail("File= and MultipleFiles= cannot both be given; use MultipleFiles= for the "
                   "several files of one MIG slice, File= for one device per file")
    multiple_files = "MultipleFiles" in values
    for path in files:
        if not path.startswith("/"):
            raise fail(f"device file {path!r} is not an absolute path")
    autodetect = values.get("AutoDetect", "").lower()
    if autodetect and autodetect not in AUTODETECT_VALUES:
        raise fail(f"AutoDetect={values['AutoDetect']} is not one of "
                   + ", ".join(AUTODETECT_VALUES))
    name = values.get("Name", "")
    if not name and set(values) - {"AutoDetect", "NodeName"}:
        raise fail("a gres.conf record needs Name= (gpu, mps, shard, ...)")
    if not name and not autodetect:
        raise fail("a record with only NodeName= says nothing; add Name= or AutoDetect=")
    count = None
    if "Count" in values:
        try:
            count = _count(values["Count"])
        except ValueError as err:
            raise fail(f"Count={values['Count']} is invalid: expected {err}") from None
    flags = [f for f in values.get("Flags", "").split(",") if f]
    unknown = [f for f in flags if f.lower() not in _FLAGS]
    if unknown:
        raise fail(f"unknown Flags value {unknown[0]!r}; known: " + ", ".join(sorted(_FLAGS)))
    if name == "gpu":
        if files and not multiple_files and count is not None and count != len(files):
            raise fail(f"Count={count} but File= names {len(files)} device file(s); "
                       "for gpus drop Count= or make it match")
        if multiple_files and count not in (None, 1):
            raise fail("MultipleFiles= describes one device; drop Count= or set Count=1")
    return GresLine(line=number, nodes=nodes, name=name, type=values.get("Type", ""),
                    files=files, multiple_files=multiple_files, gres_count=count,
                    flags=flags, cores=values.get("Cores", ""), links=values.get("Links", ""),
                    autodetect=autodetect,
                    node_set=frozenset(nodes) if nodes is not None else None)


def parse_gres_conf(content: str, path: str = "gres.conf") -> GresConf:
    """Parse gres.conf text; every error names ``path`` and the line."""
    return GresConf(path, [_parse_line(number, text, path)
                           for number, text in _logical_lines(content)])


def load_gres_conf(path: str) -> GresConf:
    """Read and parse a gres.conf file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            content = f.read()
    except OSError as err:
        raise GresConfError(f"cannot read {path}: {err.strerror}") from None
    return parse_gres_conf(content, os.path.abspath(path))

