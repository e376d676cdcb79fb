# SPDX-License-Identifier: GPL-2.0-or-later
"""Charging a GPU process to a job: by Slurm's cgroup (job id or 26.05 SLUID), by the
job's MPS daemon, never to another user's job whatever the process claims."""

from gpushare.node.usage.attribution import Attributor, JobInfo

GPU = "GPU-a"
STEPD = "/usr/sbin/slurmstepd"


def jobs(*specs):
    return {job_id: JobInfo(job_id, uid, f"u{uid}", [{"uuid": uuid}], pipe)
            for job_id, uid, uuid, pipe in specs}


def test_a_task_in_its_jobs_cgroup_is_the_jobs(node):
    node.process(100, 1001, "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0")
    node.process(101, 1001, "/slurm/uid_1001/job_8/step_batch/task_0")
    attributor = Attributor(jobs((7, 1001, GPU, ""), (8, 1001, GPU, "")), node.proc, node.cgroup)
    assert attributor.job_of(100, GPU) == 7 and attributor.how[100] == "cgroup"
    assert attributor.job_of(101, GPU) == 8


def test_a_sluid_cgroup_is_mapped_through_the_jobs_own_slurmstepd(node):
    node.process(50, 0, "/system.slice/slurmstepd.scope/job_s7Q9M91FM3SB00/step_extern/slurm",
                 exe=STEPD, cmdline=b"slurmstepd: [41.extern]\0")
    node.process(100, 1001, "/system.slice/slurmstepd.scope/job_s7Q9M91FM3SB00/step_0/user")
    attributor = Attributor(jobs((41, 1001, GPU, "")), node.proc, node.cgroup)
    assert attributor.job_of(100, GPU) == 41


def test_a_users_fake_slurmstepd_names_no_sluid(node):
    # A user's own process titled as slurmstepd, or a root process that is no slurmstepd.
    node.process(50, 1002, "/system.slice/slurmstepd.scope/job_sAAAA/step_0/slurm",
                 exe=STEPD, cmdline=b"slurmstepd: [41.0]\0")
    node.process(51, 0, "/system.slice/slurmstepd.scope/job_sAAAA/step_0/slurm",
                 exe="/usr/bin/bash", cmdline=b"slurmstepd: [41.0]\0")
    node.process(100, 1002, "/system.slice/slurmstepd.scope/job_sAAAA/step_0/user")
    attributor = Attributor(jobs((41, 1001, GPU, "")), node.proc, node.cgroup)
    assert attributor.sluid_map() == {}
    assert attributor.job_of(100, GPU) is None


def test_a_cgroup_a_user_made_counts_for_nothing(node):
    # Under a systemd-delegated user cgroup a user may name a directory job_7.
    node.process(100, 1002, "/user.slice/user-1002.slice/user@1002.service/job_7/x")
    attributor = Attributor(jobs((7, 1001, GPU, "")), node.proc, node.cgroup)
    assert attributor.cgroup_job(100) is None and attributor.job_of(100, GPU) is None


def test_another_users_process_in_a_jobs_cgroup_is_not_charged_to_it(node):
    node.process(100, 1002, "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0")
    node.process(101, 1002, "/slurm/uid_1001/job_7/step_0/task_0")
    attributor = Attributor(jobs((7, 1001, GPU, "")), node.proc, node.cgroup)
    assert attributor.job_of(100, GPU) is None and attributor.job_of(101, GPU) is None


def test_an_mps_client_is_its_daemons_job(node):
    node.process(100, 1001, env={"CUDA_MPS_PIPE_DIRECTORY": "/run/gs/mps/k1/pipe"})
    attributor = Attributor(jobs((7, 1001, GPU, "/run/gs/mps/k1/pipe"),
                                 (8, 1002, GPU, "/run/gs/mps/k2/pipe")), node.proc, node.cgroup)
    assert attributor.job_of(100, GPU) == 7 and attributor.how[100] == "mps"


def test_a_process_claiming_another_users_job_is_charged_to_none(node):
    # Its environment names the other user's daemon and job id: it is still uid 1002's.
    node.process(100, 1002, env={"CUDA_MPS_PIPE_DIRECTORY": "/run/gs/mps/k1/pipe",
                                 "SLURM_JOB_ID": "7"})
    attributor = Attributor(jobs((7, 1001, GPU, "/run/gs/mps/k1/pipe")), node.proc, node.cgroup)
    assert attributor.job_of(100, GPU) is None


def test_one_daemon_serving_two_jobs_of_a_user_is_told_apart_by_job_id(node):
    pipe = "/run/gs/mps/k1/pipe"
    node.process(100, 1001, env={"CUDA_MPS_PIPE_DIRECTORY": pipe, "SLURM_JOB_ID": "8"})
    node.process(101, 1001, env={"CUDA_MPS_PIPE_DIRECTORY": pipe})
    attributor = Attributor(jobs((7, 1001, GPU, pipe), (8, 1001, GPU, pipe)), node.proc,
                            node.cgroup)
    assert attributor.job_of(100, GPU) == 8
    assert attributor.job_of(101, GPU) is None  # no way to tell which of the two


def test_a_job_id_from_the_environment_needs_the_job_to_hold_the_device(node):
    node.process(100, 1001, env={"SLURM_JOB_ID": "7"})
    attributor = Attributor(jobs((7, 1001, GPU, "")), node.proc, node.cgroup)
    assert attributor.job_of(100, GPU) == 7 and attributor.how[100] == "environ"
    assert attributor.job_of(100, "GPU-other") is None


def test_a_gone_or_zombie_process_is_nobodys(node):
    node.process(100, 1001, "/system.slice/slurmstepd.scope/job_7/step_0", state="Z")
    attributor = Attributor(jobs((7, 1001, GPU, "")), node.proc, node.cgroup)
    assert attributor.job_of(100, GPU) is None and attributor.job_of(999, GPU) is None


def test_a_slurm_like_cgroup_a_user_made_names_no_job(node):
    # Below their delegated cgroup a user may make .../slurmstepd.scope/job_12 (theirs):
    # job 12, another user's job without a gpushare record, must not be charged with it.
    path = "/user.slice/user-1002.slice/user@1002.service/slurmstepd.scope/job_12/step_0"
    node.process(100, 1002, path, cgroup_owner=1002)
    attributor = Attributor({}, node.proc, node.cgroup)
    assert attributor.cgroup_job(100) is None and attributor.job_of(100, GPU) is None
