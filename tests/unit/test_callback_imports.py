# SPDX-License-Identifier: GPL-2.0-or-later
"""What job_prolog and job_epilog import is paid by every job on every node (each starts a
fresh interpreter): the libraries the package docstring names stay out of it."""

import os
import subprocess
import sys

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
VERIFYING_PROLOG = ["gpushare.node.spank_adapter", "gpushare.node.verify",
                    "gpushare.gpu.inventory", "gpushare.gpu.gresconf", "gpushare.gpu.nvml",
                    "gpushare.gpu.nvml_sim"]
HEAVY = ("dataclasses", "inspect", "logging", "subprocess", "hashlib", "textwrap", "yaml")


def loaded_after(modules):
    path = [SRC, *(p for p in sys.path if p)]  # python-hostlist, pynvml: this venv's
    code = (f"import sys; sys.path[:] = {path!r}; import {', '.join(modules)}; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    # -I -S: no site, no user paths, as the plugin's embedded interpreter runs.
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=True).stdout.split()


def test_the_epilog_imports_none_of_them():
    assert loaded_after(["gpushare.node.spank_adapter"]) == []


def test_a_verifying_prolog_imports_none_of_them():
    """With a simulated node; on a real one, pynvml's own imports come on top."""
    assert loaded_after(VERIFYING_PROLOG) == []


def test_the_check_itself_can_fail():
    assert loaded_after(["gpushare.node.spank_adapter", "dataclasses"]) == ["dataclasses",
                                                                            "inspect"]


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
