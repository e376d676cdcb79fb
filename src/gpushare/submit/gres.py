# SPDX-License-Identifier: GPL-2.0-or-later
"""GRES request strings as slurmctld hands them to job_submit, parsed and written back.

A ``tres_per_*`` field is a comma list. Slurm before 23.11 writes each GRES item as
``gres:gpu:a100:2``; 23.11 and later write ``gres/gpu:a100:2`` and, in ``tres_per_task``,
``gres/gpu:a100=2``. A rewrite must keep the syntax it read (slurmctld rejects ``gpu:1``
without the prefix), so every item remembers its prefix and count separator. Items that are
not GRES (``cpu=4`` in a 23.11 ``tres_per_task``) pass through untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gpushare.common import units

__all__ = [
    "GRES_FIELDS",
    "GresError",
    "GresItem",
    "ascii_lower",
    "format_field",
    "format_item",
    "parse_count",
    "parse_field",
    "user_form",
    "user_item",
]

# job_desc fields that carry GRES, and the flag a user types to fill each one.
GRES_FIELDS: tuple[tuple[str, str], ...] = (
    ("tres_per_node", "--gres"),
    ("tres_per_job", "--gpus"),
    ("tres_per_task", "--gpus-per-task"),
    ("tres_per_socket", "--gpus-per-socket"),
)

FLAG_OF = dict(GRES_FIELDS)

# TRES names that are not GRES; they may share tres_per_task with GRES in 23.11.
_PLAIN_TRES = frozenset({"cpu", "mem", "node", "billing", "energy", "vmem", "pages"})

_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
MAX_COUNT = 0xFFFFFFFF - 2  # below Slurm's NO_VAL

_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
_TYPE_RE = re.compile(r"[A-Za-z0-9_.+\-]+")


class GresError(ValueError):
    """A GRES item is not something Slurm would parse; ``item`` is the item as given.

    ``count_missing`` marks ``gpu:1g.10gb``: a type starting with a digit and no count.
    Slurm's clients pass it on and slurmctld then refuses it ("Invalid Trackable RESource
    (TRES) specification"); every other parse error is refused by sbatch/srun themselves.
    """

    def __init__(self, item: str, why: str, count_missing: bool = False) -> None:
        super().__init__(f"{item!r}: {why}")
        self.item = item
        self.count_missing = count_missing


@dataclass(frozen=True)
class GresItem:
    """One comma item of a ``tres_per_*`` field."""

    name: str
    type: str | None = None
    count: int = 1
    prefix: str = ""
    count_sep: str = ":"
    is_gres: bool = True
    raw: str = ""

    def with_type(self, type_: str | None) -> GresItem:
        return replace(self, type=type_)


def ascii_lower(text: str) -> str:
    """Lower-case ASCII letters only, exactly as Lua's string.lower does in slurmctld."""
    return text.translate(_LOWER)


def parse_count(text: str) -> int | None:
    """``2`` -> 2, ``1k`` -> 1024; None when ``text`` is not a Slurm count.

    Counts above ``MAX_COUNT`` are refused: no cluster has that many of anything, and the
    Lua rules must represent every count exactly.
    """
    count = units.parse_count(text)  # binary multiples, as in Slurm's gres.c
    return count if count is not None and count <= MAX_COUNT else None


def _parse_item(text: str) -> GresItem:
    raw = text
    prefix = ""
    if text.startswith(("gres:", "gres/")):
        prefix, text = text[:5], text[5:]
    else:
        head = re.split(r"[:=/]", text, maxsplit=1)[0]
        if "/" in text.split(":", 1)[0].split("=", 1)[0] or ascii_lower(head) in _PLAIN_TRES:
            return GresItem(name=head, is_gres=False, raw=raw)
    count_sep = ":"
    count = 1
    if "=" in text:
        text, count_text = text.split("=", 1)
        count_sep = "="
        parsed = parse_count(count_text)
        if parsed is None:
            raise GresError(raw, "the count after '=' must be a number")
        count = parsed
    parts = text.split(":")
    name = parts[0]
    if not _NAME_RE.fullmatch(name):
        raise GresError(raw, "a GRES name such as gpu, mps or shard must come first")
    type_: str | None = None
    if count_sep == "=":
        if len(parts) > 2:
            raise GresError(raw, "too many ':' parts (name[:type]=count)")
        type_ = parts[1] if len(parts) == 2 else None
    elif len(parts) == 2:
        if units.parse_count(parts[1]) is not None:
            parsed = parse_count(parts[1])
            if parsed is None:
                raise GresError(raw, "the count is too large")
            count = parsed
        elif "0" <= parts[1][:1] <= "9":
            raise GresError(raw, "a type that starts with a digit needs a count after it",
                            count_missing=True)
        else:
            type_ = parts[1]
    elif len(parts) == 3:
        type_ = parts[1]
        parsed = parse_count(parts[2])
        if parsed is None:
            raise GresError(raw, "the last part must be a count such as 2")
        count = parsed
    elif len(parts) > 3:
        raise GresError(raw, "too many ':' parts (name[:type][:count])")
    if type_ is not None and not _TYPE_RE.fullmatch(type_):
        raise GresError(raw, "the type part is empty or has odd characters")
    return GresItem(name=name, type=type_, count=count, prefix=prefix,
                    count_sep=count_sep, raw=raw)


def parse_field(value: str | None) -> list[GresItem]:
    """Parse one ``tres_per_*`` value; None or empty gives no items."""
    if value is None or value == "":
        return []
    return [_parse_item(part) for part in value.split(",")]


def format_item(item: GresItem) -> str:
    """Write an item back in the syntax it was read in (count always explicit)."""
    if not item.is_gres:
        return item.raw
    typed = f"{item.name}:{item.type}" if item.type else item.name
    return f"{item.prefix}{typed}{item.count_sep}{item.count}"


def format_field(items: list[GresItem]) -> str:
    return ",".join(format_item(item) for item in items)


def user_form(field: str, items: list[GresItem]) -> str:
    """The flag and value a user would have typed for ``items``, for messages.

    ``--gres`` takes ``gpu:a100:2``; the ``--gpus*`` flags take ``a100:2``.
    """
    values = [_user_value(field, item) for item in items if item.is_gres]
    return f"{FLAG_OF[field]}={','.join(values)}"


def user_item(field: str, item: GresItem) -> str:
    """``--gres=gpu:1g.10gb:1`` / ``--gpus=a100:2`` for one item."""
    return f"{FLAG_OF[field]}={_user_value(field, item)}"


def _user_value(field: str, item: GresItem) -> str:
    if field == "tres_per_node" or item.name != "gpu":
        typed = item.name + (f":{item.type}" if item.type else "")
        return f"{typed}:{item.count}"
    return f"{item.type}:{item.count}" if item.type else str(item.count)
