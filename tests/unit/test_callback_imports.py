# SPDX-License-Identifier: GPL-2.0-or-later
"""What job_prolog and job_epilog import is paid by every job on every node (each starts a
fresh interpreter): the libraries the package docstring names stay out of it.

The rule holds per subpackage: every module of ``node``, ``gpu`` and ``common`` loads none
of them, and none of them loads ``admin``, ``submit`` or ``cli`` (the layers above) when
it is imported."""

import json
import os
import subprocess
import sys

import pytest

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
VERIFYING_PROLOG = ["gpushare.node.spank_adapter", "gpushare.node.verify",
                    "gpushare.gpu.inventory", "gpushare.gpu.gresconf", "gpushare.gpu.nvml",
                    "gpushare.gpu.nvml_sim"]
HEAVY = ("dataclasses", "inspect", "logging", "subprocess", "hashlib", "textwrap", "yaml")
HOT_SUBPACKAGES = ("node", "gpu", "common")
HIGHER = ("gpushare.admin", "gpushare.submit", "gpushare.cli")


def hot_modules():
    """Every module of the subpackages the prolog and epilog may import (theirs included),
    and the packages."""
    names = []
    for sub in HOT_SUBPACKAGES:
        for folder, dirs, files in os.walk(os.path.join(SRC, "gpushare", sub)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            package = os.path.relpath(folder, SRC).replace(os.sep, ".")
            names.append(package)
            names += [f"{package}.{entry[:-3]}" for entry in sorted(files)
                      if entry.endswith(".py") and entry != "__init__.py"]
    return names


HOT_MODULES = hot_modules()


def imported(modules):
    """The HEAVY modules and the modules of HIGHER loaded once ``modules`` are imported."""
    path = [SRC, *(p for p in sys.path if p)]  # python-hostlist, pynvml: this venv's
    code = (f"import sys; sys.path[:] = {path!r}; import {', '.join(modules)}; "
            f"import json; heavy = [m for m in {HEAVY!r} if m in sys.modules]; "
            f"higher = sorted(m for m in sys.modules if m.startswith({HIGHER!r})); "
            "print(json.dumps([heavy, higher]))")
    # -I -S: no site, no user paths, as the plugin's embedded interpreter runs.
    heavy, higher = json.loads(subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
        check=True).stdout)
    return heavy, higher


def loaded_after(modules):
    return imported(modules)[0]


def higher_after(modules):
    return imported(modules)[1]


def test_the_epilog_imports_none_of_them():
    assert loaded_after(["gpushare.node.spank_adapter"]) == []


def test_a_verifying_prolog_imports_none_of_them():
    """With a simulated node; on a real one, pynvml's own imports come on top."""
    assert loaded_after(VERIFYING_PROLOG) == []


def test_the_check_itself_can_fail():
    assert loaded_after(["gpushare.node.spank_adapter", "dataclasses"]) == ["dataclasses",
                                                                            "inspect"]


def test_every_hot_path_subpackage_is_checked():
    for module in ("gpushare.node.spank_adapter", "gpushare.gpu.nvml", "gpushare.common.log",
                   "gpushare.node.mps", "gpushare.node.mps.limits"):
        assert module in HOT_MODULES
    assert not [m for m in HOT_MODULES if m.startswith(HIGHER)]


@pytest.mark.parametrize("module", HOT_MODULES)
def test_a_hot_path_module_imports_no_heavy_library_and_no_higher_layer(module):
    assert imported([module]) == ([], [])


def test_the_layer_check_can_fail():
    assert higher_after(["gpushare.node.job", "gpushare.submit.gres"]) == [
        "gpushare.submit", "gpushare.submit.gres"]


def compiles_during_import(modules, path=()):
    """How often ``compile()`` runs while ``modules`` are imported from .pyc files.

    typing.NamedTuple compiles each string annotation (``from __future__ import
    annotations``) into a ForwardRef, about 40 us a field, so the callbacks' records are
    declared with real annotations."""
    search = [*path, SRC, *(p for p in sys.path if p)]
    code = ("import builtins, sys; sys.path[:] = " + repr(search) + "\n"
            "import typing, collections, json, re\n"
            "calls = []; real = builtins.compile\n"
            "def counting(*args, **kwargs):\n"
            "    calls.append(args[0] if args else kwargs.get('source'))\n"
            "    return real(*args, **kwargs)\n"
            "builtins.compile = counting\n"
            f"import {', '.join(modules)}\n"
            "print(len(calls))")
    for _ in range(2):  # the first run may write .pyc files, which compiles the modules
        result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                                text=True, check=True)
    return int(result.stdout)


def test_callback_records_need_no_compiling():
    assert compiles_during_import(VERIFYING_PROLOG) == 0


def test_the_compile_count_can_fail(tmp_path):
    (tmp_path / "lazy_record.py").write_text(
        "from __future__ import annotations\nfrom typing import NamedTuple\n\n\n"
        "class Lazy(NamedTuple):\n    a: int\n    b: str\n")
    assert compiles_during_import(["lazy_record"], [str(tmp_path)]) == 2
