# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare job``: the task environment read back, and the daemon probe against the stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from gpushare.cli import main
from gpushare.cli.job import DaemonProbe, format_view, job_view, probe_daemon
from mps_standin.harness import install_standin

SHARED_ENV = {
    "SLURM_JOB_ID": "42",
    "SLURMD_NODENAME": "n1",
    "SLURM_STEP_GPUS": "3",
    "CUDA_VISIBLE_DEVICES": "0",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20389M",
    "CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/u1001-GPU-abc/pipe",
    "CUDA_MPS_LOG_DIRECTORY": "/run/gpushare/mps/u1001-GPU-abc/log",
}


def test_shared_job_is_read_from_the_task_environment():
    view = job_view(SHARED_ENV)
    assert view.job_id == 42
    assert view.node == "n1"
    assert view.node_gpus == ["3"]
    assert view.visible_devices == "0"
    assert view.mps == "shared"
    assert view.share_percent == 25
    assert view.pinned_mem_limit == {"0": "20389M"}
    assert view.pipe_dir.endswith("/pipe") and view.log_dir.endswith("/log")
    assert view.problems == []


def test_private_job_is_recognised_by_its_daemon_key():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
           "CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/job7/pipe",
           "CUDA_MPS_LOG_DIRECTORY": "/run/gpushare/mps/job7/log"}
    view = job_view(env)
    assert view.mps == "private"
    assert view.share_percent is None
    assert view.node_gpus == ["0", "1"]
    text = format_view(view, DaemonProbe("answers", [99]))
    assert "private MPS daemon" in text
    assert "MPS servers: 99" in text


def test_daemon_without_servers_is_said_in_full():
    text = format_view(job_view(SHARED_ENV), DaemonProbe("answers", []))
    assert text.splitlines()[-1].endswith(
        "answers; MPS servers: none yet (one starts with the first CUDA client)")


def test_plain_gpu_job_has_no_mps():
    view = job_view({"SLURM_JOB_ID": "8", "GPU_DEVICE_ORDINAL": "2",
                     "CUDA_VISIBLE_DEVICES": "2"})
    assert view.mps == "none"
    probe = probe_daemon(view, "/nonexistent/mps-control", 1.0)
    assert probe.status == "not-asked"
    assert "whole GPUs, no MPS" in format_view(view, probe)


def test_share_without_daemon_and_bad_values_are_reported():
    view = job_view({"SLURM_JOB_ID": "9", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                     "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G,garbage"})
    assert view.share_percent == 30
    assert view.pinned_mem_limit == {"0": "1G"}
    assert any("not enforced by MPS" in p for p in view.problems)
    assert any("'garbage'" in p for p in view.problems)
    bad = job_view({"SLURM_JOB_ID": "9", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "250"})
    assert bad.share_percent is None
    assert any("250" in p for p in bad.problems)


def test_outside_a_job_says_how_to_run_it(capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["job"]) == 1
    err = capsys.readouterr().err
    assert "not inside a Slurm job" in err and "srun" in err


def test_bad_timeout_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    assert main(["job", "--timeout", "0"]) == 2
    assert "--timeout" in capsys.readouterr().err


def _script(path, body: str) -> str:
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return str(path)


def test_missing_program_is_named(tmp_path):
    probe = probe_daemon(job_view(SHARED_ENV), str(tmp_path / "missing"), 1.0)
    assert probe.status == "no-program"
    assert "--mps-control" in probe.detail


def test_hanging_program_times_out(tmp_path):
    program = _script(tmp_path / "hang", "exec sleep 30")
    started = time.monotonic()
    probe = probe_daemon(job_view(SHARED_ENV), program, 0.5)
    assert probe.status == "timeout"
    assert time.monotonic() - started < 10


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """The stand-in program (client, daemon and servers), built once for this module."""
    return install_standin(str(tmp_path_factory.mktemp("standin")))


def test_daemon_not_running_is_no_answer(tmp_path, standin):
    env = dict(SHARED_ENV, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "pipe"),
               CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "log"))
    probe = probe_daemon(job_view(env), standin, 10.0)
    assert probe.status == "no-answer"
    assert "Cannot find MPS control daemon" in probe.detail


@pytest.fixture
def standin_daemon(tmp_path, standin):
    """A stand-in control daemon (as this user) on a private pipe directory."""
    pipe, log = tmp_path / "u1-GPU-x" / "pipe", tmp_path / "u1-GPU-x" / "log"
    pipe.mkdir(parents=True)
    log.mkdir()
    env = {"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_LOG_DIRECTORY": str(log), "CUDA_VISIBLE_DEVICES": "GPU-standin-0"}
    subprocess.run([standin, "-d"], env=env, check=True, timeout=20)
    deadline = time.monotonic() + 10
    while not (pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield env
    finally:
        subprocess.run([standin], input="quit\n", env=env, text=True, timeout=20,
                       capture_output=True)


def test_running_daemon_answers_with_its_servers(standin_daemon, tmp_path, standin):
    env = dict(SHARED_ENV, **{k: standin_daemon[k] for k in
                              ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")})
    view = job_view(env)
    assert probe_daemon(view, standin, 10.0) == DaemonProbe("answers", [], "")
    started = subprocess.run([standin], input=f"start_server -uid {os.getuid()}\n",
                             env=standin_daemon, text=True, capture_output=True, timeout=20)
    server = int(started.stdout.split()[0])
    assert probe_daemon(view, standin, 10.0).servers == [server]


def test_cli_json_and_text(standin_daemon, monkeypatch, capsys, standin):
    for key, value in SHARED_ENV.items():
        monkeypatch.setenv(key, value)
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.setenv(key, standin_daemon[key])
    monkeypatch.delenv("SLURM_JOB_GPUS", raising=False)
    assert main(["job", "--json", "--mps-control", standin]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"]["job_id"] == 42
    assert data["job"]["share_percent"] == 25
    assert data["job"]["pinned_mem_limit"] == {"0": "20389M"}
    assert data["daemon"]["status"] == "answers"
    assert main(["job", "--mps-control", standin]) == 0
    text = capsys.readouterr().out
    assert "25% of its SMs" in text
    assert "device 0: 20389M" in text
    assert "MPS daemon            answers" in text
    # The daemon gone: the command says so and fails.
    subprocess.run([standin], input="quit\n", env=standin_daemon, text=True, timeout=20,
                   capture_output=True)
    assert main(["job", "--mps-control", standin]) == 1
    assert "does not answer (no-answer)" in capsys.readouterr().out


def test_the_control_program_comes_from_the_plugins_own_line(standin_daemon, monkeypatch,
                                                              capsys, standin, tmp_path):
    """A node whose MPS tools are not in /usr/bin: the command asks the plugin's program."""
    (tmp_path / "plugstack.conf").write_text(
        f"required /usr/lib64/slurm/spank_gpushare.so mps_control={standin}\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    for key, value in SHARED_ENV.items():
        monkeypatch.setenv(key, value)
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.setenv(key, standin_daemon[key])
    assert main(["job", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["daemon"]["status"] == "answers"
    (tmp_path / "plugstack.conf").write_text(
        "required /usr/lib64/slurm/spank_gpushare.so mps_control=relative\n")
    assert main(["job"]) == 2
    assert "mps_control='relative' is invalid" in capsys.readouterr().err


def test_mps_job_learns_its_gpu_from_gpushare():
    # Slurm gives an mps job's tasks no SLURM_*_GPUS; the prolog's GPUSHARE_GPUS names it.
    env = {k: v for k, v in SHARED_ENV.items() if k != "SLURM_STEP_GPUS"}
    assert job_view(env).node_gpus == []
    assert job_view(dict(env, GPUSHARE_GPUS="3")).node_gpus == ["3"]


def test_gpu_uuids_from_env_uuid_are_not_taken_for_indices():
    # Slurm 26.05's gres.conf Flags=env_uuid: CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL
    # name the GPUs by UUID, SLURM_*_GPUS stay the node's indices.
    uuids = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,GPU-f9e8d7c6-b5a4-3210-fedc-ba9876543210"
    env = {"SLURM_JOB_ID": "8", "GPU_DEVICE_ORDINAL": uuids, "CUDA_VISIBLE_DEVICES": uuids}
    view = job_view(env)
    assert view.node_gpus == []
    assert view.visible_devices == uuids
    assert job_view(dict(env, SLURM_STEP_GPUS="2,5")).node_gpus == ["2", "5"]


def test_an_array_task_is_not_read_as_another_job(tmp_path, capsys, monkeypatch):
    """int("10_3") is 103: the task's own job id comes from squeue instead."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    squeue = tmp_path / "squeue"
    squeue.write_text('#!/bin/sh\n[ "$*" = "--noheader --jobs 10_3 --format %A" ] && '
                      'echo 13 && exit 0\n'
                      'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    squeue.chmod(0o755)
    state = tmp_path / "state"
    (state / "usage").mkdir(parents=True)
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text(f"required spank_gpushare.so state_dir={state}\n")
    args = ["job", "--squeue", str(squeue), "--plugstack", str(plugstack), "--node", "n1"]
    main([*args, "10_3"])
    out = capsys.readouterr()
    # --node names the node whose usage files were read, not the host asked from.
    assert "13 (10_3) on n1" in out.out and "103" not in out.out, out
    assert main([*args, "10_4"]) == 2
    assert "squeue knows no running or pending array task 10_4" in capsys.readouterr().err
    for bad in ("1_0_3", "12a", "_3", "3_", "１２", " 12"):
        with pytest.raises(SystemExit):
            main([*args, bad])
        assert "is not a job id" in capsys.readouterr().err


def test_a_slurm_command_without_slurmdbd_is_told_so(tmp_path):
    """Not "is slurmctld up?" when slurmctld is up and only accounting is missing."""
    from gpushare.admin.slurm_client import SlurmClientError, run_slurm

    sacct = tmp_path / "sacct"
    sacct.write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n")
    sacct.chmod(0o755)
    with pytest.raises(SlurmClientError, match=r"accounting storage is disabled; this needs "
                       r"slurmdbd \(slurm.conf AccountingStorageType="):
        run_slurm([str(sacct)], 10.0)
