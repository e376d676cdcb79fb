# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare usage``: one round from plugstack.conf's settings, and clear errors."""

import json
import os

from gpushare.cli import main

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"


def plugstack(node, extra: str = "") -> str:
    path = os.path.join(node.root, "plugstack.conf")
    node.write_profile()
    with open(path, "w") as f:
        f.write(f"required /usr/lib64/slurm/spank_gpushare.so state_dir={node.state} "
                f"inventory=sim:{node.profile_path} {extra}\n")
    return path


def test_one_round_from_the_plugstack_line(node, capsys):
    node.job(7, 1001, GPU0, 50, "/run/gs/mps/a/pipe")
    node.process(100, 1001, env={"CUDA_MPS_PIPE_DIRECTORY": "/run/gs/mps/a/pipe"})
    node.on_gpu(100, GPU0, 512, sm=20, mem_util=5)
    mapping = os.path.join(node.root, "dcgm")
    path = plugstack(node, f"usage_interval=5 dcgm_mapping_dir={mapping}")
    assert main(["usage", "--plugstack", path, "--node", "n1", "--proc-root", node.proc,
                 "--cgroup-root", node.cgroup]) == 0
    with open(os.path.join(node.state, "usage", "7.json")) as f:
        usage = json.load(f)
    assert usage["interval"] == 5 and usage["now"]["mem_bytes"] == 512 << 20
    with open(os.path.join(mapping, "0")) as f:
        assert f.read() == "7\n"


def test_a_bad_setting_is_named(node, capsys):
    path = plugstack(node, "hog_bw_pct=150")
    assert main(["usage", "--plugstack", path, "--node", "n1"]) == 2
    err = capsys.readouterr().err
    assert "hog_bw_pct='150' is invalid: expected a percentage between 1 and 100" in err


def test_nvml_that_cannot_start_is_said(node, capsys):
    node.profile["errors"] = {"nvmlInit": "DRIVER_NOT_LOADED"}
    path = plugstack(node)
    assert main(["usage", "--plugstack", path, "--node", "n1"]) == 2
    assert "the NVIDIA kernel driver is not loaded" in capsys.readouterr().err
