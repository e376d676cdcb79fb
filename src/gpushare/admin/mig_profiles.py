# SPDX-License-Identifier: GPL-2.0-or-later
"""Which MIG layouts each GPU model can hold, from NVIDIA's placement rules.

A MIG GPU has 8 memory slices (4 on A30) and 7 compute slices (4 on A30). Every GPU-instance
profile occupies a fixed number of memory slices and may only start at certain memory-slice
offsets (its *placements*); two slices may not overlap and the compute slices may not add up to
more than the GPU has. A layout is valid exactly when every slice can be given a placement.
Checking the sums alone is not enough: 3g+3g+1g fits the sums but not the placements.

The GPU-instance id the driver gives a slice follows from its placement (a binary tree over the
memory slices: 0 = whole GPU, 1-2 = halves, 3-6 = quarters, 7-14 = eighths), which is also what
``/proc/driver/nvidia-caps/mig-minors`` numbers its capability files by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = [
    "GPU_MODELS",
    "GpuModel",
    "MigProfile",
    "caps_minors",
    "find_model",
    "gi_id_for_placement",
    "place_slices",
]


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile: its slices and where it may start."""

    name: str  # "3g.40gb"
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]  # allowed memory-slice offsets
    max_instances: int


@dataclass(frozen=True)
class GpuModel:
    """A GPU model the plan may name; ``gres_type`` is Slurm's ``Type=`` for a whole GPU."""

    name: str  # "h100-80gb"
    gres_type: str  # "h100"
    nvml_match: tuple[str, ...]  # substrings of the NVML name that identify it
    memory_gb: int  # nominal, to tell 40GB from 80GB parts apart
    compute_slices: int = 0  # 0: no MIG
    memory_slices: int = 0
    profiles: tuple[MigProfile, ...] = ()
    # An Ampere GPU (A100, A30) applies a MIG mode change only at its next reset, which
    # gpushare never does: its layouts change only within one MIG mode.
    mode_change_needs_reset: bool = False

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)

    @property
    def a_name(self) -> str:
        """The name with its article, as read aloud: "an a100-40gb", "a b200-180gb"."""
        return f"{'an' if self.name[:1] in 'aefhilmnorsx' else 'a'} {self.name}"

    def profile(self, name: str) -> Optional[MigProfile]:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        return None

    def matches_nvml_name(self, nvml_name: str, memory_bytes: int = 0) -> bool:
        """True when an NVML device name (and memory size, when known) is this model."""
        upper = nvml_name.upper()
        if not any(token in upper for token in self.nvml_match):
            return False
        if memory_bytes <= 0:
            return True
        gib = memory_bytes / (1 << 30)
        return abs(gib - self.memory_gb) <= max(4.0, self.memory_gb * 0.1)


def _eight_slice(mem_1g: int, mem_2: int, mem_4: int, mem_7: int) -> tuple[MigProfile, ...]:
    """The profile family shared by A100, H100, H200, B200 and GB200 (8 memory, 7 compute)."""
    return (
        MigProfile(f"1g.{mem_1g}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        MigProfile(f"1g.{mem_1g}gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        MigProfile(f"1g.{mem_2}gb", 1, 2, (0, 2, 4, 6), 4),
        MigProfile(f"2g.{mem_2}gb", 2, 2, (0, 2, 4), 3),
        MigProfile(f"3g.{mem_4}gb", 3, 4, (0, 4), 2),
        MigProfile(f"4g.{mem_4}gb", 4, 4, (0,), 1),
        MigProfile(f"7g.{mem_7}gb", 7, 8, (0,), 1),
    )


def _mig_model(name: str, gres_type: str, match: tuple[str, ...], memory_gb: int,
               sizes: tuple[int, int, int, int], reset: bool = False) -> GpuModel:
    return GpuModel(name, gres_type, match, memory_gb, 7, 8, _eight_slice(*sizes), reset)


GPU_MODELS: tuple[GpuModel, ...] = (
    _mig_model("a100-40gb", "a100", ("A100",), 40, (5, 10, 20, 40), reset=True),
    _mig_model("a100-80gb", "a100", ("A100",), 80, (10, 20, 40, 80), reset=True),
    GpuModel(
        "a30-24gb", "a30", ("A30",), 24, 4, 4,
        (
            MigProfile("1g.6gb", 1, 1, (0, 1, 2, 3), 4),
            MigProfile("1g.6gb+me", 1, 1, (0, 1, 2, 3), 1),
            MigProfile("2g.12gb", 2, 2, (0, 2), 2),
            MigProfile("2g.12gb+me", 2, 2, (0, 2), 1),
            MigProfile("4g.24gb", 4, 4, (0,), 1),
        ),
        mode_change_needs_reset=True,
    ),
    _mig_model("h100-80gb", "h100", ("H100", "H800"), 80, (10, 20, 40, 80)),
    _mig_model("h100-94gb", "h100", ("H100 NVL",), 94, (12, 24, 47, 94)),
    _mig_model("h200-141gb", "h200", ("H200",), 141, (18, 35, 71, 141)),
    _mig_model("b200-180gb", "b200", ("B200",), 180, (23, 45, 90, 180)),
    _mig_model("gb200-186gb", "gb200", ("GB200",), 186, (23, 47, 93, 186)),
    GpuModel("l40s", "l40s", ("L40S",), 48),
    GpuModel("l40", "l40", ("L40",), 48),
    GpuModel("l4", "l4", ("L4",), 24),
)

_ALIASES = {
    "a30": "a30-24gb",
    "h100": "h100-80gb",
    "h200": "h200-141gb",
    "b200": "b200-180gb",
    "gb200": "gb200-186gb",
}

_BY_NAME = {model.name: model for model in GPU_MODELS}


def find_model(name: str) -> Optional[GpuModel]:
    """The model the plan names (case-insensitive; short aliases where unambiguous)."""
    key = name.strip().lower()
    return _BY_NAME.get(_ALIASES.get(key, key))


def model_names() -> list[str]:
    return sorted(set(_BY_NAME) | set(_ALIASES))


def place_slices(model: GpuModel, profiles: Sequence[str],
                 fixed: Optional[Sequence[Optional[int]]] = None) -> Optional[list[int]]:
    """A memory-slice start for each slice, or None when the GPU cannot hold the layout.

    ``fixed`` gives a start for some slices (None: free). The search places large slices first,
    each at its lowest free start; with at most 7 slices the backtracking is instant.
    """
    fixed = list(fixed) if fixed is not None else [None] * len(profiles)
    specs: list[MigProfile] = []
    for name in profiles:
        profile = model.profile(name)
        if profile is None:
            return None
        specs.append(profile)
    counts: dict[str, int] = {}
    for spec in specs:
        counts[spec.name] = counts.get(spec.name, 0) + 1
        if counts[spec.name] > spec.max_instances:
            return None
    if sum(spec.compute_slices for spec in specs) > model.compute_slices:
        return None
    if sum(spec.memory_slices for spec in specs) > model.memory_slices:
        return None
    order = sorted(range(len(specs)),
                   key=lambda i: (fixed[i] is None, -specs[i].memory_slices, i))
    used = [False] * model.memory_slices
    result: list[int] = [0] * len(specs)

    def fits(start: int, size: int) -> bool:
        return start + size <= model.memory_slices and not any(used[start:start + size])

    def mark(start: int, size: int, value: bool) -> None:
        for slot in range(start, start + size):
            used[slot] = value

    def search(pos: int) -> bool:
        if pos == len(order):
            return True
        i = order[pos]
        spec = specs[i]
        starts = spec.starts if fixed[i] is None else (fixed[i],)
        for start in starts:
            if start in spec.starts and fits(start, spec.memory_slices):
                mark(start, spec.memory_slices, True)
                result[i] = start
                if search(pos + 1):
                    return True
                mark(start, spec.memory_slices, False)
        return False

    return result if search(0) else None


def gi_id_for_placement(model: GpuModel, start: int, memory_slices: int) -> int:
    """The GPU-instance id the driver gives a slice at this placement (binary-tree numbering)."""
    total = model.memory_slices
    level_first = {total: 0, total // 2: 1, total // 4: 3, total // 8: 7}
    size = memory_slices
    if size not in level_first:
        raise ValueError(f"no GPU-instance level holds {memory_slices} memory slices")
    return level_first[size] + start // size


# /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, then for each GPU minor 15 GPU
# instances, each an access file followed by 8 compute-instance access files.
_MIG_MINOR_BASE = 3
_GI_PER_GPU = 15
_CI_PER_GI = 8


def caps_minors(gpu_minor: int, gi_id: int, ci_id: int = 0) -> tuple[int, int]:
    """The nvidia-cap minors of ``gpu<minor>/gi<gi>/access`` and ``.../ci<ci>/access``."""
    if not 0 <= gi_id < _GI_PER_GPU or not 0 <= ci_id < _CI_PER_GI or gpu_minor < 0:
        raise ValueError(f"no MIG capability for gpu{gpu_minor}/gi{gi_id}/ci{ci_id}")
    gi_minor = _MIG_MINOR_BASE + gpu_minor * _GI_PER_GPU * (1 + _CI_PER_GI) \
        + gi_id * (1 + _CI_PER_GI)
    return gi_minor, gi_minor + 1 + ci_id
