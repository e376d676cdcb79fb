# SPDX-License-Identifier: GPL-2.0-or-later
"""Every request the user docs show, through ``gpushare explain`` with the facts rendered
from etc/plan.example.yaml: the docs say exactly what the hooks answer, so they cannot drift.

In docs/users.md, a ``$ srun ...``/``$ sbatch ...``/``$ gpushare explain -- ...`` line in a
code block is a request; the ``srun:``/``sbatch:`` lines right after it are what the user
sees (none: accepted without a message).
"""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from gpushare.admin.plan import load_plan
from gpushare.admin.render_facts import render_facts
from gpushare.cli import main
from gpushare.submit.facts import facts_from_dict

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLE_PLAN = os.path.join(REPO, "etc", "plan.example.yaml")
USERS = os.path.join(REPO, "docs", "users.md")
FACTS_DOC = os.path.join(REPO, "docs", "cluster-facts.md")


def documented_requests() -> list[tuple[int, str, list[str]]]:
    """(line, command, expected lines) for every request in docs/users.md."""
    with open(USERS, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    requests: list[tuple[int, str, list[str]]] = []
    in_block = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        if line.startswith("$ "):
            requests.append((number, line[2:], []))
        elif requests and requests[-1][0] + len(requests[-1][2]) + 1 == number \
                and re.match(r"(srun|sbatch): ", line):
            requests[-1][2].append(line)
    return requests


REQUESTS = documented_requests()


@pytest.fixture(scope="module")
def example_facts(tmp_path_factory):
    path = tmp_path_factory.mktemp("facts") / "gpushare-facts.json"
    path.write_text(json.dumps(render_facts(load_plan(EXAMPLE_PLAN))))
    return str(path)


def test_the_docs_show_requests_and_answers():
    assert len(REQUESTS) >= 20
    assert sum(bool(expected) for _, _, expected in REQUESTS) >= 12
    assert any(any(": error: gpushare: " in line for line in expected)
               for _, _, expected in REQUESTS)


@pytest.mark.parametrize("line, command, expected", REQUESTS,
                         ids=[f"users.md:{line}" for line, _, _ in REQUESTS])
def test_documented_request(capsys, example_facts, line, command, expected):
    words = shlex.split(command)
    if words[:2] == ["gpushare", "explain"]:
        client, flags = "sbatch", words[3:] if words[2:3] == ["--"] else words[2:]
    else:
        assert words[0] in ("srun", "sbatch"), f"users.md:{line}: {command}"
        client, flags = words[0], words[1:]
    rc = main(["explain", "--facts", example_facts, "--json", "--uid", "1000", "--", *flags])
    result = json.loads(capsys.readouterr().out)
    decision = result["decision"]
    if result["client_refusal"]:
        seen = [f"{client}: {result['client_refusal']}"]
    elif decision["reject"]:
        seen = [f"{client}: error: {decision['reject']['text']}"]
    else:
        seen = [f"{client}: {message}" for message in decision["messages"]]
    if words[:2] == ["gpushare", "explain"]:
        assert rc == 0, f"users.md:{line}: {seen}"
        return
    assert seen == expected, f"users.md:{line}: {command}"
    assert rc == (1 if expected and ": error: " in expected[0] else 0)


def test_facts_doc_example_is_what_the_example_plan_renders():
    with open(FACTS_DOC, encoding="utf-8") as handle:
        block = re.search(r"```json\n(.*?)```", handle.read(), re.S).group(1)
    shown = json.loads(block)
    facts_from_dict(shown)
    rendered = render_facts(load_plan(EXAMPLE_PLAN))
    for key in ("version", "gres_syntax", "mps_units_per_gpu", "gpu_types", "mig_types",
                "types", "domains", "policy"):
        assert shown[key] == rendered[key], key
    for node, count in shown["gpus_per_node"].items():
        assert rendered["gpus_per_node"][node] == count


def test_facts_doc_names_the_fixed_default_path():
    from gpushare.submit.facts import DEFAULT_FACTS_PATH
    with open(FACTS_DOC, encoding="utf-8") as handle:
        text = handle.read()
    assert f"Its default path is `{DEFAULT_FACTS_PATH}`" in text
    assert "next to slurm.conf" not in text and "beside slurm.conf" not in text
