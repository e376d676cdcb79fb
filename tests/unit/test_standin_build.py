# SPDX-License-Identifier: GPL-2.0-or-later
"""The MPS stand-in's harness leaves nothing behind in the temp directory: every test process
that installs the stand-in builds its program, and used to leave one build directory each."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")

INSTALL_TWICE = """
import sys
from mps_standin.harness import install_standin
for bindir in sys.argv[1:]:
    print(install_standin(bindir))
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="the stand-in needs a C compiler (cc)")
def test_a_process_installing_the_standin_leaves_its_temp_directory_empty(tmp_path):
    scratch = tmp_path / "tmp"
    bindirs = [tmp_path / "bin1", tmp_path / "bin2"]
    for path in (scratch, *bindirs):
        path.mkdir()
    result = subprocess.run([sys.executable, "-c", INSTALL_TWICE, *map(str, bindirs)],
                            env=dict(os.environ, TMPDIR=str(scratch), PYTHONPATH=SCRIPTS),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    programs = result.stdout.split()
    assert programs == [str(path / "nvidia-cuda-mps-control") for path in bindirs]
    for program in programs:
        with open(program, "rb") as handle:
            assert handle.read(4) == b"\x7fELF", program
        assert os.stat(program).st_mode & 0o777 == 0o755, program
        assert os.listdir(os.path.dirname(program)) == ["nvidia-cuda-mps-control"], program
    assert sorted(os.listdir(scratch)) == [], "left in the temp directory"


def test_the_program_is_built_from_every_c_file_of_the_standin():
    """One installed program: the client and servers (front.c) and the daemon (daemon*.c)."""
    sys.path.insert(0, SCRIPTS)
    try:
        from mps_standin import harness
    finally:
        sys.path.remove(SCRIPTS)
    here = os.path.dirname(harness.__file__)
    assert sorted(map(os.path.basename, harness.SOURCES)) == sorted(
        name for name in os.listdir(here) if name.endswith(".c"))
    assert not [name for name in os.listdir(here) if name.endswith(".py")
                and name not in ("__init__.py", "harness.py")]
