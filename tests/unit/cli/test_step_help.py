# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout node`` and ``gpushare tidal holders`` have help of their own, and a
word in the step's place that is not the step says what to type."""

from __future__ import annotations

import pytest

from gpushare.cli import main


def _help(capsys, *argv):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv, own, left_out", [
    (["relayout", "node"], "--step-timeout SECONDS", ("--node-command CMD", "--suggest",
                                                      "--max-changes N")),
    (["tidal", "holders"], "--socket PATH", ("--holders-command CMD", "--needs RULE=N",
                                             "--lent RULE=N")),
])
def test_a_step_prints_its_own_help(capsys, argv, own, left_out):
    out = _help(capsys, *argv)
    assert out.startswith(f"usage: gpushare {' '.join(argv)} [-h]")
    assert own in out
    for option in left_out:
        assert option not in out, option
    whole = _help(capsys, argv[0])
    assert whole.startswith(f"usage: gpushare {argv[0]} [-h]")
    assert all(option in whole for option in left_out)


@pytest.mark.parametrize("argv, word", [(["relayout", "a100-01"], "node"),
                                        (["tidal", "k1"], "holders")])
def test_a_name_in_the_steps_place_says_what_to_type(capsys, argv, word):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{argv[1]!r} is not a sub-command; the only one is the word {word!r}" in err
    assert f"e.g. `gpushare {argv[0]} {word} --help`" in err
    assert "invalid choice" not in err


def test_the_example_node_command_passes_what_the_default_does(capsys):
    """A site copies the example: without --round={round}, Slurm 22.05's one MIG profile per
    node would refuse the first GPU of a round that changes two of a node's GPUs."""
    import re

    from gpushare.admin.relayout import DEFAULT_NODE_COMMAND

    out = _help(capsys, "relayout")
    [example] = re.findall(r"--node-command '([^']*)'", out.split("examples:", 1)[1])
    placeholders = set(re.findall(r"\{\w+\}", DEFAULT_NODE_COMMAND))
    assert placeholders == set(re.findall(r"\{\w+\}", example))
    assert "--round={round}" in example


def test_the_steps_options_without_the_word_node_are_refused(capsys, tmp_path):
    """`gpushare relayout --gpu 2 --layout whole --apply` (node forgotten) would otherwise
    run the controller's round, draining whatever the queue asks for."""
    plan = tmp_path / "absent.yaml"
    assert main(["relayout", "--plan", str(plan), "--gpu", "2", "--layout", "whole",
                 "--apply"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpushare relayout: --gpu, --layout: the node's step's, e.g. "
                          "`gpushare relayout node --gpu N --layout L`")
    assert "plan" not in err  # refused before anything is read
    assert main(["relayout", "--plan", str(plan), "--source", "sim:/x.json"]) == 2
    assert "--source: the node's step's" in capsys.readouterr().err


def test_the_controllers_options_after_the_word_node_are_refused(capsys, tmp_path):
    """`gpushare relayout node --max-changes 3 --node-command x` would run the step and
    ignore them."""
    plan = tmp_path / "absent.yaml"
    assert main(["relayout", "node", "--plan", str(plan), "--gpu", "2", "--layout", "whole",
                 "--max-changes", "3", "--node-command", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpushare relayout node: --node-command, --max-changes: the "
                          "controller's"), err
    assert main(["relayout", "node", "--plan", str(plan), "--gpu", "2", "--layout", "whole",
                 "--suggest"]) == 2
    assert "--suggest: the controller's" in capsys.readouterr().err
    assert main(["relayout", "node", "--plan", str(plan), "--gpu", "2", "--layout", "whole",
                 "--json", "--backend", "scontrol"]) == 2
    assert "--json, --backend: the controller's" in capsys.readouterr().err
    # The step's own options and the shared ones are the step's.
    assert main(["relayout", "node", "--plan", str(plan), "--gpu", "2", "--layout", "whole",
                 "--state", "none", "--timeout", "5"]) == 2
    assert "the controller's" not in capsys.readouterr().err
