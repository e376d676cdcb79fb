# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare check warns where a job could take over its user's MPS daemon, which runs
outside the job's cgroup: kernel.yama.ptrace_scope 0, or a kernel without Yama."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import pytest

from gpushare.admin import check
from gpushare.cli import main

PLAN = Path(__file__).resolve().parents[3] / "etc" / "plan.example.yaml"


def proc_with(tmp_path: Path, value: Optional[str]) -> str:
    """A proc root whose kernel.yama.ptrace_scope is ``value`` (None: no Yama)."""
    root = tmp_path / "proc"
    (root / "sys" / "kernel").mkdir(parents=True)
    if value is not None:
        (root / "sys" / "kernel" / "yama").mkdir()
        (root / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(value + "\n")
    return str(root)


def test_ptrace_scope_0_is_a_warning_saying_why_and_what_to_set(tmp_path):
    root = proc_with(tmp_path, "0")
    (finding,) = check.check_ptrace_scope(root)
    assert finding.severity == check.WARNING
    assert finding.where == f"{root}/sys/kernel/yama/ptrace_scope"
    assert "kernel.yama.ptrace_scope is 0" in finding.what
    assert "/proc/<pid>/mem" in finding.what and "outside the job's cgroup" in finding.what
    assert "kernel.yama.ptrace_scope=1" in finding.fix and "/etc/sysctl.d/" in finding.fix


def test_a_kernel_without_yama_is_a_warning(tmp_path):
    (finding,) = check.check_ptrace_scope(proc_with(tmp_path, None))
    assert finding.severity == check.WARNING and "has no Yama" in finding.what
    assert "CONFIG_SECURITY_YAMA" in finding.fix and "ptrace_scope=1" in finding.fix


@pytest.mark.parametrize("value", ["1", "2", "3"])
def test_ptrace_scope_1_or_more_is_fine(tmp_path, value):
    assert check.check_ptrace_scope(proc_with(tmp_path, value)) == []


@pytest.fixture
def site(tmp_path, monkeypatch):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("")
    monkeypatch.setenv("SLURM_CONF", str(etc / "slurm.conf"))
    shutil.copy(PLAN, tmp_path / "plan.yaml")
    return tmp_path


def findings(capsys, site: Path, proc_root: str) -> list[dict]:
    main(["check", "--plan", str(site / "plan.yaml"), "--node", "a100-01", "--source", "none",
          "--gres-conf", "none", "--proc-root", proc_root, "--json"])
    return json.loads(capsys.readouterr().out)["findings"]


def test_the_node_check_reads_the_given_proc_root_where_the_plugin_runs(site, capsys):
    (site / "etc" / "plugstack.conf").write_text(
        f"required /usr/lib64/slurm/spank_gpushare.so state_dir={site}/state/%n\n")
    zero = proc_with(site, "0")
    assert [f["what"] for f in findings(capsys, site, zero)
            if f["where"].endswith("ptrace_scope")] != []
    (Path(zero) / "sys" / "kernel" / "yama" / "ptrace_scope").write_text("1\n")
    assert [f for f in findings(capsys, site, zero) if f["where"].endswith("ptrace_scope")] \
        == []


def test_a_node_without_the_plugin_has_no_daemons_to_take_over(site, capsys):
    (site / "etc" / "plugstack.conf").write_text("")
    assert [f for f in findings(capsys, site, proc_with(site, "0"))
            if f["where"].endswith("ptrace_scope")] == []
