# SPDX-License-Identifier: GPL-2.0-or-later
"""Every conformance vector through the Python rules; plus rule properties vectors can't show."""

from __future__ import annotations

import pytest

from gpushare.submit.facts import load_facts
from gpushare.submit.rules import (
    NO_VAL,
    apply,
    apply_modify,
    format_wait,
    mig_profile,
    spank_options,
)
from luahook import facts_path, load_vectors

VECTORS = load_vectors()


def test_enough_vectors_for_every_rule():
    assert len(VECTORS) >= 40
    ids = " ".join(v["id"] for v in VECTORS)
    for group in ("gres:", "gres_2311:", "share:", "private_mps:", "mig:", "switches:",
                  "modify:", "root:", "untyped:", "domains:"):
        assert group in ids
    assert any(v["expected"]["reject"] for v in VECTORS)


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_vector_python(vector):
    facts = load_facts(facts_path(vector["facts"]))
    rules = apply_modify if vector["entry"] == "modify" else apply
    assert rules(vector["job"], facts).to_dict() == vector["expected"]


def test_every_message_is_one_gpushare_line():
    for vector in VECTORS:
        messages = vector["expected"]["messages"]
        assert len(messages) <= 1
        assert all(m.startswith("gpushare: ") and "\n" not in m for m in messages)


def test_array_index_does_not_matter():
    facts = load_facts(facts_path("h100-2205"))
    job = {"tres_per_node": "gres:gpu:nvidia_a100_1g.10gb:1", "min_nodes": 3}
    results = {str(apply(dict(job, array_inx=inx), facts).to_dict())
               for inx in (None, "1-1000%100", "0", "5,7,9")}
    assert len(results) == 1


def test_rejections_use_invalid_gres():
    facts = load_facts(facts_path("h100-2205"))
    decision = apply({"tres_per_node": "gres:mps:150"}, facts)
    assert decision.reject is not None and decision.reject.code == 2072
    assert decision.reject.flag == "--gres=mps:150"
    assert decision.changes == {}


def test_unset_numbers_in_every_form():
    facts = load_facts(facts_path("h100-2205"))
    for unset in (None, NO_VAL, 0xFFFE, "x", True, float("nan")):
        job = {"tres_per_node": "gres:gpu:h100:8", "min_nodes": unset}
        assert apply(job, facts).changes == {}
    job = {"tres_per_node": "gres:gpu:h100:8", "min_nodes": 2.0, "req_switch": "1"}
    assert apply(job, facts).changes == {}  # float node count, string switch count


@pytest.mark.parametrize("seconds, text", [
    (0, "0:00"), (45, "0:45"), (300, "5:00"), (3600, "1:00:00"), (5400, "1:30:00"),
    (86400, "1-00:00:00"), (90061, "1-01:01:01"),
])
def test_format_wait(seconds, text):
    assert format_wait(seconds) == text


@pytest.mark.parametrize("type_name, profile", [
    ("1g.10gb", "1g.10gb"), ("nvidia_a100_3g.20gb", "3g.20gb"),
    ("NVIDIA_H100_80GB_HBM3_1G.10GB", "1g.10gb"), ("a100_1c.3g.40gb", "1c.3g.40gb"),
    ("1g.10gb+me", "1g.10gb+me"), ("a100", None), ("h100_80gb", None), ("g.10gb", None),
])
def test_mig_profile(type_name, profile):
    assert mig_profile(type_name) == profile


def test_spank_options_both_shapes():
    as_list = ["A=1", "_SLURM_SPANK_OPTION_gpushare_gpu_share=25", "garbage",
               "_SLURM_SPANK_OPTION_gpushare_gpu_mps="]
    assert spank_options(as_list) == {"gpu_share": "25", "gpu_mps": ""}
    assert spank_options({"_SLURM_SPANK_OPTION_gpushare_gpu_share": 30}) == {"gpu_share": "30"}
    assert spank_options(None) == {}
