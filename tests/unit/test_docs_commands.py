# SPDX-License-Identifier: GPL-2.0-or-later
"""README.md and docs/ against the code: every ``gpushare`` command line they show parses,
every option they name exists, every plugstack key they document is the plugin's with its
default, and every sub-command is documented."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from gpushare.cli import build_parser
from gpushare.node.config import ARG_SPECS

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/admin.md", "docs/troubleshooting.md", "docs/users.md",
        "docs/cluster-facts.md", "docs/architecture.md")
SYNOPSIS = re.compile(r"[\[\]{}<>|…]|\.\.\.|KEY=VALUE|SBATCH-FLAGS|\bFILE\b|\bPATH\b|\bNAME\b")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def command_lines() -> list[tuple[str, str, bool]]:
    """(where, command, whole) for each gpushare command in code blocks (whole command
    lines) and inline code (mentions: the names in them must exist)."""
    found = []
    for name in DOCS:
        text = (REPO / name).read_text()
        in_block = False
        for number, line in enumerate(text.splitlines(), start=1):
            if line.startswith("```"):
                in_block = not in_block
                continue
            where = f"{name}:{number}"
            if in_block:
                # Inside a code block: a command line, or one run by cron or runuser.
                match = re.search(r"(?:^\s*|/usr/bin/|--\s)(gpushare\s+[a-z-]+.*)$", line)
                if match and "#" not in line[:match.start(1)]:
                    command = re.split(r"\s+#|\s+>|\s+\|\s", match.group(1))[0]
                    found.append((where, command.strip(), True))
                continue
            for span in re.findall(r"`(gpushare [a-z][^`]*)`", line):
                found.append((where, span.replace("\\|", "|"), False))
    return found


def test_docs_show_commands():
    assert len(command_lines()) > 30


@pytest.mark.parametrize("where, command, whole", command_lines())
def test_documented_command_exists_and_parses(where, command, whole):
    commands = subcommands()
    words = shlex.split(command)
    assert words[1] in commands, f"{where}: no sub-command {words[1]!r} in `{command}`"
    options = commands[words[1]]._option_string_actions
    for word in words[2:]:
        if word == "--":
            break
        option = word.split("=", 1)[0]
        if option.startswith("-") and not SYNOPSIS.search(option):
            assert option in options, f"{where}: gpushare {words[1]} has no {option}"
    if not whole or SYNOPSIS.search(command):
        return  # a mention or a synopsis: its names are checked above
    try:
        build_parser().parse_args(words[1:])
    except SystemExit as exit_:
        if exit_.code != 0 or "--help" not in words:
            pytest.fail(f"{where}: `{command}` does not parse (exit {exit_.code})")


def test_readme_lists_every_subcommand():
    text = (REPO / "README.md").read_text()
    listed = set(re.findall(r"^\| `gpushare ([a-z-]+)", text, re.MULTILINE))
    assert listed == set(subcommands())


def plugstack_table(name: str) -> dict[str, str]:
    """key -> documented default, from a Markdown table whose rows start with `key=`."""
    rows = re.findall(r"^\| `([a-z_]+)=` \| (`[^`]*`|none) \|", (REPO / name).read_text(),
                      re.MULTILINE)
    return {key: "" if default == "none" else default.strip("`") for key, default in rows}


@pytest.mark.parametrize("name", ["README.md", "docs/admin.md"])
def test_documented_plugstack_keys_are_the_plugins(name):
    assert plugstack_table(name) == {spec.key: spec.default for spec in ARG_SPECS}


def test_admin_guide_names_every_path_argument_that_takes_percent_n():
    from gpushare.node.config import ConfigError, plugin_arg_values

    text = (REPO / "docs/admin.md").read_text()
    sentence = re.search(r"^Path arguments \((.*?)\) take `%n`", text, re.MULTILINE | re.DOTALL)
    assert sentence, "docs/admin.md: the sentence on path arguments is gone"
    named = set(re.findall(r"`([a-z_]+)=", sentence.group(1)))
    taking = set()
    for spec in ARG_SPECS:
        value = "sim:/x/%n.json" if spec.key == "inventory" else "/x/%n/%h"
        try:
            plugin_arg_values([f"{spec.key}={value}"])
        except ConfigError:
            continue
        taking.add(spec.key)
    assert named == taking

