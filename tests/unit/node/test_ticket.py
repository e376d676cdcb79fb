# SPDX-License-Identifier: GPL-2.0-or-later
"""The join ticket a shared prolog leaves for the C glue: its name, conditions and template.
(That the C glue honours them is shown on the real Slurm: tests/slurm/test_mps.py.)"""

import json
import os

import pytest

from gpushare.node import ticket
from gpushare.node.state import JobRecord

ENV = {"SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "3",
       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "SLURM_CONF": "/etc/slurm/slurm.conf",
       "SLURMD_NODENAME": "n1", "HOME": "/root"}


def test_the_name_says_user_gpus_and_share_and_nothing_else():
    assert ticket.name(1001, ENV) == "u1001.g3.s25"
    assert ticket.name(1001, {**ENV, "SLURM_JOB_GPUS": "0,1"}) == "u1001.g0_1.s25"
    for bad in ({"SLURM_JOB_GPUS": ""}, {"SLURM_JOB_GPUS": "../x"},
                {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": ""},
                {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "2500"},
                {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25%"}):
        assert ticket.name(1001, {**ENV, **bad}) is None, bad


def test_a_file_is_stamped_as_it_is_or_noted_absent(tmp_path):
    present = tmp_path / "gres.conf"
    present.write_text("Name=gpu File=/dev/nvidia0\n")
    st = os.stat(present)
    lines = ticket.file_lines([str(present), str(tmp_path / "none")])
    assert lines == [f"file {st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {present}",
                     f"nofile {tmp_path / 'none'}"]


def _record(job_id: int = 4711) -> JobRecord:
    record = JobRecord(job_id=job_id, uid=1001, gid=1001, node="n1", mode="shared",
                       share_percent=25, slurm_gpus=["3"], visible_devices=["3"],
                       devices=[{"uuid": "GPU-1", "index": 3}], created=1700000000.5)
    record.mps = {"job_id": job_id, "key": "u1001-GPU-1", "pipe_dir": "/run/gpushare/mps/p"}
    record.env = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                  "CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/p"}
    return record


def _render(**changes) -> str:
    arguments = dict(key="u1001-GPU-1", until=1700000060.25, uid=1001, gid=1001, share=25,
                     args=["state_dir=/run/gpushare", "verify=strict"], env=ENV,
                     options={"gpu-share": "25"}, files=["nofile /etc/plan.yaml"],
                     daemon="4242 987654", record_stamp="1 2 3 4", record=_record(),
                     show=f"gpushare: job {ticket.JOB_ID_MARK}: 25% of the GPU's SMs")
    arguments.update(changes)
    return ticket.render(**arguments).decode()


def test_the_conditions_come_first_one_per_line():
    head = _render().split("\n--record\n")[0].splitlines()
    assert head == [
        "gpushare-ticket 1", "key u1001-GPU-1", "until 1700000060.250000", "uid 1001",
        "gid 1001", "share 25", "arg state_dir=/run/gpushare", "arg verify=strict",
        "env SLURM_JOB_GPUS=3", "env CUDA_VISIBLE_DEVICES=3",
        "env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "env SLURM_CONF=/etc/slurm/slurm.conf",
        "env SLURMD_NODENAME=n1", "opt gpu-share=25", "noopt gpu-mps",
        "nofile /etc/plan.yaml", "daemon 4242 987654", "record 1 2 3 4"]
    # An unset variable must be unset (or empty) for the next job too.
    assert "env CUDA_VISIBLE_DEVICES=" in _render(env={**ENV, "CUDA_VISIBLE_DEVICES": ""})
    assert "noopt gpu-share" in _render(options={})


def test_the_record_and_environment_carry_marks_for_the_job_id_and_time():
    text = _render()
    record_text, env_text = text.split("\n--record\n", 1)[1].split("\n--env\n")
    assert "4711" not in text and "4242424242" not in text
    filled = json.loads(record_text.replace(f'"{ticket.JOB_ID_MARK}"', "9")
                        .replace(ticket.JOB_ID_MARK, "9")
                        .replace(ticket.CREATED_MARK, "1700000100.5"))
    expected = _record(9).to_dict()
    assert filled == {**expected, "created": 1700000100.5}
    assert env_text == _record().to_env_file(
        f"gpushare: job {ticket.JOB_ID_MARK}: 25% of the GPU's SMs")
    assert f"#show=gpushare: job {ticket.JOB_ID_MARK}: 25%" in env_text


def test_a_value_with_a_newline_makes_no_ticket():
    with pytest.raises(ValueError, match="newline"):
        _render(args=["plan=/etc/a\nkey other"])

