# SPDX-License-Identifier: GPL-2.0-or-later
"""A GRES device that is no NVIDIA GPU (another vendor's GPU, Slurm's test layout
``File=/dev/tty0``): jobs on it, whole or shared, are left to Slurm with a warning."""

from __future__ import annotations

import os

import pytest

from gpushare.gpu.gresconf import parse_gres_conf
from gpushare.gpu.inventory import open_inventory
from gpushare.node.verify import verify_job_devices

PROFILE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src",
                                       "gpushare", "gpu", "profiles", "h100-8x-nvswitch.json"))
TTY0 = parse_gres_conf("AutoDetect=off\nName=gpu File=/dev/tty0\nName=mps Count=100\n",
                       "/etc/slurm/gres.conf")


@pytest.fixture(scope="module")
def inv():
    return open_inventory("sim:" + PROFILE)


def test_whole_device_that_is_no_nvidia_gpu_is_a_warning(inv):
    result = verify_job_devices({"SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}, "n1",
                                TTY0, inv)
    assert result.ok and result.devices == [] and result.reason() == ""
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.what == ("GRES gpu index 0 (/dev/tty0) is not an NVIDIA GPU (no "
                            "/dev/nvidiaN file); gpushare neither verifies nor shares it")
    assert finding.where == "node n1, /etc/slurm/gres.conf:2"
    assert result.not_nvidia == [0]


def test_mps_on_a_device_that_is_no_nvidia_gpu_is_a_warning(inv):
    """gres.conf says what the device is, so the node is not wrong: no error, no drain."""
    env = {"SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    result = verify_job_devices(env, "n1", TTY0, inv)
    assert result.ok and result.devices == [] and result.reason() == ""
    assert result.not_nvidia == [0]
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.what == ("GRES mps index 0 (/dev/tty0) is not an NVIDIA GPU (no "
                            "/dev/nvidiaN file), so gpushare cannot run MPS on it and leaves "
                            "the job's share to Slurm")
    assert finding.where == "node n1, /etc/slurm/gres.conf:3"
    assert "File=/dev/nvidiaN" in finding.fix


def test_nvidia_files_that_are_no_gpu_still_fail(inv):
    """Only a device without any NVIDIA file is another vendor's: /dev/nvidiactl alone is a
    gres.conf mistake on an NVIDIA node, as before."""
    conf = parse_gres_conf("Name=gpu File=/dev/nvidiactl\n", "/etc/slurm/gres.conf")
    result = verify_job_devices({"SLURM_JOB_GPUS": "0"}, "n1", conf, inv)
    assert "names 0 GPU device files" in result.reason()
    assert result.not_nvidia == []
