# SPDX-License-Identifier: GPL-2.0-or-later
"""Plugin arguments: every key validated, every problem named."""

import pytest

from gpushare.node.config import (
    ARG_SPECS,
    ConfigError,
    PluginConfig,
    beside_slurm_conf,
    mps_space_limits,
    parse_plugin_args,
    parse_size,
    plugstack_args,
    plugstack_line,
)


def test_defaults_match_the_dataclass():
    parsed = parse_plugin_args([])
    assert parsed == PluginConfig()
    assert parsed.timeout == 10.0 and parsed.show is False


def test_every_key_is_accepted_with_a_good_value():
    good = {"pythonpath": "/opt/gs", "state_dir": "/run/x", "mps_control": "/usr/bin/m",
            "mem_limit": "16G", "verify": "warn", "inventory": "sim:/p/%n.json",
            "plan": "/etc/gpushare/plan.yaml", "timeout": "2.5", "debug_log": "none",
            "imex_channels": "/dev/nvidia-caps-imex-channels", "verify_reuse": "0",
            "show": "yes", "mps_cgroup": "/sys/fs/cgroup/mps.slice/%n",
            "mps_space": "32m,1024", "usage_interval": "5", "hog_bw_pct": "70",
            "hog_seconds": "30", "dcgm_mapping_dir": "/run/dcgm-job-map/%n",
            "dcgm_mapping_names": "uuid", "prefork": "yes"}
    assert set(good) == {spec.key for spec in ARG_SPECS}
    config = parse_plugin_args(f"{k}={v}" for k, v in good.items())
    assert config.mem_limit == "16G" and config.verify == "warn"
    assert config.inventory == "sim:/p/%n.json" and config.timeout == 2.5
    assert config.debug_log == "" and config.show is True and config.verify_reuse == 0
    assert config.mps_dir == "/run/x/mps"
    assert config.for_node("n1").mps_cgroup == "/sys/fs/cgroup/mps.slice/n1"
    assert config.usage_interval == 5 and config.hog_bw_pct == 70 and config.hog_seconds == 30
    assert config.for_node("n1").dcgm_mapping_dir == "/run/dcgm-job-map/n1"
    assert config.dcgm_mapping_names == "uuid"
    for setting in ("auto", "systemd", "none"):
        assert parse_plugin_args([f"mps_cgroup={setting}"]).mps_cgroup == setting
    assert config.mps_space == "32M,1024" and mps_space_limits(config.mps_space) == (
        32 << 20, 1024)
    assert mps_space_limits(parse_plugin_args(["mps_space=shared"]).mps_space) is None


@pytest.mark.parametrize("arg, expected", [
    ("colour=blue", "unknown plugstack argument 'colour=blue'; accepted keys: pythonpath="),
    ("verify", "unknown plugstack argument 'verify'"),
    ("verify=maybe", "verify='maybe' is invalid: expected one of strict, warn, off"),
    ("usage_interval=0.5", "usage_interval='0.5' is invalid: expected seconds between 1 and"),
    ("hog_bw_pct=120", "hog_bw_pct='120' is invalid: expected a percentage between 1 and 100"),
    ("hog_seconds=soon", "hog_seconds='soon' is invalid: expected seconds between 0 and"),
    ("dcgm_mapping_dir=map", "dcgm_mapping_dir='map' is invalid: expected an absolute path"),
    ("dcgm_mapping_names=serial", "dcgm_mapping_names='serial' is invalid: expected one of"),
    ("state_dir=relative", "state_dir='relative' is invalid: expected an absolute path"),
    ("mps_cgroup=yes", "mps_cgroup='yes' is invalid: expected an absolute path"),
    ("mps_space=16M", "mps_space='16M' is invalid: expected shared, or SIZE,INODES"),
    ("mps_space=64K,4096", "mps_space='64K,4096' is invalid"),
    ("mps_space=16M,8", "mps_space='16M,8' is invalid"),
    ("mem_limit=lots", "mem_limit='lots' is invalid: expected a positive size"),
    ("mem_limit=0G", "mem_limit='0G' is invalid"),
    ("inventory=fake", "inventory='fake' is invalid: expected nvml, or sim:"),
    ("inventory=sim:rel.json", "inventory='sim:rel.json' is invalid"),
    ("timeout=0", "timeout='0' is invalid: expected a number of seconds between 0.1 and 600"),
    ("timeout=abc", "timeout='abc' is invalid"),
    ("show=maybe", "show='maybe' is invalid: expected one of yes, no"),
    ("verify_reuse=-1", "verify_reuse='-1' is invalid: expected a whole number of seconds "
                        "from 0 to 300"),
    ("verify_reuse=301", "verify_reuse='301' is invalid"),
])
def test_bad_arguments_name_the_key_and_what_is_accepted(arg, expected):
    with pytest.raises(ConfigError) as err:
        parse_plugin_args([arg])
    assert expected in str(err.value)


def test_all_problems_reported_at_once_and_duplicates_refused():
    with pytest.raises(ConfigError) as err:
        parse_plugin_args(["verify=x", "timeout=-1", "verify=off", "verify=warn"])
    text = str(err.value)
    assert "verify='x'" in text and "timeout='-1'" in text


def test_duplicate_key_is_an_error():
    with pytest.raises(ConfigError, match="given twice"):
        parse_plugin_args(["verify=off", "verify=warn"])


def test_sizes():
    assert parse_size("512M") == 512 << 20
    assert parse_size("16g") == 16 << 30
    assert parse_size("1024") == 1024
    with pytest.raises(ValueError):
        parse_size("-1G")


def test_plugstack_args_come_from_the_line_that_loads_gpushare(tmp_path):
    conf = tmp_path / "plugstack.conf"
    conf.write_text("# site plugins\n"
                    "optional /usr/lib64/slurm/other.so spank_gpushare.so=no\n"
                    "#required /usr/lib64/slurm/spank_gpushare.so state_dir=/old\n"
                    "required /usr/lib64/slurm/spank_gpushare.so state_dir=/run/gs "
                    "timeout=5 # trailing comment\n")
    assert plugstack_args(str(conf)) == ["state_dir=/run/gs", "timeout=5"]


def test_plugstack_args_follow_includes_relative_to_the_including_file(tmp_path):
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "10-other.conf").write_text("optional /x/other.so\n")
    (tmp_path / "plugstack.conf.d" / "20-gpushare.conf").write_text(
        "optional /usr/lib64/slurm/spank_gpushare.so verify=warn\n")
    (tmp_path / "plugstack.conf").write_text("include plugstack.conf.d/*.conf\n")
    assert plugstack_args(str(tmp_path / "plugstack.conf")) == ["verify=warn"]
    assert plugstack_line(str(tmp_path / "plugstack.conf")) == (
        str(tmp_path / "plugstack.conf.d" / "20-gpushare.conf"), ["verify=warn"])


def test_plugstack_without_gpushare_unreadable_or_looping(tmp_path):
    conf = tmp_path / "plugstack.conf"
    conf.write_text("required /x/other.so a=b\ninclude /nonexistent/*.conf\n")
    assert plugstack_args(str(conf)) is None
    with pytest.raises(ConfigError, match=r"cannot read .*missing.conf"):
        plugstack_args(str(tmp_path / "missing.conf"))
    conf.write_text(f"include {conf}\n")
    with pytest.raises(ConfigError, match="nested more than 8 deep"):
        plugstack_args(str(conf))


def test_default_plugstack_sits_beside_slurm_conf():
    assert beside_slurm_conf({}, "plugstack.conf") == "/etc/slurm/plugstack.conf"
    assert beside_slurm_conf({"SLURM_CONF": "/opt/slurm/etc/slurm.conf"}, "plugstack.conf") == \
        "/opt/slurm/etc/plugstack.conf"


def test_every_path_takes_the_node_name_and_host_name():
    """Several slurmd on one host (slurmd -N) each need their own state directory."""
    import os

    config = parse_plugin_args(["state_dir=/run/gs/%n", "debug_log=/var/log/gs-%h-%n.log",
                                "inventory=sim:/p/%n.json", "plan=/etc/gs/%n/plan.yaml",
                                "pythonpath=/opt/%n/py", "mps_control=/opt/%%n/mps"])
    host = os.uname().nodename.split(".")[0]
    node = config.for_node("gpu17")
    assert node.state_dir == "/run/gs/gpu17" and node.mps_dir == "/run/gs/gpu17/mps"
    assert node.debug_log == f"/var/log/gs-{host}-gpu17.log"
    assert node.inventory == "sim:/p/gpu17.json" and node.plan == "/etc/gs/gpu17/plan.yaml"
    assert node.pythonpath == "/opt/gpu17/py" and node.mps_control == "/opt/%n/mps"
    assert config.for_node("gpu17").verify == config.verify


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".hidden", "x" * 201])
def test_a_node_name_that_could_leave_its_directory_is_refused(name):
    config = parse_plugin_args(["state_dir=/run/gs/%n"])
    with pytest.raises(ValueError, match="not a plain host name"):
        config.for_node(name)


def test_an_unknown_percent_code_is_refused_with_the_ones_accepted():
    with pytest.raises(ConfigError, match=r"only %n \(node name\), %h \(host name\) and %%"):
        parse_plugin_args(["state_dir=/run/gs/%u"])
