# SPDX-License-Identifier: GPL-2.0-or-later
"""The rules that differ by the running Slurm release, through both hooks.

``tests/vectors/releases/`` holds them: Slurm 26.05's ban on ``--gres=gpu`` beside
``--gpus-per-node`` (both fill ``tres_per_node``), and topology/block with what 25.11 added
(``segment_size`` seen by job_submit.lua, ``--spread-segments``/``--consolidate-segments``
in ``bitflags``, ``--segment`` beyond a base block, ``--segment`` with ``-w``). Each vector
runs through the Python rules given the release and through job_submit.lua whose
``slurmctld -V`` answers it, and both must give exactly the vector's result.
"""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import luahook
from gpushare.submit.facts import load_facts
from gpushare.submit.gres import parse_field
from gpushare.submit.placement import CONSOLIDATE_SEGMENTS, SPREAD_SEGMENTS
from gpushare.submit.rules import NO_VAL16, apply, apply_modify
from luahook import LuaHook, facts_path
from submit_strategies import job_desc

RELEASES = os.path.join(luahook.VECTORS_DIR, "releases")
# job_submit.lua also writes segment_size (25.11+); bitflags and req_nodes must stay as given.
LUA_FIELDS = (*luahook.JOB_FIELDS, "segment_size", "bitflags", "req_nodes")


def release_tuple(text: str | None) -> tuple[int, int] | None:
    """"26.05" -> (26, 5), as the Python hook derives it from SLURM_VERSION_NUMBER."""
    if text is None:
        return None
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


# Each with the release its slurmctld runs (null: unknown).
VECTORS = luahook.load_vectors(RELEASES)


class _Answering:
    """lupa's Lua runtime whose io.popen answers ``slurmctld -V`` with one release: the
    hook asks it once at load (lupa's own popen cannot run a program)."""

    def __init__(self, release: str | None, runtime: Any = None) -> None:
        self.release = release
        self.runtime = runtime or luahook.lupa_runtime

    def LuaRuntime(self, **kwargs: Any) -> Any:  # lupa's name for it
        lua = self.runtime.LuaRuntime(**kwargs)
        answer = "" if self.release is None else f"slurm {self.release}.5\\n"
        lua.execute("io.popen = function() return {read = function() return "
                    f'"{answer}" end, close = function() end}} end')
        return lua


_HOOKS: dict[tuple[str, str | None], LuaHook] = {}


def hook_for(facts: str, release: str | None) -> LuaHook:
    key = (facts, release)
    if key not in _HOOKS:
        _HOOKS[key] = LuaHook(facts_path(facts), runtime=_Answering(release))
    return _HOOKS[key]


def lua_submit(hook: LuaHook, job: dict[str, Any], modify: bool = False) -> dict[str, Any]:
    with mock.patch.object(luahook, "JOB_FIELDS", LUA_FIELDS):
        return hook.submit(job, modify=modify)


def test_vectors_cover_every_release_rule():
    ids = " ".join(v["id"] for v in VECTORS)
    for words in ("twice", "spread", "consolidate", "-w", "larger than a base block",
                  "before 25.11 has no segment_size"):
        assert words in ids or any(words in v["expected"]["messages"][0] for v in VECTORS
                                   if v["expected"]["messages"]), words
    assert {v["release"] for v in VECTORS} >= {None, "22.05", "24.11", "25.11", "26.05"}


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_release_vector_python(vector):
    facts = load_facts(facts_path(vector["facts"]))
    rules = apply_modify if vector["entry"] == "modify" else apply
    decision = rules(vector["job"], facts, release=release_tuple(vector["release"]))
    assert decision.to_dict() == vector["expected"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_release_vector_lua(vector):
    hook = hook_for(vector["facts"], vector["release"])
    assert hook.log("error") == []  # the facts are the running release's
    result = lua_submit(hook, vector["job"], modify=vector["entry"] == "modify")
    rc = result.pop("rc")
    assert result == vector["expected"]
    assert rc == (2072 if vector["expected"]["reject"] else 0)


@pytest.mark.parametrize("version", ["lua52", "lua53", "lua54"])
def test_release_vectors_on_newer_lua(version):
    """2^43 is a float from Lua 5.3 on, and so is nodes / size: the same results."""
    runtime = pytest.importorskip(f"lupa.{version}")
    for vector in VECTORS:
        hook = LuaHook(facts_path(vector["facts"]), runtime=_Answering(vector["release"],
                                                                       runtime))
        result = lua_submit(hook, vector["job"], modify=vector["entry"] == "modify")
        result.pop("rc")
        assert result == vector["expected"], vector["id"]


def test_lua_reads_the_release_once_at_load():
    """The fake -V answers at load: a 26.05 hook refuses, the same script on 25.11 does not."""
    job = {"tres_per_node": "gres/gpu:2,gres/gpu:1"}
    assert lua_submit(hook_for("a100-2311", "26.05"), job)["rc"] == 2072
    assert lua_submit(hook_for("a100-2311", "25.11"), job)["rc"] == 0


# ---- generated jobs ------------------------------------------------------------------------

BITFLAGS = st.sampled_from([0, SPREAD_SEGMENTS, CONSOLIDATE_SEGMENTS,
                            SPREAD_SEGMENTS | CONSOLIDATE_SEGMENTS, 1, 2**53 - 1]) \
    | st.integers(0, 2**53 - 1)
SEGMENTS = st.sampled_from([NO_VAL16, 0, 1, 2, 3, 4, 8, 40]) | st.integers(0, 12)
NODE_LISTS = st.sampled_from(["g[01-04]", "g01", "", " ", "(null)", "blockwith{g01}"])
PER_NODE = st.sampled_from(["2", "1", "0", "a100:4", "A100:1", "l40s:2", "1g.10gb:1",
                            "nvidia_a100_1g.10gb:2", "h100:1"])
RELEASE_TEXTS = [None, "24.11", "25.11", "26.05"]


@st.composite
def release_job(draw) -> dict:
    """A job_desc as 24.11-26.05 give it: maybe --gpus-per-node before the --gres items in
    tres_per_node (as sbatch joins them), segment_size, -w, the segment flags."""
    job = draw(job_desc())
    if draw(st.booleans()):
        first = f"gres/gpu:{draw(PER_NODE)}"
        rest = job.get("tres_per_node")
        job["tres_per_node"] = f"{first},{rest}" if rest else first
    for name, strategy in (("segment_size", SEGMENTS), ("req_nodes", NODE_LISTS),
                           ("bitflags", BITFLAGS)):
        if draw(st.booleans()):
            job[name] = draw(strategy)
    return job


def _gpu_items(value: Any) -> list:
    try:
        return [it for it in parse_field(value) if it.is_gres and it.name == "gpu"] \
            if isinstance(value, str) else []
    except ValueError:
        return []


@settings(max_examples=int(os.environ.get("GPUSHARE_LUA_PARITY_EXAMPLES", "300")),
          deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=release_job())
def test_lua_and_python_agree_on_every_release(job):
    for name in ("block-2311", "a100-2311"):
        facts = load_facts(facts_path(name))
        for release in RELEASE_TEXTS:
            expected = apply(job, facts, release=release_tuple(release)).to_dict()
            result = lua_submit(hook_for(name, release), job)
            result.pop("rc")
            assert result == expected, release


@settings(max_examples=int(os.environ.get("GPUSHARE_FUZZ_EXAMPLES", "2000")) // 2,
          deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=release_job(), release=st.sampled_from(RELEASE_TEXTS))
def test_the_rules_never_ask_for_gpus_per_node_twice(job, release):
    """No rewrite adds a gpu item to tres_per_node (--gpu-share adds mps only, and never
    beside GPUs); from 26.05 what is accepted never asks for one node's GPUs twice; bitflags
    and -w are never touched, and a segment is only ever set where none was given."""
    for name in ("block-2311", "a100-2311"):
        decision = apply(job, load_facts(facts_path(name)), release=release_tuple(release))
        if decision.reject is not None:
            continue
        assert not {"bitflags", "req_nodes"} & set(decision.changes)
        if "segment_size" in decision.changes:
            assert job.get("segment_size") in (NO_VAL16, 0)
        before = _gpu_items(job.get("tres_per_node"))
        after = _gpu_items(decision.changes.get("tres_per_node", job.get("tres_per_node")))
        assert len(after) == len(before)
        if release == "26.05":
            assert not any(first.type is None or second.type is None
                           or first.type.lower() == second.type.lower()
                           for index, first in enumerate(after)
                           for second in after[index + 1:]), (job, decision)


# ---- the user docs -------------------------------------------------------------------------

def test_users_doc_says_what_the_rules_answer():
    """docs/users.md quotes these answers; gpushare explain (which has no release and no
    segment_size) cannot replay them, so they are checked here."""
    from gpushare.admin.plan import load_plan
    from gpushare.admin.render_facts import render_facts
    from gpushare.submit.facts import facts_from_dict

    repo = os.path.join(luahook.VECTORS_DIR, "..", "..")
    with open(os.path.join(repo, "docs", "users.md"), encoding="utf-8") as handle:
        text = " ".join(handle.read().split())  # a quote may run over a line break
    example = facts_from_dict(render_facts(load_plan(os.path.join(repo, "etc",
                                                                  "plan.example.yaml"))))
    prefix = example.gres_prefix
    twice = apply({"tres_per_node": f"{prefix}gpu:h100:2,{prefix}gpu:h100:1"}, example,
                  release=(26, 5))
    assert twice.reject is not None and f"sbatch: error: {twice.reject.text}" in text
    block = load_facts(facts_path("block-2311"))
    job = {"tres_per_node": "gres/gpu:a100:1", "min_nodes": 4, "segment_size": NO_VAL16}
    for extra in ({}, {"req_nodes": "g[01-04]"}):
        (message,) = apply(dict(job, **extra), block, release=(25, 11)).messages
        assert f"`{message}`" in text, message
