# SPDX-License-Identifier: GPL-2.0-or-later
"""The job-level decisions of job_prolog: mode, share, refusals, the task's environment."""

import os

import pytest

from gpushare.node import job, reaper
from gpushare.node import request as job_request
from gpushare.node.state import JobRecord


def request(**extra):
    values = dict(job_id=7, uid=1001, gid=1001, node="n1", env={})
    values.update(extra)
    return job_request.JobRequest(**values)


def test_mps_job_gets_slurms_share_on_device_zero():
    rec = job_request.plan_job(request(env={"SLURM_JOB_GPUS": "3",
                                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}))
    assert rec.mode == "shared" and rec.share_percent == 50 and rec.slurm_gpus == ["3"]
    assert rec.env == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
                       "GPUSHARE_GPUS": "3"}


def test_gpu_share_must_agree_with_slurms_share_as_the_hooks_require():
    env = {"SLURM_JOB_GPUS": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    assert job_request.plan_job(request(gpu_share="50", env=env)).share_percent == 50
    for other in ("20", "80"):
        with pytest.raises(job_request.UserError, match="ask for different shares"):
            job_request.plan_job(request(gpu_share=other, env=env))


@pytest.mark.parametrize("asked,units", [(33, 150), (25, 100), (1, 400), (99, 700), (67, 1000),
                                         (51, 333)])
def test_gpu_share_agrees_with_the_hooks_rounding_into_mps_units(asked, units):
    count = asked * units // 100  # what the submit hooks ask for
    granted = count * 100 // units  # what Slurm's gres/mps hands the job
    env = {"SLURM_JOB_GPUS": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(granted)}
    assert job_request.plan_job(request(gpu_share=str(asked), env=env)).share_percent == granted


def test_gpu_share_beside_whole_gpus_is_refused_as_the_hooks_do():
    with pytest.raises(job_request.UserError, match="cannot be combined with whole GPUs"):
        job_request.plan_job(request(gpu_share="25", env={"SLURM_JOB_GPUS": "0"}))


@pytest.mark.parametrize("extra", [dict(gpu_share="25"), dict()])
def test_roots_shared_job_is_planned_as_anyones(extra):
    """Slurm's own MPS tests run as root: root's share gets its own daemon (of root's,
    reachable by root alone) like any user's."""
    env = {"SLURM_JOB_GPUS": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    rec = job_request.plan_job(request(uid=0, gid=0, env=env, **extra))
    assert (rec.uid, rec.mode, rec.share_percent, rec.error) == (0, "shared", 25, "")


@pytest.mark.parametrize("value", ["0", "101", "abc", "", "-5", "2.5"])
def test_bad_share_on_the_node_is_a_user_error(value):
    with pytest.raises(job_request.UserError, match="from 1 to 100"):
        job_request.plan_job(request(gpu_share=value, env={"SLURM_JOB_GPUS": "0"}))


def test_share_without_a_gpu_says_what_to_type():
    with pytest.raises(job_request.UserError, match=r"Ask --gres=mps:25"):
        job_request.plan_job(request(gpu_share="25"))


def test_share_over_two_gpus_is_refused():
    with pytest.raises(job_request.UserError, match="a share runs on one GPU"):
        job_request.plan_job(request(env={"SLURM_JOB_GPUS": "0,1",
                                  "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}))


def test_private_mps_needs_whole_gpus_and_no_share():
    rec = job_request.plan_job(request(private_mps=True, env={"SLURM_JOB_GPUS": "2,3"}))
    assert rec.mode == "private"
    assert rec.env == {"CUDA_VISIBLE_DEVICES": "0,1", "GPUSHARE_GPUS": "2,3"}
    with pytest.raises(job_request.UserError, match="cannot be combined with a share"):
        job_request.plan_job(request(private_mps=True, gpu_share="50", env={"SLURM_JOB_GPUS": "0"}))
    with pytest.raises(job_request.UserError, match="add --gres=gpu:N"):
        job_request.plan_job(request(private_mps=True))


def test_task_learns_which_gpus_it_shares():
    rec = job_request.plan_job(request(env={"SLURM_JOB_GPUS": "5",
                                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}))
    rec.devices = [{"uuid": "GPU-abc"}]
    env = job_request.task_environment(rec)
    assert env["GPUSHARE_GPUS"] == "5" and env["GPUSHARE_GPU_UUIDS"] == "GPU-abc"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


def test_lease_environment_wins():
    rec = JobRecord(job_id=1, uid=1, gid=1, node="n", mode="shared", share_percent=25,
                    slurm_gpus=["0"], mps={"env": {"CUDA_MPS_PIPE_DIRECTORY": "/p",
                                                   "CUDA_VISIBLE_DEVICES": "0"}})
    env = job_request.task_environment(rec)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/p"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_jobs_without_sharing_leave_their_tasks_only_an_empty_environment(tmp_path):
    """No record (the epilog has nothing to undo), only the word the tasks wait for."""
    from gpushare.node.config import parse_plugin_args
    from gpushare.node.state import JobStore

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    assert job.prolog(config, request(env={"SLURM_JOB_GPUS": "0"})) is None
    store = JobStore(config.state_dir)
    assert store.read(7) is None
    assert sorted(os.listdir(store.jobs_dir)) == ["7.env"]
    with open(store.path(7, ".env")) as handle:
        assert handle.read() == ""


def test_user_error_is_recorded_not_raised(tmp_path):
    from gpushare.node.config import parse_plugin_args
    from gpushare.node.state import JobStore

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    rec = job.prolog(config, request(gpu_share="25"))
    assert rec is not None and "got no GPU" in rec.error
    assert JobStore(config.state_dir).read(7).error == rec.error
    job.epilog(config, 7)
    assert JobStore(config.state_dir).read(7) is None


def test_gres_conf_is_found_next_to_slurm_conf():
    assert job.gres_conf_path({"SLURM_CONF": "/x/etc/slurm.conf"}) == "/x/etc/gres.conf"
    assert job.gres_conf_path({}) == "/etc/slurm/gres.conf"


def test_describe_is_one_line():
    line = job.describe({"CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G"}, 9)
    assert line == ("gpushare: job 9: CUDA_VISIBLE_DEVICES=0, 25% of the GPU's SMs, "
                    "pinned memory 0=20G")


def test_epilog_hands_the_leases_daemon_to_release_and_survives_a_bad_record(tmp_path,
                                                                            monkeypatch):
    from gpushare.node.config import parse_plugin_args
    from gpushare.node.mps import MpsManager
    from gpushare.node.state import JobStore

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    hints = []
    monkeypatch.setattr(MpsManager, "release",
                        lambda self, job_id, hint=None: hints.append((job_id, hint)) or [])
    store = JobStore(config.state_dir)
    store.write(JobRecord(job_id=7, uid=1001, gid=1001, node="n1", mode="shared",
                          share_percent=25, mps={"key": "u1001-GPU-x"}))
    job.epilog(config, 7)
    assert hints == [(7, "u1001-GPU-x")] and store.read(7) is None

    with open(store.path(8), "w") as handle:
        handle.write("[not a record")
    job.epilog(config, 8)  # the shortcut is lost, the release is not
    assert hints[-1] == (8, None) and store.read(8) is None


def _fake_squeue(tmp_path, output: str, status: int = 0):
    """A squeue that prints ``output``, exits ``status`` and logs each call's arguments."""
    calls = tmp_path / "squeue-calls"
    script = tmp_path / "squeue"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nprintf '{output}'\nexit {status}\n")
    script.chmod(0o755)
    return str(script), calls


def _records(config, *job_ids):
    from gpushare.node.state import JobStore

    store = JobStore(config.state_dir)
    for job_id in job_ids:
        store.write(JobRecord(job_id=job_id, uid=1001, gid=1001, node="n1", mode="shared",
                              share_percent=25, slurm_gpus=["0"]))
    return store


def test_jobs_slurmctld_no_longer_runs_here_are_lost(tmp_path):
    from gpushare.node.config import parse_plugin_args

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    store = _records(config, 11, 12, 13, 14)
    squeue, calls = _fake_squeue(tmp_path, "12\\n14\\n99\\n")
    assert reaper.lost_jobs(config, store, "n1", exclude={14}, force=True,
                            squeue=squeue) == {11, 13}
    args = calls.read_text().split()
    assert "--nodelist=n1" in args and "--format=%A" in args
    assert any(a.startswith("--states=") and "COMPLETING" in a for a in args)


def test_a_jobs_files_without_its_record_are_reaped_once_slurmctld_no_longer_runs_it(
        tmp_path):
    """A prolog that failed before the job's record leaves only the tasks' file and the job's
    lock; if its epilog never runs, or cannot undo the job (a plugstack line or a state
    directory it refuses), nothing but the reap of lost jobs would ever remove them."""
    from gpushare.node.config import parse_plugin_args

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    store = _records(config, 11)
    store.write_unshared(12)  # a job that shares nothing, still running
    store.write_unshared(13)  # a prolog's word for its tasks, its epilog lost
    for job_id in (11, 12, 13, 14):  # 14: a prolog that failed before any word
        open(store.path(job_id, ".lock"), "a").close()
    with open(store.path(15, ".env") + ".99.tmp", "w"):
        pass  # a write in progress is no job's file
    assert store.leftover_ids() == [12, 13, 14]
    squeue, _calls = _fake_squeue(tmp_path, "11\\n12\\n")
    lost = reaper.lost_jobs(config, store, "n1", force=True, squeue=squeue)
    assert lost == {13, 14}
    reaper.forget(store, lost)
    assert sorted(os.listdir(store.jobs_dir)) == ["11.env", "11.json", "11.lock", "12.env",
                                                  "12.lock", "15.env.99.tmp"]


@pytest.mark.parametrize("output, status", [("", 1), ("12 oops\\n", 0)])
def test_nothing_is_lost_when_slurmctld_cannot_answer(tmp_path, output, status):
    from gpushare.node.config import parse_plugin_args

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    store = _records(config, 11, 12)
    squeue, _calls = _fake_squeue(tmp_path, output, status)
    assert reaper.lost_jobs(config, store, "n1", force=True, squeue=squeue) == set()
    missing = str(tmp_path / "no-squeue")
    assert reaper.lost_jobs(config, store, "n1", force=True, squeue=missing) == set()


def test_a_prolog_asks_slurmctld_at_most_once_per_interval(tmp_path, monkeypatch):
    from gpushare.node.config import parse_plugin_args

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    store = _records(config, 11, 12)
    squeue, calls = _fake_squeue(tmp_path, "12\\n")
    assert reaper.lost_jobs(config, store, "n1", squeue=squeue) == {11}
    assert reaper.lost_jobs(config, store, "n1", squeue=squeue) == set()  # asked just now
    assert len(calls.read_text().splitlines()) == 1
    checked = tmp_path / "s" / "slurm-checked"
    old = checked.stat().st_mtime - reaper.SLURM_CHECK_INTERVAL - 1
    os.utime(checked, (old, old))
    assert reaper.lost_jobs(config, store, "n1", squeue=squeue) == {11}
    assert len(calls.read_text().splitlines()) == 2
    # No record but the job's own: slurmctld is not asked at all, none can be lost, and
    # that is noted as if it had answered (the tickets the prolog leaves are dated by it).
    store.remove(11)
    store.remove(12)
    os.utime(checked, (old, old))
    assert reaper.lost_jobs(config, _records(config, 20), "n1", exclude={20},
                         squeue=squeue) == set()
    assert len(calls.read_text().splitlines()) == 2
    noted = checked.stat().st_mtime
    assert noted > old + reaper.SLURM_CHECK_INTERVAL
    # Within the interval it is left as it is: a ticket's stamp of it stays good.
    assert reaper.lost_jobs(config, store, "n1", exclude={20}, squeue=squeue) == set()
    assert checked.stat().st_mtime == noted


def test_a_slow_slurmctld_delays_a_prolog_at_most_the_check_timeout(tmp_path, monkeypatch):
    from gpushare.node.config import parse_plugin_args

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off", "timeout=30"])
    store = _records(config, 11)
    script = tmp_path / "squeue"
    script.write_text("#!/bin/sh\nsleep 3\necho 99\n")  # would make job 11 lost
    script.chmod(0o755)
    monkeypatch.setattr(reaper, "SLURM_CHECK_TIMEOUT", 0.2)
    assert reaper.lost_jobs(config, store, "n1", force=True, squeue=str(script)) == set()


def test_roots_shared_job_has_its_devices_checked_as_anyones(tmp_path):
    """A device the check fails (here: no inventory at all) is the node's fault for root's
    shared job too."""
    from gpushare.node.config import parse_plugin_args

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=strict",
                                "inventory=sim:/nonexistent/profile.json"])
    env = {"SLURM_JOB_GPUS": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    for uid in (0, 1000):
        with pytest.raises(job.NodeError):
            job.prolog(config, request(uid=uid, gid=uid, env=env))


@pytest.mark.parametrize("verify", ["strict", "off"])
@pytest.mark.parametrize("extra", [dict(), dict(gpu_share="50")])
def test_a_share_of_a_device_that_is_no_nvidia_gpu_is_left_to_slurm(tmp_path, verify, extra):
    """Slurm's own MPS tests give gres/mps on /dev/tty0: the node is as gres.conf says, so
    it is not drained; MPS cannot run there, so the job runs as without gpushare."""
    from gpushare.node.config import parse_plugin_args
    from gpushare.node.state import JobStore

    profile = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src", "gpushare",
                           "gpu", "profiles", "h100-8x-nvswitch.json")
    (tmp_path / "gres.conf").write_text("AutoDetect=off\nName=gpu File=/dev/tty0\n"
                                        "Name=mps Count=100\n")
    config = parse_plugin_args([f"state_dir={tmp_path}/s", f"verify={verify}",
                                f"inventory=sim:{os.path.abspath(profile)}"])
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf"), "SLURM_JOB_GPUS": "0",
           "CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    assert job.prolog(config, request(uid=0, gid=0, env=env, **extra)) is None
    store = JobStore(config.state_dir)
    assert store.read(7) is None
    with open(store.path(7, ".env")) as handle:
        assert handle.read() == ""
    # The same job on an NVIDIA GPU is not left to Slurm: the check is what decides.
    (tmp_path / "gres.conf").write_text("AutoDetect=off\nName=gpu File=/dev/nvidia99\n"
                                        "Name=mps Count=100\n")
    if verify == "strict":
        with pytest.raises(job.NodeError, match="no GPU with minor 99"):
            job.prolog(config, request(uid=0, gid=0, env=env, **extra))


def test_a_squeue_others_can_replace_is_never_run(tmp_path):
    from gpushare.node.config import parse_plugin_args

    config = parse_plugin_args([f"state_dir={tmp_path}/s", "verify=off"])
    store = _records(config, 11)
    squeue, calls = _fake_squeue(tmp_path, "")
    os.chmod(squeue, 0o777)
    assert reaper.lost_jobs(config, store, "n1", force=True, squeue=squeue) == set()
    assert not calls.exists()
