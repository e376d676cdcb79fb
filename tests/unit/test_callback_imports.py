"""What job_prolog and job_epilog import is paid by every job on every node (each starts a
fresh interpreter): the libraries the package docstring names stay out of it."""

import os
import subprocess
import sys

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
HEAVY = ("dataclasses", "inspect", "logging", "subprocess", "hashlib", "textwrap", "yaml")


def loaded_after(modules):
    path = [SRC, *(p for p in sys.path if p)]  # python-hostlist, pynvml: this venv's
    code = (f"import sys; sys.path[:] = {path!r}; import {', '.join(modules)}; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    # -I -S: no site, no user paths, as the plugin's embedded interpreter runs.
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=True).stdout.split()


def test_the_epilog_imports_none_of_them():
    assert loaded_after(["gpushare.spank_adapter"]) == []


def test_a_verifying_prolog_imports_none_of_them():
    """With a simulated node; on a real one, pynvml's own imports come on top."""
    modules = ["gpushare.spank_adapter", "gpushare.verify", "gpushare.inventory",
               "gpushare.gresconf", "gpushare.nvml", "gpushare.nvml_sim"]
    assert loaded_after(modules) == []


def test_the_check_itself_can_fail():
    assert loaded_after(["gpushare.spank_adapter", "dataclasses"]) == ["dataclasses",
                                                                       "inspect"]
