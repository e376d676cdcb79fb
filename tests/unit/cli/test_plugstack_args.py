# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare plugstack-args``: every key's value, and no empty ``pythonpath=`` that the
plugin would not take."""

from __future__ import annotations

from gpushare.cli import main
from gpushare.node.config import ARG_SPECS


def lines(capsys, *args: str) -> tuple[int, list[str]]:
    rc = main(["plugstack-args", *args])
    return rc, capsys.readouterr().out.splitlines()


def test_a_key_the_build_decides_is_named_not_printed_empty(capsys):
    rc, out = lines(capsys, "verify=warn")
    assert rc == 0
    assert "verify=warn" in out
    assert "pythonpath=" not in out
    (note,) = [line for line in out if line.startswith("# pythonpath=")]
    assert "not given" in note and "/usr/share/gpushare/python" in note
    # One line per key, in the specs' order.
    assert [line.lstrip("# ").split("=", 1)[0] for line in out] == [s.key for s in ARG_SPECS]


def test_a_given_pythonpath_is_printed_as_given(capsys):
    rc, out = lines(capsys, "pythonpath=/opt/gpushare/python")
    assert rc == 0 and out[0] == "pythonpath=/opt/gpushare/python"
    assert not [line for line in out if line.startswith("#")]


def test_a_bad_key_fails_with_the_accepted_keys(capsys):
    rc, out = lines(capsys, "verfy=strict")
    assert rc == 1 and "unknown plugstack argument 'verfy=strict'" in out[0]
