# SPDX-License-Identifier: GPL-2.0-or-later
"""The facts file: the documented example loads; each bad key is named in the error."""

from __future__ import annotations

import copy
import json
import os

import pytest

from gpushare.submit.facts import FactsError, facts_from_dict, load_facts

GOOD = {
    "version": 2, "gres_syntax": "22.05", "mps_units_per_gpu": 100,
    "gpu_types": ["h100"], "mig_types": ["1g.10gb", "3g.40gb"],
    "types": {"h100": {"nodes": 5, "per_node": 8, "domain_sizes": [2, 3]},
              "1g.10gb": {"nodes": 1, "per_node": 7, "domain_sizes": []},
              "3g.40gb": {"nodes": 1, "per_node": 2, "domain_sizes": []}},
    "domains": {"nvl0": ["n1", "n2"], "nvl1": ["n3", "n4", "n5"]},
    "gpus_per_node": {"n1": 8},
    "policy": {"switch_wait_s": 300, "max_switch_wait_s": 3600, "on_error": "accept",
               "untyped_gpu": "whole"},
}


def test_good_facts():
    facts = facts_from_dict(GOOD)
    assert facts.gres_prefix == "gres:"
    assert facts.domain_sizes == (3, 2)
    assert facts.mig_types == ("1g.10gb", "3g.40gb")
    assert facts.policy.max_switch_wait_s == 3600
    assert facts.types["h100"].domain_sizes == (3, 2)  # largest first
    assert facts.untyped_gpu_type() == "h100"


def test_2311_prefix():
    data = dict(GOOD, gres_syntax="23.11")
    assert facts_from_dict(data).gres_prefix == "gres/"


def _with(path, value):
    data = copy.deepcopy(GOOD)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("path, value, named", [
    (("version",), 1, '"version"'),
    (("gres_syntax",), "24.05", '"gres_syntax"'),
    (("mps_units_per_gpu",), 0, '"mps_units_per_gpu"'),
    (("mps_units_per_gpu",), True, '"mps_units_per_gpu"'),
    (("gpu_types",), "h100", '"gpu_types"'),
    (("mig_types",), [""], '"mig_types"'),
    (("domains",), [], '"domains"'),
    (("domains", "nvl0"), "n1", '"domains.nvl0"'),
    (("gpus_per_node", "n1"), -1, '"gpus_per_node.n1"'),
    (("policy", "switch_wait_s"), "5m", '"policy.switch_wait_s"'),
    (("policy", "switch_wait_s"), 4000, '"policy.switch_wait_s"'),
    (("policy", "on_error"), "drop", '"policy.on_error"'),
    (("policy", "max_switch_wait_s"), _DELETE, '"policy.max_switch_wait_s" is missing'),
    (("mig_types",), _DELETE, '"mig_types" is missing'),
])
def test_bad_key_is_named(path, value, named):
    with pytest.raises(FactsError) as info:
        facts_from_dict(_with(path, value))
    assert named in str(info.value)


def test_load_errors_name_the_file(tmp_path):
    missing = tmp_path / "none.json"
    with pytest.raises(FactsError, match=r"none\.json: cannot read"):
        load_facts(str(missing))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(FactsError, match=r"broken\.json: not valid JSON"):
        load_facts(str(broken))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with(("policy", "on_error"), "x")))
    with pytest.raises(FactsError, match=r'bad\.json: "policy\.on_error"'):
        load_facts(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    assert load_facts(str(good)).gpu_types == ("h100",)


def test_documented_example_loads():
    import os
    import re
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "cluster-facts.md")
    with open(doc, encoding="utf-8") as handle:
        block = re.search(r"```json\n(.*?)```", handle.read(), re.S).group(1)
    assert facts_from_dict(json.loads(block)).version == 2


# ---- one validation: every facts-loading vector through both hooks ------------------------

LOADING = os.path.join(os.path.dirname(__file__), "..", "..", "vectors", "loading",
                       "facts_loading.json")


def _loading_cases() -> list[dict]:
    with open(LOADING, encoding="utf-8") as handle:
        return json.load(handle)["cases"]


def _case_text(case: dict) -> str:
    """The base facts file with the case's keys set ("DELETE" removes one) or text replaced."""
    from luahook import facts_path
    with open(facts_path(_loading_base()), encoding="utf-8") as handle:
        data = json.load(handle)
    for keys, value in case.get("set", []):
        target = data
        for key in keys[:-1]:
            target = target[key]
        if value == "DELETE":
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
    text = json.dumps(data, indent=1)
    if "replace" in case:
        old, new = case["replace"]
        if old == "ALL":
            return new
        if old == "END":
            return text + new
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def _loading_base() -> str:
    with open(LOADING, encoding="utf-8") as handle:
        return json.load(handle)["base"]


def _python_outcome(path: str) -> str:
    try:
        load_facts(path)
    except FactsError as err:
        text = str(err)
        assert text.startswith(path + ": "), text
        return text[len(path) + 2:]
    return "ok"


def _lua_outcome(path: str) -> str:
    from luahook import LuaHook
    hook = LuaHook(path)
    errors = hook.log("error")
    if not errors:
        assert hook.log("info") == [f"gpushare: loaded cluster facts from {path}"]
        return "ok"
    assert len(errors) == 1, errors
    prefix, suffix = f"gpushare: {path}: ", "; jobs pass unchanged until it is fixed"
    assert errors[0].startswith(prefix) and errors[0].endswith(suffix), errors[0]
    return errors[0][len(prefix):-len(suffix)]


def test_enough_loading_vectors():
    cases = _loading_cases()
    assert len(cases) >= 30
    assert sum(case["expect"] == "ok" for case in cases) >= 3
    assert sum(case["expect"] == "not valid JSON" for case in cases) >= 5


@pytest.mark.parametrize("case", _loading_cases(), ids=[c["name"] for c in _loading_cases()])
def test_both_hooks_accept_and_refuse_the_same_facts(tmp_path, case):
    """The Python hook and job_submit.lua load the same files and refuse the others with
    the same message (JSON syntax errors: both say it is not valid JSON)."""
    path = str(tmp_path / "facts.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_case_text(case))
    python, lua = _python_outcome(path), _lua_outcome(path)
    if case["expect"] == "not valid JSON":
        assert python.startswith("not valid JSON") and lua.startswith("not valid JSON"), \
            (python, lua)
    else:
        assert python == case["expect"]
        assert lua == case["expect"]
