"""The facts file: the documented example loads; each bad key is named in the error."""

from __future__ import annotations

import copy
import json

import pytest

from gpushare.facts import FactsError, facts_from_dict, load_facts

GOOD = {
    "version": 1, "gres_syntax": "22.05", "mps_units_per_gpu": 100,
    "gpu_types": ["h100"], "mig_types": ["1g.10gb", "3g.40gb"],
    "domains": {"nvl0": ["n1", "n2"], "nvl1": ["n3", "n4", "n5"]},
    "gpus_per_node": {"n1": 8},
    "policy": {"switch_wait_s": 300, "max_switch_wait_s": 3600, "on_error": "accept"},
}


def test_good_facts():
    facts = facts_from_dict(GOOD)
    assert facts.gres_prefix == "gres:"
    assert facts.domain_sizes == (3, 2)
    assert facts.mig_types == ("1g.10gb", "3g.40gb")
    assert facts.policy.max_switch_wait_s == 3600


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
    (("version",), 2, '"version"'),
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
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cluster-facts.md")
    with open(doc, encoding="utf-8") as handle:
        block = re.search(r"```json\n(.*?)```", handle.read(), re.S).group(1)
    assert facts_from_dict(json.loads(block)).version == 1
