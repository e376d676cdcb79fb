# SPDX-License-Identifier: GPL-2.0-or-later
"""Fuzzing the plan parser: whatever the input, the answer is a Plan or a PlanError."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.admin.plan import Plan, PlanError, parse_plan

KEYS = ["version", "slurm", "policy", "domains", "node_groups", "name", "nodes", "gpu_model",
        "gpus", "layout", "all", "owner", "mps", "shard", "mig", "profile", "count",
        "placement", "0-3", "2", "kubernetes", "plugin_args", "device_root", "on_error"]
VALUES = ["slurm", "kubernetes", "a100-40gb", "h100", "l40s", "1g.5gb", "3g.20gb", "7g.40gb",
          "n[1-4]", "n[", "all", "fabric", "22.05", "23.11", "/dev", "accept"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70), st.floats(allow_nan=False),
                    st.sampled_from(VALUES), st.text(max_size=8))
structures = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=30,
)


def outcome(text: str) -> None:
    try:
        result = parse_plan(text, "fuzz.yaml")
    except PlanError as err:
        assert err.problems and all(p.startswith("fuzz.yaml:") for p in err.problems)
        return
    assert isinstance(result, Plan)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_random_text(text):
    outcome(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(structures)
def test_random_structures(data):
    outcome(yaml.safe_dump(data))


group = st.fixed_dictionaries({
    "name": st.sampled_from(["a", "b", 3]),
    "nodes": st.sampled_from(["n[1-2]", "n[2-3]", "x", "", 5, "n[3-1]"]),
    "gpu_model": st.sampled_from(["a100-40gb", "h200", "l40s", "tpu"]),
    "gpus": st.one_of(st.integers(-1, 9), st.just("8")),
    "layout": st.dictionaries(
        st.sampled_from(["all", 0, 1, "0-1", "1-9", "x"]),
        st.fixed_dictionaries({}, optional={
            "owner": st.sampled_from(["slurm", "kubernetes", "both"]),
            "mps": st.one_of(st.booleans(), st.integers(-1, 200)),
            "mig": st.lists(st.fixed_dictionaries(
                {"profile": st.sampled_from(["1g.5gb", "3g.20gb", "4g.20gb", "7g.40gb",
                                             "1g.18gb", 7])},
                optional={"owner": st.sampled_from(["slurm", "kubernetes"]),
                          "count": st.integers(0, 8), "placement": st.integers(-1, 8)}),
                max_size=5),
        }), max_size=3),
})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(group, min_size=1, max_size=3),
       st.one_of(st.none(), st.just("fabric"), st.dictionaries(
           st.sampled_from(["d0", "d 1", "d2"]), st.sampled_from(["n[1-2]", "n3", "q"]))))
def test_plan_shaped_structures(groups, domains):
    data = {"version": 1, "node_groups": groups}
    if domains is not None:
        data["domains"] = domains
    outcome(yaml.safe_dump(data))


def test_hostile_yaml_constructs():
    for text in ("a: &x [*x]\n", "!!python/object:os.system {}\n", "version: !!int abc\n",
                 "? [a]\n: 1\n", "version: 1\nnode_groups: *nope\n", "- - - - -\n" * 3,
                 "version: 1\nnode_groups:\n" + "  - " * 60 + "x\n", "\x00\x01", "{",
                 "version: 2020-13-45\n"):
        outcome(text)
