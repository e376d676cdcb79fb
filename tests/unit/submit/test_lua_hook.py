# SPDX-License-Identifier: GPL-2.0-or-later
"""job_submit.lua in-process (lupa, Lua 5.1 where available): every vector, identical to
Python; the facts loaded once; load failures and internal errors never reach slurmctld."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings

from gpushare.submit.facts import DEFAULT_FACTS_PATH, FACTS_ENV, load_facts
from gpushare.submit.rules import apply
from luahook import HOOK, LuaHook, facts_path, load_vectors
from submit_strategies import job_desc

VECTORS = load_vectors()
_HOOKS: dict[str, LuaHook] = {}


def hook_for(name: str) -> LuaHook:
    if name not in _HOOKS:
        _HOOKS[name] = LuaHook(facts_path(name))
    return _HOOKS[name]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_vector_lua(vector):
    result = hook_for(vector["facts"]).submit(vector["job"], modify=vector["entry"] == "modify")
    rc = result.pop("rc")
    assert result == vector["expected"]
    assert rc == (2072 if vector["expected"]["reject"] else 0)


def test_facts_loaded_once_at_load():
    hook = LuaHook(facts_path("h100-2205"))
    assert hook.log("info") == [
        f"gpushare: loaded cluster facts from {facts_path('h100-2205')}"]
    hook.submit({"tres_per_node": "gres:gpu:8", "min_nodes": 3})
    assert hook.log("info") == []  # nothing read or logged per job


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read"),
    ("{not json", "not valid JSON"),
    (json.dumps({"version": 1}), '"version" must be 2'),
])
def test_bad_facts_log_at_load_and_jobs_pass(tmp_path, content, needle):
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    hook = LuaHook(str(path))
    assert any(needle in line for line in hook.log("error"))
    result = hook.submit({"tres_per_node": "gres:mps:150"})
    assert (result["rc"], result["changes"], result["messages"]) == (0, {}, [])


def test_json_decoder_reads_escapes_and_nesting(tmp_path):
    with open(facts_path("h100-2205"), encoding="utf-8") as handle:
        data = json.load(handle)
    data["gpu_types"] = ["h\u0031\u0030\u0030", "we\"ird"]
    data["types"]["we\"ird"] = {"nodes": 1, "per_node": 1, "domain_sizes": []}
    data["comment"] = {"nested": [1, 2.5, -3e2, True, False, None], "s": "a\\b\n"}
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data, indent=1, ensure_ascii=True))
    hook = LuaHook(str(path))
    assert hook.log("error") == []
    result = hook.submit({"tres_per_node": "gres:gpu:H100:1"})
    assert result["changes"] == {"tres_per_node": "gres:gpu:h100:1"}


@pytest.mark.parametrize("on_error, rc", [("accept", 0), ("reject", -1)])
def test_internal_error_is_caught_and_follows_policy(tmp_path, on_error, rc):
    with open(facts_path("h100-2205"), encoding="utf-8") as handle:
        data = json.load(handle)
    data["policy"]["on_error"] = on_error
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    hook = LuaHook(str(path))
    hook.lua.execute("string.lower = function() error('boom') end")
    result = hook.submit({"tres_per_node": "gres:gpu:H100:1"})
    assert result["rc"] == rc
    assert result["changes"] == {}
    assert any("internal error" in line and "boom" in line for line in hook.log("error"))
    modified = hook.submit({"tres_per_node": "gres:gpu:H100:1"}, modify=True)
    assert modified["rc"] == 0


def test_facts_path_constant_and_env_override():
    with open(HOOK, encoding="utf-8") as handle:
        source = handle.read()
    assert 'local FACTS_PATH = "/etc/slurm/gpushare-facts.json"' in source
    assert 'os.getenv("GPUSHARE_FACTS")' in source
    # the same path and variable as the Python hook's
    assert f'local FACTS_PATH = "{DEFAULT_FACTS_PATH}"' in source
    assert f'os.getenv("{FACTS_ENV}")' in source


@settings(max_examples=int(os.environ.get("GPUSHARE_LUA_PARITY_EXAMPLES", "300")),
          deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=job_desc())
def test_lua_and_python_agree_on_generated_jobs(job):
    for name in ("h100-2205", "a100-2311", "split-mig-2205"):
        expected = apply(job, load_facts(facts_path(name))).to_dict()
        result = hook_for(name).submit(job)
        result.pop("rc")
        assert result == expected


@pytest.mark.parametrize("version", ["lua52", "lua53", "lua54"])
def test_vectors_on_newer_lua(version):
    """The script stays valid and gives the same results through Lua 5.4."""
    runtime = pytest.importorskip(f"lupa.{version}")
    hooks: dict[str, LuaHook] = {}
    for vector in VECTORS:
        name = vector["facts"]
        hook = hooks.setdefault(name, LuaHook(facts_path(name), runtime=runtime))
        result = hook.submit(vector["job"], modify=vector["entry"] == "modify")
        result.pop("rc")
        assert result == vector["expected"], vector["id"]
