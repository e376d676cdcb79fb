# SPDX-License-Identifier: GPL-2.0-or-later
"""gres.conf parsing: Slurm's per-node device order and indices, and line-numbered errors."""

from __future__ import annotations

import os

import pytest

from gpushare.gpu.gresconf import GresConfError, load_gres_conf, parse_gres_conf, slurm_gpu_type
from gpushare.gpu.inventory import open_inventory

PROFILE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src",
                                           "gpushare", "gpu", "profiles"))

CONF = """\
# mixed node
AutoDetect=off
NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia[2-3]   # whole GPUs
nodename=gpu[01-02] name=gpu type=1g.10gb \\
    MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[66-67]
NodeName=gpu03 Name=gpu Type=l40s File=/dev/nvidia[0-3] Flags=nvidia_gpu_env Cores=0-15
Name=mps Count=300
NodeName=gpu03 Name=shard Count=8 File=/dev/nvidia[0-1]
"""


def test_devices_per_node_in_slurm_index_order():
    conf = parse_gres_conf(CONF, "/etc/slurm/gres.conf")
    gpus = conf.devices("gpu02")
    assert [(d.slurm_index, d.type, d.files, d.line) for d in gpus] == [
        (0, "a100", ["/dev/nvidia2"], 3),
        (1, "a100", ["/dev/nvidia3"], 3),
        (2, "1g.10gb", ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap66",
                        "/dev/nvidia-caps/nvidia-cap67"], 4),
    ]
    l40s = conf.devices("gpu03")
    assert [d.files for d in l40s] == [[f"/dev/nvidia{i}"] for i in range(4)]
    assert l40s[0].flags == ["nvidia_gpu_env"]
    assert conf.devices("other") == []


def test_mps_without_file_is_split_over_the_gpus():
    conf = parse_gres_conf(CONF)
    mps = conf.devices("gpu01", "mps")
    assert [(d.slurm_index, d.gres_count, d.files[0]) for d in mps] == [
        (0, 100, "/dev/nvidia2"), (1, 100, "/dev/nvidia3"), (2, 100, "/dev/nvidia0")]
    four = conf.devices("gpu03", "mps")
    assert [d.gres_count for d in four] == [75, 75, 75, 75]
    none = parse_gres_conf("Name=mps Count=100\n").devices("x", "mps")
    assert [(d.gres_count, d.files) for d in none] == [(100, [])]


def test_shared_gres_with_files_splits_count_per_file():
    conf = parse_gres_conf(CONF)
    shards = conf.devices("gpu03", "shard")
    assert [(d.slurm_index, d.gres_count, d.files) for d in shards] == [
        (0, 4, ["/dev/nvidia0"]), (1, 4, ["/dev/nvidia1"])]
    uneven = parse_gres_conf("Name=mps Count=7 File=/dev/nvidia[0-1]\n").devices("n", "mps")
    assert [d.gres_count for d in uneven] == [4, 3]


def test_count_suffixes_and_autodetect_scoping():
    conf = parse_gres_conf("AutoDetect=nvml\nNodeName=b AutoDetect=off\nName=mps Count=1K\n")
    assert conf.autodetect("a") == "nvml" and conf.autodetect("b") == "off"
    assert conf.lines[2].gres_count == 1024
    assert parse_gres_conf("").autodetect("a") == ""


def test_autodetect_builds_devices_from_the_inventory():
    inv = open_inventory("sim:" + os.path.join(PROFILE_DIR, "a100-mig-mixed.json"))
    conf = parse_gres_conf("AutoDetect=nvml\nName=mps Count=200\n")
    gpus = conf.devices("n", "gpu", inv)
    # GPU 0: 7 slices, GPU 1: 3 slices, GPUs 2 and 3 whole
    assert len(gpus) == 12
    assert gpus[0].type == "nvidia_a100_1g.10gb"
    assert gpus[7].type == "nvidia_a100_3g.40gb"
    assert gpus[7].files == ["/dev/nvidia1", *inv.gpus[1].mig_devices[0].caps_files]
    assert gpus[10].type == "nvidia_a100-sxm4-80gb" and gpus[10].files == ["/dev/nvidia2"]
    assert [d.slurm_index for d in gpus] == list(range(12))
    assert len(conf.devices("n", "mps", inv)) == 12
    # without an inventory only explicit lines count
    assert conf.devices("n", "gpu") == []


def test_slurm_gpu_type_names():
    assert slurm_gpu_type("NVIDIA A100-SXM4-40GB", "3g.20gb") == "nvidia_a100_3g.20gb"
    assert slurm_gpu_type("NVIDIA H100 80GB HBM3", "1g.10gb") == "nvidia_h100_80gb_hbm3_1g.10gb"
    assert slurm_gpu_type("NVIDIA L40S") == "nvidia_l40s"


@pytest.mark.parametrize("text,line,message", [
    ("Name=gpu File=/dev/nvidia0\nName=gpu Bogus=1\n", 2, "unknown gres.conf word 'Bogus=1'"),
    ("Name=gpu File=/dev/nvidia0\n\n# c\nName=gpu File=/dev/nvidia[0-\n", 4,
     "bad host or file range"),
    ("Name=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia1\n", 1,
     "File= and MultipleFiles= cannot both be given"),
    ("Name=gpu Count=3 File=/dev/nvidia[0-1]\n", 1, "Count=3 but File= names 2 device file(s)"),
    ("Name=mps Count=lots\n", 1, "Count=lots is invalid"),
    ("AutoDetect=magic\n", 1, "AutoDetect=magic is not one of"),
    ("Name=gpu File=nvidia0\n", 1, "device file 'nvidia0' is not an absolute path"),
    ("Type=a100 File=/dev/nvidia0\n", 1, "needs Name="),
    ("NodeName=a\n", 1, "says nothing"),
    ("Name=gpu Name=mps\n", 1, "Name= given twice"),
    ("Name=gpu Flags=fast File=/dev/nvidia0\n", 1, "unknown Flags value 'fast'"),
    ("Name=gpu Type=\n", 1, "Type= has no value"),
    ("Name=gpu NodeName=n[1-2 File=/dev/nvidia0\n", 1, "bad host or file range"),
    ("Name=gpu Count=2 MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap3\n", 1,
     "MultipleFiles= describes one device"),
    ("\\\n  Name=gpu \\\n  Wrong\n", 1, "unknown gres.conf word 'Wrong'"),
])
def test_bad_lines_name_the_file_and_line(text, line, message):
    with pytest.raises(GresConfError) as err:
        parse_gres_conf(text, "/etc/slurm/gres.conf")
    assert str(err.value).startswith(f"/etc/slurm/gres.conf:{line}: ")
    assert message in str(err.value)


def test_load_gres_conf(tmp_path):
    path = tmp_path / "gres.conf"
    path.write_text(CONF)
    assert len(load_gres_conf(str(path)).devices("gpu01")) == 3
    with pytest.raises(GresConfError, match="cannot read"):
        load_gres_conf(str(tmp_path / "missing"))
