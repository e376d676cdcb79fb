# SPDX-License-Identifier: GPL-2.0-or-later
"""The submit rules: a job_desc in, the fields to rewrite or a rejection out.

Pure functions over the job's fields and the cluster facts, so that the Python hook, the
``gpushare explain`` command and the conformance vectors all run the very rules that
``submit_hooks/job_submit.lua`` implements line for line. No I/O, no clock, nothing that
depends on the array index: slurmctld calls job_submit once per array.

Order of checks (the first problem wins, so a user fixes one thing at a time):
GRES syntax, the gpushare options, GPU/MIG types (an untyped GPU gets the type the plan's
``untyped_gpu`` policy gives), GPUs per node asked twice (from Slurm 26.05), shares,
private MPS, then ``--switches`` or ``--segment`` (``gpushare.submit.placement``, from the
NVLink domains of the GPU type asked for). root shares as any user does: its jobs get a
daemon of root's own on the node. The few rules that differ by Slurm release are given the
running one by the hook.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpushare.submit.base import (
    ESLURM_INVALID_GRES,
    NO_VAL,
    NO_VAL16,
    Rejected,
    Rejection,
    Release,
    at_least,
    reject,
)
from gpushare.submit.facts import Facts
from gpushare.submit.gres import (
    GRES_FIELDS,
    GresError,
    GresItem,
    ascii_lower,
    format_field,
    format_item,
    parse_field,
    user_form,
    user_item,
)
from gpushare.submit.placement import format_wait, place

__all__ = [
    "ESLURM_INVALID_GRES",
    "NO_VAL",
    "NO_VAL16",
    "Decision",
    "Rejection",
    "apply",
    "apply_modify",
    "format_wait",
    "mig_profile",
    "spank_options",
    "with_feature",
]

SPANK_OPTION_PREFIX = "_SLURM_SPANK_OPTION_gpushare_"
SHARING_NAMES = ("gpu", "mps", "shard")


@dataclass
class Decision:
    """Fields to set on the job_desc, the user's messages, or a rejection."""

    changes: dict[str, Any] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    reject: Rejection | None = None

    def to_dict(self) -> dict[str, Any]:
        reject = None
        if self.reject:
            reject = {"code": self.reject.code, "text": self.reject.text}
        return {"changes": dict(self.changes), "messages": list(self.messages), "reject": reject}


def spank_options(env: Any) -> dict[str, str]:
    """gpushare's own SPANK options from ``spank_job_env`` (a list of NAME=value, or a dict)."""
    entries: list[tuple[str, str]] = []
    if isinstance(env, dict):
        for key, value in env.items():
            if isinstance(key, str):
                entries.append((key, "" if value is None else str(value)))
            elif isinstance(value, str) and "=" in value:
                name, val = value.split("=", 1)
                entries.append((name, val))
    elif isinstance(env, (list, tuple)):
        for entry in env:
            if isinstance(entry, str) and "=" in entry:
                name, val = entry.split("=", 1)
                entries.append((name, val))
    options: dict[str, str] = {}
    for name, value in entries:
        if name.startswith(SPANK_OPTION_PREFIX):
            options[name[len(SPANK_OPTION_PREFIX):]] = value
    return options


def _is_profile_core(text: str) -> bool:
    """``1g.10gb``, ``1c.3g.40gb``, ``1g.10gb+me``: a MIG profile as NVIDIA names it."""
    core = text[:-3] if text.endswith("+me") else text
    parts = core.split(".")
    if len(parts) not in (2, 3) or not parts[-1].endswith("gb"):
        return False
    if not parts[-1][:-2].isdigit() or not parts[-1][:-2].isascii():
        return False
    if not parts[-2].endswith("g") or not parts[-2][:-1].isdigit() or not parts[-2].isascii():
        return False
    if len(parts) == 3:
        return parts[0].endswith("c") and parts[0][:-1].isdigit() and parts[0].isascii()
    return True


def mig_profile(type_name: str) -> str | None:
    """The MIG profile a type names: ``nvidia_a100_1g.10gb`` -> ``1g.10gb``; else None.

    Slurm's AutoDetect=nvml names MIG slices ``<gpu name>_<profile>``; gres.conf may spell
    them either way, so both sides are reduced to the profile before comparing.
    """
    lowered = ascii_lower(type_name)
    core = lowered.rsplit("_", 1)[-1]
    return core if _is_profile_core(core) else None


def _listing(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


def _normalise_type(field_name: str, item: GresItem, facts: Facts) -> str:
    """The facts' spelling of ``item.type``, or a rejection listing what is valid."""
    assert item.type is not None
    wanted = ascii_lower(item.type)
    mig_allowed = item.name == "gpu"
    valid = facts.gpu_types + (facts.mig_types if mig_allowed else ())
    for name in valid:
        if ascii_lower(name) == wanted:
            return name
    flag = user_item(field_name, item)
    profile = mig_profile(item.type)
    if mig_allowed and profile is not None:
        owners = tuple(m for m in facts.mig_types if mig_profile(m) == profile)
        if len(owners) == 1:
            return owners[0]
        if owners:
            raise reject(flag, f"names MIG profile {profile}, which Slurm has here as "
                          f"several types ({_listing(owners)})",
                          f"name one of them, e.g. --gres=gpu:{owners[0]}:1")
        if not facts.mig_types:
            raise reject(flag, f"asks for MIG profile {profile}, but Slurm has no MIG slices "
                          "here", "ask for whole GPUs instead, e.g. "
                          + _example(field_name, "gpu", None, item.count))
        example = _example(field_name, "gpu", _nearest(profile, facts.mig_types), item.count)
        raise reject(flag, f"asks for MIG profile {profile}, which Slurm does not own here "
                      f"(Slurm owns: {_listing(facts.mig_types)})",
                      f"ask for one of those, e.g. {example}")
    tokens = wanted.split("_")
    matches = tuple(g for g in facts.gpu_types if ascii_lower(g) in tokens)
    if len(matches) == 1:
        return matches[0]
    kind = "" if item.name == "gpu" else f" for {item.name}"
    if valid:
        nearest = _nearest(wanted, valid)
        fix = f"ask for one of those, e.g. {_example(field_name, item.name, nearest, item.count)}"
    else:
        fix = f"ask without a type, e.g. {_example(field_name, item.name, None, item.count)}"
    raise reject(flag, f"asks for GPU type {item.type}, which this cluster does not have "
                  f"(valid types{kind}: {_listing(valid)})", fix)


def _example(field_name: str, name: str, type_: str | None, count: int) -> str:
    return user_item(field_name, GresItem(name=name, type=type_, count=max(count, 1)))


def _distance(a: str, b: str) -> int:
    """Levenshtein distance: how many one-character edits turn ``a`` into ``b``."""
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def _nearest(wanted: str, names: tuple[str, ...]) -> str:
    """The name closest to a (mistyped) type, so a typo is answered with what was meant;
    ties go to the first in the facts' order."""
    lowered = ascii_lower(wanted)
    best = names[0]
    best_distance = _distance(lowered, ascii_lower(best))
    for name in names[1:]:
        distance = _distance(lowered, ascii_lower(name))
        if distance < best_distance:
            best, best_distance = name, distance
    return best


# _untyped_type's answer for a request kept whole by the node feature, not by a type.
BY_FEATURE = "\0feature"


def _untyped_type(field_name: str, item: GresItem, facts: Facts,
                  constrain: bool) -> str | None:
    """The type an untyped GPU request gets (policy ``untyped_gpu``), None to leave it,
    BY_FEATURE to keep it on the nodes of the facts' ``whole_gpu_feature``.

    ``whole`` (the default) keeps such a request off MIG slices: where Slurm owns slices, it
    writes in the one whole-GPU type; with several, it constrains the job to the nodes whose
    Slurm GPUs are all whole (the plan renders that feature where no node has both), and
    refuses where that cannot be done (a node has both, or a job_modify, which does not
    carry the job's constraint): gpushare cannot know which type the user meant. ``any``
    leaves it to Slurm.
    """
    policy = facts.policy.untyped_gpu
    if policy == "any":
        return None
    if policy != "whole":
        return policy
    if not facts.mig_types:
        return None  # nothing but whole GPUs to land on
    if len(facts.gpu_types) == 1:
        return facts.gpu_types[0]
    flag = user_item(field_name, item)
    if not facts.gpu_types:
        raise reject(flag, "asks for a whole GPU, and Slurm has only MIG slices here "
                      f"({_listing(facts.mig_types)})", "ask for a slice by its profile, e.g. "
                      + _example(field_name, "gpu", facts.mig_types[0], item.count))
    if facts.whole_gpu_feature and constrain:
        return BY_FEATURE
    where = ("" if facts.whole_gpu_feature else
             ", and a node has both whole GPUs and MIG slices for Slurm")
    raise reject(flag, "does not say which GPU, and here it could get a MIG slice (whole "
                  f"GPUs: {_listing(facts.gpu_types)}; MIG: {_listing(facts.mig_types)}"
                  f"{where})", "name the type, e.g. "
                  + _example(field_name, "gpu", facts.gpu_types[0], item.count))


def with_feature(constraint: str | None, feature: str) -> str:
    """``constraint`` and ``feature`` both required: ``a|b`` -> ``(a|b)&feature``."""
    old = (constraint or "").strip()
    if not old or old == "(null)":
        return feature
    if feature in old.replace("(", "&").replace(")", "&").replace("[", "&").replace(
            "]", "&").replace("|", "&").split("&"):
        return old  # already asked for
    if "|" in old:
        old = f"({old})"
    return f"{old}&{feature}"


def _share_flag(items: list[tuple[str, GresItem]], share_text: str | None) -> str:
    if items:
        return user_item(items[0][0], items[0][1])
    return f"--gpu-share={share_text}"


def _gpus_twice(items: list[GresItem]) -> bool:
    """Whether two gpu items of ``tres_per_node`` ask for the same GPUs: one without a type
    (any GPU), or both of one type. That is what ``--gpus-per-node`` beside ``--gres=gpu``
    gives slurmctld (both fill ``tres_per_node``); distinct types (``gpu:a100:1,gpu:h100:1``)
    are one request, which Slurm takes."""
    gpus = [it for it in items if it.is_gres and it.name == "gpu"]
    for index, first in enumerate(gpus):
        for second in gpus[index + 1:]:
            if (first.type is None or second.type is None
                    or ascii_lower(first.type) == ascii_lower(second.type)):
                return True
    return False


def _refuse_gpus_twice(asked: list[GresItem], items: list[GresItem]) -> None:
    """Slurm 26.05 refuses ``--gres=gpu:N`` with ``--gpus-per-node``: say what to type.
    ``items`` are the request in the facts' spelling, ``asked`` as the user wrote it."""
    if not _gpus_twice(items):
        return
    shown = [it for it in asked if it.is_gres and it.name == "gpu"]
    last = [it for it in items if it.is_gres and it.name == "gpu"][-1]
    per_node = f"{last.type}:{last.count}" if last.type else str(last.count)
    raise reject(user_form("tres_per_node", shown), "asks for the GPUs of each node twice (as "
                 "--gpus-per-node with --gres=gpu does), and Slurm 26.05 no longer takes both",
                 f"ask once, e.g. {user_item('tres_per_node', last)} or "
                 f"--gpus-per-node={per_node}")


def _check(job: dict[str, Any], facts: Facts, constrain: bool = True,
           release: Release = None) -> tuple[dict[str, Any], list[str]]:
    changes: dict[str, Any] = {}
    notes: list[str] = []
    units = facts.mps_units_per_gpu

    # 1. Every GRES field parses.
    fields: dict[str, list[GresItem]] = {}
    for field_name, flag in GRES_FIELDS:
        value = job.get(field_name)
        if value is None or value == "":
            continue
        try:
            fields[field_name] = parse_field(str(value))
        except GresError as err:
            shown = err.item[5:] if err.item.startswith(("gres:", "gres/")) else err.item
            if err.count_missing:
                name, _, type_ = shown.partition(":")
                if name == "mps":
                    # mps has no types: "mps:25x" is a mistyped count, never a type.
                    raise reject(f'{flag} item "{shown}"',
                                  "is not a whole number of mps units",
                                  "write the share's units alone, e.g. "
                                  + _example(field_name, "mps", None, 25)) from None
                raise reject(f'{flag} item "{shown}"', "has no count, and Slurm reads a type "
                              "that starts with a digit as a count",
                              "write the count after it, e.g. "
                              + _example(field_name, name, type_, 1)) from None
            example = _example("tres_per_node", "gpu",
                               facts.gpu_types[0] if facts.gpu_types else None, 2)
            raise reject(f'{flag} item "{shown}"', "is not a GRES request Slurm understands",
                          f"write name[:type][:count], e.g. {example}") from None

    asked_per_node = fields.get("tres_per_node", [])

    # 2. gpushare's own options.
    options = spank_options(job.get("spank_job_env"))
    share_text = options.get("gpu_share")
    share_pct: int | None = None
    if share_text is not None:
        if (not (share_text.isdigit() and share_text.isascii()) or len(share_text) > 6
                or int(share_text) == 0):
            raise reject(f"--gpu-share={share_text}", "is not a share of one GPU",
                          "give a whole percent of one GPU from 1 to 100, e.g. "
                          "--gpu-share=25")
        share_pct = int(share_text)
        if share_pct > 100:
            raise reject(f"--gpu-share={share_text}",
                          f"asks for {share_pct / 100:g} GPUs; a share must fit on one GPU "
                          "(at most --gpu-share=100)",
                          f"for more, ask for whole GPUs: --gres=gpu:{-(-share_pct // 100)}")
    mps_text = options.get("gpu_mps")
    private_mps = False
    if mps_text is not None:
        # A flag without a value reaches slurmctld 22.05 as "(null)".
        if mps_text not in ("", "(null)", "yes", "no"):
            raise reject(f"--gpu-mps={mps_text}", "is neither yes nor no",
                          "write --gpu-mps to run a private MPS on your whole GPUs")
        private_mps = mps_text != "no"

    # 3. GPU and MIG types, in the facts' spelling.
    for field_name, _flag in GRES_FIELDS:
        items = fields.get(field_name)
        if not items:
            continue
        new_items = list(items)
        written_in = None
        for index, item in enumerate(items):
            if item.is_gres and item.name in SHARING_NAMES and item.type is not None:
                spelled = _normalise_type(field_name, item, facts)
                if spelled != item.type:
                    new_items[index] = item.with_type(spelled)
            elif item.is_gres and item.name == "gpu" and item.count > 0:
                target = _untyped_type(field_name, item, facts, constrain)
                if target == BY_FEATURE:
                    if "features" not in changes:
                        old = job.get("features")
                        if not isinstance(old, str):
                            old = None
                        changes["features"] = with_feature(old, facts.whole_gpu_feature)
                        if changes["features"] == old:
                            del changes["features"]
                        else:
                            shown = f"--constraint={old} -> " if old else ""
                            notes.append(
                                f"{user_item(field_name, item)}: {shown}--constraint="
                                f"{changes['features']} (a GPU without a type is a whole GPU "
                                f"here: nodes with {facts.whole_gpu_feature} have no MIG "
                                "slice)")
                elif target is not None:
                    new_items[index] = item.with_type(target)
                    written_in = target
        if new_items != items:
            new_items = [_prefixed(it, items, facts) for it in new_items]
            changes[field_name] = format_field(new_items)
            note = f"{user_form(field_name, items)} -> {changes[field_name]}"
            if written_in is not None:
                note += f" (a GPU without a type is a whole {written_in} here)"
            notes.append(note)
            fields[field_name] = new_items

    # 3b. GPUs per node asked once: the rules never write a second gpu item into
    # tres_per_node, and from 26.05 refuse a request that has two (before, Slurm took it).
    if at_least(release, (26, 5)):
        _refuse_gpus_twice(asked_per_node, fields.get("tres_per_node", []))

    # 4. Shares: one GPU at most, never mixed with whole GPUs or shards.
    for field_name, _flag in GRES_FIELDS:
        for item in fields.get(field_name, ()):
            if item.is_gres and item.name == "mps" and item.count == 0:
                raise reject(user_item(field_name, item), "is not a share of one GPU",
                              f"give a share from 1 to {units}, e.g. "
                              + _example(field_name, "mps", item.type, max(1, units // 4)))
    asked = [(f, it) for f, _ in GRES_FIELDS for it in fields.get(f, ())
             if it.is_gres and it.name in SHARING_NAMES and it.count > 0]
    mps_items = [(f, it) for f, it in asked if it.name == "mps"]
    gpu_items = [(f, it) for f, it in asked if it.name == "gpu"]
    shard_items = [(f, it) for f, it in asked if it.name == "shard"]
    mps_total = sum(it.count for _, it in mps_items)
    share_units = None if share_pct is None else max(1, share_pct * units // 100)
    is_share = bool(mps_items) or share_pct is not None

    if private_mps and is_share:
        raise reject("--gpu-mps", "runs a private MPS on whole GPUs and cannot be combined "
                      f"with a share ({_share_flag(mps_items, share_text)})",
                      "ask for whole GPUs with it (e.g. --gres=gpu:1 --gpu-mps), "
                      "or for the share alone")
    if private_mps and not gpu_items:
        raise reject("--gpu-mps", "needs whole GPUs and this job asks for none",
                      "add them, e.g. --gres=gpu:1 --gpu-mps")
    if mps_items and share_pct is not None and mps_total != share_units:
        raise reject(f"--gpu-share={share_text}",
                      f"and {_share_flag(mps_items, None)} ask for different shares "
                      f"({share_pct}% of a GPU is mps:{share_units} here)",
                      f"give only one of them, e.g. --gpu-share={share_text}")
    if is_share and (gpu_items or shard_items):
        other_field, other = (gpu_items or shard_items)[0]
        what = "whole GPUs" if other.name == "gpu" else "shards"
        # The user's own whole-GPU request is the example: it keeps the type they chose.
        whole = user_item(other_field, other) if other.name == "gpu" else "--gres=gpu:1"
        raise reject(_share_flag(mps_items, share_text),
                      f"is a share of one GPU and cannot be combined with {what} "
                      f"({user_item(other_field, other)})",
                      f"ask for the share alone, or for whole GPUs alone, e.g. {whole}")
    if mps_total > units:
        flag = (user_item(*mps_items[0]) if len(mps_items) == 1
                else user_form(mps_items[0][0], [it for _, it in mps_items]))
        raise reject(flag, f"asks for {mps_total / units:g} GPUs of MPS; a share must fit on "
                      f"one GPU (at most mps:{units})",
                      f"for more, ask for whole GPUs: --gres=gpu:{-(-mps_total // units)}")
    if share_units is not None and not mps_items:
        items = fields.get("tres_per_node", [])
        prefix = next((it.prefix for it in items if it.is_gres and it.prefix),
                      facts.gres_prefix)
        added = GresItem(name="mps", count=share_units, prefix=prefix)
        old = changes.get("tres_per_node", job.get("tres_per_node"))
        value = format_item(added) if not items else f"{old},{format_item(added)}"
        changes["tres_per_node"] = value
        notes.append(f"--gpu-share={share_text} -> {value}")

    # 5. Multi-node GPU jobs stay in the fewest NVLink domains of their GPU type.
    if asked or share_pct is not None:
        place(job, facts, fields, asked, changes, notes, release)
    return changes, notes


def _prefixed(item: GresItem, items: list[GresItem], facts: Facts) -> GresItem:
    """Give an unprefixed item the field's (or the cluster's) prefix: slurmctld needs it."""
    if not item.is_gres or item.prefix:
        return item
    prefix = next((it.prefix for it in items if it.is_gres and it.prefix), facts.gres_prefix)
    return GresItem(name=item.name, type=item.type, count=item.count, prefix=prefix,
                    count_sep=item.count_sep, raw=item.raw)


def apply(job: dict[str, Any], facts: Facts, constrain: bool = True,
          release: Release = None) -> Decision:
    """Run every rule on one job_desc (field names as slurmctld gives them to Lua).

    ``constrain``: the job's whole ``features`` (--constraint) is in ``job``, so a node
    feature may be added to it (not so in a job_modify). ``release``: the running
    slurmctld's (major, minor), for the rules that differ by release; None: unknown, and
    they behave as before 25.11.
    """
    try:
        changes, notes = _check(job, facts, constrain, release)
    except Rejected as rejected:
        return Decision(messages=[rejected.rejection.text], reject=rejected.rejection)
    messages = ["gpushare: " + "; ".join(notes)] if notes else []
    return Decision(changes=changes, messages=messages)


def apply_modify(job: dict[str, Any], facts: Facts, release: Release = None) -> Decision:
    """Rules for ``scontrol update``/job_modify: the GRES rules on the tres fields it carries.

    A modification carries only the fields being changed, so it alone cannot say whether the
    job is a multi-node GPU job: ``--switches`` is left to the user there.
    """
    view = {name: job[name] for name, _ in GRES_FIELDS if job.get(name) is not None}
    if not view:
        return Decision()
    return apply(view, facts, constrain=False, release=release)
