# SPDX-License-Identifier: GPL-2.0-or-later
"""GRES request strings: both syntaxes, every field's shape, counts, and bad items."""

from __future__ import annotations

import pytest

from gpushare.submit.gres import (
    GresError,
    GresItem,
    format_field,
    parse_count,
    parse_field,
    user_form,
    user_item,
)


@pytest.mark.parametrize("value, name, type_, count, prefix, sep", [
    ("gres:gpu:2", "gpu", None, 2, "gres:", ":"),
    ("gres/gpu:a100:2", "gpu", "a100", 2, "gres/", ":"),
    ("gres:mps:50", "mps", None, 50, "gres:", ":"),
    ("gres:gpu:1g.10gb:1", "gpu", "1g.10gb", 1, "gres:", ":"),
    ("gres:gpu:h100", "gpu", "h100", 1, "gres:", ":"),
    ("gres/gpu:a100=3", "gpu", "a100", 3, "gres/", "="),
    ("gres/gpu=4", "gpu", None, 4, "gres/", "="),
    ("gres:gpu", "gpu", None, 1, "gres:", ":"),
    ("gpu:h100:8", "gpu", "h100", 8, "", ":"),
    ("gres:gpu:2k", "gpu", None, 2048, "gres:", ":"),
    ("gres:mps:1M", "mps", None, 1 << 20, "gres:", ":"),
    ("gres:gpu:nvidia_h100_80gb_hbm3_1g.10gb+me:1", "gpu",
     "nvidia_h100_80gb_hbm3_1g.10gb+me", 1, "gres:", ":"),
])
def test_parse_one_item(value, name, type_, count, prefix, sep):
    (item,) = parse_field(value)
    assert (item.name, item.type, item.count, item.prefix, item.count_sep) == (
        name, type_, count, prefix, sep)
    assert item.is_gres


def test_several_items_and_plain_tres_pass_through():
    items = parse_field("cpu=4,gres/gpu:a100=1,gres/shard:2")
    assert [i.is_gres for i in items] == [False, True, True]
    assert items[0].raw == "cpu=4"
    assert format_field(items) == "cpu=4,gres/gpu:a100=1,gres/shard:2"


def test_format_keeps_syntax_and_makes_count_explicit():
    assert format_field(parse_field("gres:gpu:h100,gres:shard:2")) == (
        "gres:gpu:h100:1,gres:shard:2")
    assert format_field(parse_field("gres/gpu:1g.10gb=2")) == "gres/gpu:1g.10gb=2"


def test_empty_and_none_give_no_items():
    assert parse_field(None) == []
    assert parse_field("") == []


@pytest.mark.parametrize("value", [
    "gres:gpu:a100:two", "gres:gpu:a:b:2", "gres:gpu:1,", "gres::1", "gres:gpu::1",
    "gres/gpu:a100=x", "gres/gpu:a:b=1", "gres:9gpu:1", "gres:gpu:99999999999",
    "gres:gpu:a100:4294967295", "gres:gpu:a b:1", "gres:gpu:1\n",
])
def test_bad_items_raise_with_the_item(value):
    with pytest.raises(GresError) as info:
        parse_field(value)
    assert info.value.item in value.split(",")


def test_counts():
    assert parse_count("7") == 7
    assert parse_count("1k") == 1024
    assert parse_count("1g") == 1 << 30
    assert parse_count("4294967293") == 4294967293
    assert parse_count("4294967294") is None  # that is NO_VAL
    assert parse_count("1x") is None
    assert parse_count("") is None


def test_user_forms_per_flag():
    item = GresItem(name="gpu", type="a100", count=2, prefix="gres:")
    assert user_item("tres_per_node", item) == "--gres=gpu:a100:2"
    assert user_item("tres_per_job", item) == "--gpus=a100:2"
    assert user_item("tres_per_task", GresItem(name="gpu", count=1)) == "--gpus-per-task=1"
    assert user_form("tres_per_node", parse_field("gres:mps:50,gres:gpu:1")) == (
        "--gres=mps:50,gpu:1")


@pytest.mark.parametrize("text", ["gres:gpu:1g.10gb", "gres/gpu:3g.40gb", "gpu:2g.20gb+me"])
def test_a_type_starting_with_a_digit_needs_its_count(text):
    """slurmctld reads ``gpu:1g.10gb`` as a count ("1g") and refuses it; the rules must
    say so rather than pass it on."""
    with pytest.raises(GresError) as info:
        parse_field(text)
    assert info.value.count_missing
    with pytest.raises(GresError) as other:
        parse_field("gres:gpu:a:b:c")
    assert not other.value.count_missing
