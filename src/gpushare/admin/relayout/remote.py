# SPDX-License-Identifier: GPL-2.0-or-later
"""The site's commands that relayout runs (the node's step, restarts): split as a shell
would, but never run by one, with each placeholder's value one word.

ssh joins the words after the destination with spaces and hands them to the remote user's
shell, which splits them again: there the remote command goes as one word, each of its words
quoted (``shlex.join``), so a value stays one word on the node too.
"""

from __future__ import annotations

import os
import re
import shlex

__all__ = ["PLACEHOLDERS", "command_argv"]

PLACEHOLDERS = ("node", "gpu", "layout", "decision", "timeout", "round")
_SSH_WITH_ARGUMENT = set("BbcDEeFIiJLlmOoPpQRSWw")


def _destination(words: list[str]) -> int:
    """Where ssh's destination is in ``words`` (after its options); len(words) if none."""
    position = 1
    while position < len(words):
        word = words[position]
        if word == "--":
            return position + 1
        if not word.startswith("-") or word == "-":
            return position
        flags = word[1:]
        for at, flag in enumerate(flags):
            if flag in _SSH_WITH_ARGUMENT:
                if at == len(flags) - 1:
                    position += 1  # its argument is the next word
                break
        position += 1
    return position


def _fill(word: str, template: str, values: dict[str, str],
          placeholders: tuple[str, ...]) -> str:
    for name in re.findall(r"{(\w*)}", word):
        if name not in placeholders:
            raise ValueError(f"unknown placeholder {{{name}}} in {template!r}; use "
                             + ", ".join(f"{{{p}}}" for p in placeholders))
    return re.sub(r"{(\w+)}", lambda m: values.get(str(m.group(1)), str(m.group(0))), word)


def command_argv(template: str, placeholders: tuple[str, ...] = PLACEHOLDERS,
                 **values: str) -> list[str]:
    """The site's command for one node, split as a shell would but never run by one: each
    ``{node}``, ``{gpu}``, ``{layout}``, ``{decision}``, ``{timeout}``, ``{round}`` (the
    round's other GPUs of the node, ``N=LAYOUT,...``) is replaced inside
    its word, so a value can never become a second argument or a shell operator; after ssh's
    destination the remote command is one word, quoted for the remote shell. Another
    command's own ``placeholders`` (tidal's) replace relayout's."""
    words = shlex.split(template)
    if not words:
        raise ValueError("the command is empty")
    if os.path.basename(words[0]) != "ssh":
        return [_fill(word, template, values, placeholders) for word in words]
    at = _destination(words)
    remote = words[at + 1:]
    if len(remote) == 1:
        remote = shlex.split(remote[0])  # the site quoted the remote command itself
    local = [_fill(word, template, values, placeholders) for word in words[:at + 1]]
    filled = [_fill(word, template, values, placeholders) for word in remote]
    return local + ([shlex.join(filled)] if filled else [])
