# SPDX-License-Identifier: GPL-2.0-or-later
"""docs/architecture.md names only what exists: every repository path in a code span, and
every ``gpushare.*`` dotted name (a module, a package, or a name a module defines)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
PREFIXES = ("src/", "spank/", "submit_hooks/", "etc/", "tests/", "scripts/", "packaging/",
            "docs/", "bench/")
SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^gpushare(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def names(text: str) -> tuple[list[str], list[str]]:
    """The paths and the dotted names the text's code spans hold."""
    spans = SPAN.findall(text)
    paths = [span for span in spans if span.startswith(PREFIXES)]
    dotted = [span for span in spans if DOTTED.match(span)]
    return paths, dotted


def module_file(dotted: str, root: Path) -> Path | None:
    """The file of a module or package named ``dotted``, or None."""
    base = root / "src" / Path(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defines(path: Path, name: str) -> bool:
    """Whether the module at ``path`` defines ``name`` (function, class, constant) or, for a
    class's method or attribute, has it indented."""
    pattern = re.compile(rf"^\s*(?:def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]",
                         re.MULTILINE)
    return bool(pattern.search(path.read_text()))


def resolves(dotted: str, root: Path) -> bool:
    """A module or package, else ``module.name`` or ``module.Class.name`` it defines."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        found = module_file(".".join(parts[:cut]), root)
        if found is not None:
            return all(defines(found, name) for name in parts[cut:])
    return False


def missing(text: str, root: Path = REPO) -> list[str]:
    """What the text names that the repository does not have."""
    paths, dotted = names(text)
    gone = [path for path in paths
            if not any(root.glob(path.rstrip("/"))) and not (root / path).exists()]
    return gone + [name for name in dotted if not resolves(name, root)]


def test_every_path_and_module_it_names_exists():
    text = DOC.read_text()
    paths, dotted = names(text)
    assert len(paths) >= 20 and len(dotted) >= 30  # the extraction still finds them
    assert missing(text) == []


def test_the_check_can_fail():
    text = ("`src/gpushare/node/job.py` `src/gpushare/node/nothing.py` `spank/no_such.c` "
            "`gpushare.node.job` `gpushare.node.job.prolog` `gpushare.node.nothing` "
            "`gpushare.node.job.no_such_function` `gpushare.node.mps.limits.limits_for`")
    assert missing(text) == ["src/gpushare/node/nothing.py", "spank/no_such.c",
                             "gpushare.node.nothing", "gpushare.node.job.no_such_function"]


def test_the_readme_links_it():
    assert "(docs/architecture.md)" in (REPO / "README.md").read_text()
