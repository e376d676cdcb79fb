# SPDX-License-Identifier: GPL-2.0-or-later
"""The layouts a node group's GPUs may take, and the bounds on changing them.

A plan names them per node group::

    relayout:
      min_interval_s: 3600
      menu:
        - {layout: 7x1g.10gb, min: 2}
        - {layout: 3g.40gb+2g.20gb+1g.10gb}
        - {layout: whole, max: 8}
        - {layout: "mps:100"}

Only GPUs whose every slice is Slurm's take part: a Kubernetes GPU or a mixed one keeps the
layout the plan gives it, so what the MIG manager renders for Kubernetes never changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from gpushare.admin.mig_profiles import GpuModel, place_slices
from gpushare.admin.plan.lines import Checker, YamlMap, YamlSeq, line_of

__all__ = ["DEFAULT_MIN_INTERVAL_S", "Layout", "Menu", "MenuItem", "check_mig_mode",
           "check_release", "give_back", "one_profile_per_node", "parse_layout", "parse_menu",
           "take"]

DEFAULT_MIN_INTERVAL_S = 3600
NOT_SLURMS = "kubernetes"  # the layout name of a GPU Slurm has nothing of
MAX_INTERVAL_S = 7 * 86400
_MENU_KEYS = ("menu", "min_interval_s")
_ITEM_KEYS = ("layout", "min", "max")


@dataclass(frozen=True)
class Layout:
    """One GPU's layout: MIG slices (largest first), or whole, or whole with MPS units."""

    name: str  # canonical: "7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", "whole", "mps:100"
    slices: tuple[str, ...] = ()
    mps: int = 0

    @property
    def mig(self) -> bool:
        return bool(self.slices)

    def offers(self) -> dict[str, int]:
        """What Slurm gets from one GPU in this layout, by request type: {"1g.10gb": 7},
        {"whole": 1}, {"mps": 100}."""
        if self.mps:
            return {"mps": self.mps}
        if self.name == NOT_SLURMS:
            return {}
        if not self.slices:
            return {"whole": 1}
        counts: dict[str, int] = {}
        for profile in self.slices:
            counts[profile] = counts.get(profile, 0) + 1
        return counts

    def serves(self) -> dict[str, int]:
        """What an idle GPU in this layout can give jobs: ``offers()``, and a GPU with MPS
        units also whole, as Slurm gives it as gres/gpu or as gres/mps, never both at once
        (``take`` and ``give_back`` keep the two apart)."""
        counts = self.offers()
        if self.mps:
            counts["whole"] = 1
        return counts


def take(layout: Layout, free: dict[str, int], kind: str, units: int) -> None:
    """Take ``units`` of ``kind`` from ``free``, one GPU's free units in ``layout``: a GPU
    with MPS units taken whole has no units left, and one with units taken is no longer
    whole."""
    free[kind] = free.get(kind, 0) - units
    if layout.mps and units:
        if kind == "whole":
            free["mps"] = 0
        elif kind == "mps":
            free["whole"] = 0


def give_back(layout: Layout, free: dict[str, int], kind: str, units: int) -> None:
    """``take``'s reverse: the GPU is whole again once every MPS unit is back."""
    if layout.mps and kind == "whole" and units:
        free["whole"], free["mps"] = 1, layout.mps
        return
    free[kind] = free.get(kind, 0) + units
    if layout.mps and kind == "mps" and free[kind] >= layout.mps:
        free["whole"] = 1


@dataclass(frozen=True)
class MenuItem:
    layout: Layout
    low: int  # at least this many of the group's changeable GPUs in this layout
    high: int  # at most this many
    line: int


@dataclass(frozen=True)
class Menu:
    items: tuple[MenuItem, ...]
    min_interval_s: int
    line: int

    def item(self, name: str) -> Optional[MenuItem]:
        return next((item for item in self.items if item.layout.name == name), None)


def layout_name(slices: tuple[str, ...], mps: int = 0) -> str:
    """The canonical name of a layout: equal layouts have equal names."""
    if mps:
        return f"mps:{mps}"
    if not slices:
        return "whole"
    ordered = sorted(set(slices), key=lambda p: (-_size(p), p))
    parts = []
    for profile in ordered:
        count = slices.count(profile)
        parts.append(f"{count}x{profile}" if count > 1 else profile)
    return "+".join(parts)


def _size(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def parse_layout(text: str, model: GpuModel) -> tuple[Optional[Layout], str]:
    """``7x1g.10gb``, ``3g.40gb+2g.20gb+1g.10gb``, ``whole`` or ``mps:100`` → (Layout, "")
    or (None, why not)."""
    text = text.strip()
    if text == "whole":
        return Layout("whole"), ""
    if text.startswith("mps:"):
        units = text[4:]
        if not units.isdigit() or not 1 <= int(units) <= 100000:
            return None, f"mps:N needs a whole number of units from 1 to 100000, not {units!r}"
        return Layout(f"mps:{int(units)}", (), int(units)), ""
    if not model.mig_capable:
        return None, f"{model.a_name} has no MIG; its menu holds whole and mps:N only"
    slices: list[str] = []
    for part in text.split("+"):
        part = part.strip()
        count_text, sep, profile = part.partition("x")
        if not sep or not count_text.isdigit():
            count_text, profile = "1", part
        if model.profile(profile) is None:
            return None, (f"{model.a_name} has no MIG profile {profile!r}; it has "
                          + ", ".join(p.name for p in model.profiles))
        count = int(count_text)
        if not 1 <= count <= model.compute_slices:
            return None, f"{count} × {profile} cannot fit on one GPU"
        slices.extend([profile] * count)
    if place_slices(model, slices, [None] * len(slices)) is None:
        return None, (f"{model.a_name} cannot hold {' + '.join(slices)} under NVIDIA's "
                      "placement rules")
    ordered = tuple(sorted(slices, key=lambda p: (-_size(p), p)))
    return Layout(layout_name(ordered), ordered), ""


def parse_menu(c: Checker, raw: Any, line: int, where: str, model: GpuModel,
               changeable: int) -> Optional[Menu]:
    """The ``relayout:`` section of a node group; ``changeable`` is how many of the group's
    GPUs (over all its nodes) are Slurm's alone, the ones a menu may change."""
    section = c.mapping(raw, line, f"{where}: relayout", _MENU_KEYS, ("menu",))
    if section is None or "menu" not in section:
        return None
    interval = DEFAULT_MIN_INTERVAL_S
    if "min_interval_s" in section:
        given = c.integer(section["min_interval_s"], line_of(section, "min_interval_s"),
                          f"{where}: relayout.min_interval_s", 0, MAX_INTERVAL_S)
        interval = interval if given is None else given
    raw_items = section["menu"]
    menu_line = line_of(section, "menu")
    if not isinstance(raw_items, YamlSeq) or not raw_items:
        c.error(menu_line, f"{where}: relayout.menu must be a non-empty list of layouts like "
                "{layout: 7x1g.10gb}")
        return None
    if changeable == 0:
        c.error(menu_line, f"{where}: relayout.menu: no GPU of this group is Slurm's alone; "
                "Kubernetes' and mixed GPUs never change layout, so the menu has nothing to "
                "change")
    items: list[MenuItem] = []
    seen: dict[str, int] = {}
    for pos, entry in enumerate(raw_items):
        item_line = line_of(raw_items, pos)
        what = f"{where}: relayout.menu[{pos}]"
        if isinstance(entry, str):
            mapping: Any = YamlMap({"layout": entry})
            mapping.line, mapping.lines = item_line, {"layout": item_line}
            entry = mapping
        item = c.mapping(entry, item_line, what, _ITEM_KEYS, ("layout",))
        if item is None or "layout" not in item:
            continue
        text = c.string(item["layout"], line_of(item, "layout"), f"{what}: layout")
        if text is None:
            continue
        layout, why = parse_layout(text, model)
        if layout is None:
            c.error(line_of(item, "layout"), f"{what}: layout {text!r}: {why}")
            continue
        if layout.name in seen:
            c.error(line_of(item, "layout"), f"{what}: layout {layout.name} is on the menu "
                    f"twice (line {seen[layout.name]} and line {line_of(item, 'layout')})")
            continue
        seen[layout.name] = line_of(item, "layout")
        low = high = None
        if "min" in item:
            low = c.integer(item["min"], line_of(item, "min"), f"{what}: min", 0,
                            max(changeable, 0))
        if "max" in item:
            high = c.integer(item["max"], line_of(item, "max"), f"{what}: max", 0,
                             max(changeable, 0))
        low = 0 if low is None else low
        high = changeable if high is None else high
        if low > high:
            c.error(item.line, f"{what}: min ({low}) is more than max ({high})")
            continue
        items.append(MenuItem(layout, low, high, item.line))
    floor = sum(item.low for item in items)
    if floor > changeable:
        c.error(menu_line, f"{where}: relayout.menu: the minimums add up to {floor} GPUs but "
                f"the group has {changeable} that may change")
    ceiling = sum(item.high for item in items)
    if items and ceiling < changeable:
        c.error(menu_line, f"{where}: relayout.menu: the maximums add up to {ceiling} GPUs but "
                f"the group has {changeable} that may change; raise a max")
    return Menu(tuple(items), interval, section.line)


def one_profile_per_node(version: str) -> bool:
    """Slurm before 23.11 with AutoDetect=off indexes one MIG profile per node only (the
    rule ``gpushare render`` enforces for the plan's own layout)."""
    return version.startswith(("21.", "22."))


def check_release(c: Checker, version: str, where: str, menu: Menu) -> None:
    """On such a release a menu layout mixing profiles could never be rendered."""
    if not one_profile_per_node(version):
        return
    for item in menu.items:
        if len(set(item.layout.slices)) > 1:
            c.error(item.line, f"{where}: relayout.menu: {item.layout.name} mixes MIG "
                    f"profiles; Slurm {version} with AutoDetect=off indexes only one MIG "
                    "profile per node: keep one profile per layout, or upgrade Slurm")


def check_mig_mode(c: Checker, where: str, model: GpuModel, menu: Menu,
                   modes: dict[int, tuple[bool, int]]) -> None:
    """On an A100 or A30 every menu layout must keep the MIG mode of the group's Slurm-only
    GPUs (``modes``: index -> (MIG on in the plan, line)): a layout needing the other mode
    could only be laid out after a GPU reset, so relayout could never apply it."""
    if not model.mode_change_needs_reset or not menu.items:
        return
    mig = [item.layout.name for item in menu.items if item.layout.mig]
    off = [item.layout.name for item in menu.items if not item.layout.mig]
    why = (f"{model.a_name} switches MIG mode only after a GPU reset, which gpushare does not "
           "do")
    if mig and off:
        c.error(menu.line, f"{where}: relayout.menu mixes MIG layouts ({', '.join(mig)}) with "
                f"MIG-off ones ({', '.join(off)}); {why}: keep the MIG layouts only, or "
                "whole and mps:N only")
        return
    wrong = sorted(index for index, (on, _line) in modes.items() if on != bool(mig))
    if wrong:
        gpus = ", ".join(str(index) for index in wrong)
        plural = "s" if len(wrong) > 1 else ""
        c.error(menu.line, f"{where}: relayout.menu holds {'MIG' if mig else 'MIG-off'} "
                f"layouts only, but the plan gives Slurm's GPU{plural} {gpus} (line "
                f"{modes[wrong[0]][1]}) MIG {'off' if mig else 'on'}; {why}: lay "
                f"{'them' if plural else 'it'} out {'with MIG' if mig else 'whole'} in the "
                f"plan, or keep {'whole and mps:N' if mig else 'MIG'} layouts on the menu")
