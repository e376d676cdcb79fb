# SPDX-License-Identifier: GPL-2.0-or-later
"""The node commands' settings name the file that holds the plugin's line."""

from __future__ import annotations

import argparse

import pytest

from gpushare.cli import nodeconf
from gpushare.node.config import ConfigError


def test_the_settings_come_from_the_drop_in_plugstack_conf_includes(tmp_path, monkeypatch):
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / "plugstack.conf").write_text("include plugstack.conf.d/*.conf\n")
    (tmp_path / "plugstack.conf.d").mkdir()
    drop_in = tmp_path / "plugstack.conf.d" / "gpushare.conf"
    drop_in.write_text("required /usr/lib64/slurm/spank_gpushare.so state_dir=/run/gs/%n\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    config, source = nodeconf.load(argparse.Namespace(plugstack=None, node="n7"))
    assert (config.state_dir, source) == ("/run/gs/n7", str(drop_in))
    drop_in.write_text("required /usr/lib64/slurm/spank_gpushare.so verify=maybe\n")
    with pytest.raises(ConfigError, match=rf"^{drop_in}: .*verify='maybe' is invalid"):
        nodeconf.load(argparse.Namespace(plugstack=None, node="n7"))
