# SPDX-License-Identifier: GPL-2.0-or-later
"""The SPANK plugin inside a real Slurm: every context, isolation, errors, options, fast path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

import procfs
import slurmbed

pytestmark = pytest.mark.slurm

USER = slurmbed.TEST_USERS[0]


def lines_for(bed, job_id: int) -> list[str]:
    return [line for line in bed.debug_lines() if f" job={job_id} " in line]


def wait_for_line(bed, job_id: int, pattern: str, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = lines_for(bed, job_id)
        if any(re.search(pattern, line) for line in lines):
            return lines
        time.sleep(0.1)
    raise AssertionError(f"no debug line matching {pattern!r} for job {job_id}: "
                         f"{lines_for(bed, job_id)}")


def last_job_id(bed) -> int:
    result = bed.run(["squeue", "-h", "-t", "all", "-o", "%i", "--sort=-i"])
    return int(result.stdout.split()[0])


def defined_symbols(path: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_plugin_exports_only_spank_symbols():
    names = defined_symbols(os.path.join(slurmbed.BUILD, "spank_gpushare.so"))
    allowed = {"plugin_name", "plugin_type", "plugin_version", "spank_plugin_version"}
    assert names - allowed, "no SPANK callback exported"
    assert all(n in allowed or n.startswith("slurm_spank_") for n in names), names
    core = defined_symbols(os.path.join(slurmbed.BUILD, "spank_gpushare_core.so"))
    assert core == {"gpushare_core_start", "gpushare_core_dispatch", "gpushare_core_prefork"}, core


def test_plugin_links_no_python_and_its_core_the_system_libpython():
    plugin = subprocess.run(["ldd", os.path.join(slurmbed.BUILD, "spank_gpushare.so")],
                            capture_output=True, text=True, check=True).stdout
    assert "libpython" not in plugin, plugin
    core = os.path.join(slurmbed.BUILD, "spank_gpushare_core.so")
    out = subprocess.run(["ldd", core], capture_output=True, text=True, check=True).stdout
    libpython = [line for line in out.splitlines() if "libpython" in line]
    assert libpython, out
    for line in libpython:
        target = line.split("=>")[1].split()[0]
        assert target.startswith(("/lib/", "/usr/lib/")) and ".pyenv" not in target, line
    dynamic = subprocess.run(["readelf", "-d", core], capture_output=True, text=True).stdout
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic, dynamic


def test_option_listed_in_srun_sbatch_and_salloc_help(clean_bed):
    for command in ("srun", "sbatch", "salloc"):
        text = clean_bed.run([command, "--help"], user=USER).stdout
        assert "--gpu-share=percent" in text, command
        assert "--gpu-mps" in text, command


@pytest.mark.parametrize("value", ["abc", "0", "101", "25%", ""])
def test_bad_share_rejected_in_the_client(clean_bed, value):
    for command in (["srun", "true"], ["sbatch", "--wrap", "true"], ["salloc", "true"]):
        result = clean_bed.run([command[0], f"--gpu-share={value}", *command[1:]], user=USER,
                               check=False)
        assert result.returncode != 0, (command, result.stdout)
        assert "from 1 to 100" in result.stderr, result.stderr


@pytest.mark.smoke
def test_job_without_gpus_never_starts_python(clean_bed):
    result = clean_bed.run(["srun", "-N1", "bash", "-c", "echo $SLURM_JOB_ID"], user=USER)
    job_id = int(result.stdout.strip())
    lines = wait_for_line(clean_bed, job_id, r"cb=job_epilog python=skip")
    assert any("cb=job_prolog python=skip" in line for line in lines), lines
    assert any("cb=task_init_privileged skip" in line for line in lines), lines
    assert not any(word in line for word in ("python=start", "prefork", " py ")
               for line in lines), lines


def test_plain_gpu_job_skips_python_in_the_task(clean_bed):
    result = clean_bed.run(["srun", "--gres=gpu:1", "bash", "-c", "echo $SLURM_JOB_ID"],
                           user=USER)
    job_id = int(result.stdout.strip())
    lines = wait_for_line(clean_bed, job_id, r"cb=job_epilog python=skip")
    assert any("cb=task_init_privileged skip" in line for line in lines), lines


def test_share_job_runs_each_context_and_sets_task_env(clean_bed):
    result = clean_bed.run(
        ["srun", "--gres=mps:50", "bash", "-c",
         "echo JOB=$SLURM_JOB_ID; echo CVD=$CUDA_VISIBLE_DEVICES; "
         "echo PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; "
         "echo LOGD=$CUDA_MPS_LOG_DIRECTORY"], user=USER)
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    job_id = int(values["JOB"])
    assert values["CVD"] == "0"
    assert values["PCT"] == "50"
    assert values["PIPE"].startswith(clean_bed.state_dir)
    assert values["LOGD"].startswith(clean_bed.state_dir)
    # The job's own streams are left as they are: no gpushare line unless the site asks.
    assert "gpushare:" not in result.stderr and "gpushare:" not in result.stdout
    lines = wait_for_line(clean_bed, job_id, r"cb=job_epilog (?:python|prefork) rc=0")
    assert any("ctx=job_script" in line and slurmbed.worker_ended(line, "job_prolog")
               for line in lines), lines
    # The task's environment is applied by the C glue: Python never runs in slurmstepd.
    assert any("ctx=remote" in line and "cb=task_init_privileged env-file" in line
               for line in lines), lines
    assert not any("ctx=remote" in line and "python" in line for line in lines), lines
    # No Python thread ever outlives a callback.
    threads = [int(m.group(1)) for line in lines for m in [re.search(r"threads=(\d+)", line)]
               if m]
    assert threads and set(threads) == {1}, lines


def test_record_written_at_prolog_and_removed_at_epilog(clean_bed):
    job_id = clean_bed.sbatch("sleep 3", "--gres=mps:25", user=USER)
    node = clean_bed.wait_job(job_id, states={"RUNNING"})["NodeList"]
    path = os.path.join(clean_bed.state_of(node), "jobs", f"{job_id}.json")
    deadline = time.monotonic() + 10
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    info = os.stat(path)
    assert info.st_uid == 0 and info.st_mode & 0o077 == 0
    with open(path) as handle:
        record = json.load(handle)
    assert record["job_id"] == job_id
    assert record["uid"] == slurmbed.uid_of(USER)
    assert record["share_percent"] == 25
    assert record["slurm_gpus"] and record["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert clean_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    wait_for_line(clean_bed, job_id, r"cb=job_epilog (?:python|prefork) rc=0")
    assert not os.path.exists(path)


def test_gpu_share_option_reaches_prolog_and_must_agree_with_the_gres(clean_bed):
    result = clean_bed.run(["srun", "-w", "n2", "--gres=mps:50", "--gpu-share=50", "bash",
                            "-c", "echo PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], user=USER)
    assert "PCT=50" in result.stdout
    # Without a submit hook the node refuses what the hooks refuse: only the job fails.
    refused = clean_bed.run(["srun", "-w", "n2", "--gres=mps:50", "--gpu-share=20", "true"],
                            user=USER, check=False)
    assert refused.returncode != 0
    assert "--gpu-share=20 and the job's --gres=mps (50% of a GPU) ask for different shares" \
        in refused.stderr
    whole = clean_bed.run(["srun", "-w", "n2", "--gres=gpu:1", "--gpu-share=25", "true"],
                          user=USER, check=False)
    assert whole.returncode != 0
    assert "cannot be combined with whole GPUs" in whole.stderr
    assert "DRAIN" not in clean_bed.node_state("n2")["State"]


def test_roots_shared_job_runs_under_a_daemon_of_roots(clean_bed):
    result = clean_bed.run(["srun", "-w", "n3", "--gres=mps:10", "printenv",
                            "CUDA_MPS_PIPE_DIRECTORY"], check=False)
    assert result.returncode == 0, result.stderr
    assert "/mps/u0-" in result.stdout
    assert "DRAIN" not in clean_bed.node_state("n3")["State"]
    # root's unshared GPU jobs are untouched.
    assert clean_bed.run(["srun", "-w", "n3", "--gres=gpu:1", "true"]).returncode == 0


def _wait_drained(bed, node: str, timeout: float = 60.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = bed.node_state(node)
        if "DRAIN" in state.get("State", ""):
            return state
        time.sleep(0.2)
    raise AssertionError(f"{node} not drained: {bed.node_state(node)}")


def _slurmd_log(bed, node: str) -> str:
    with open(bed.path("log", f"slurmd-{node}.log")) as handle:
        return handle.read()


def _wait_for_log(bed, node: str, pattern: str, timeout: float = 60.0) -> None:
    """Wait for a line of this job's failure: a drain alone may be another job's epilog."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, _slurmd_log(bed, node)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern!r} in slurmd-{node}.log")


def test_pythonpath_a_user_controls_is_never_imported(clean_bed):
    """root's prolog must not import code from a directory a user can change."""
    marker = clean_bed.path("out", "imported-by-root")
    copy = clean_bed.path("out", "userpy")
    subprocess.run(["rm", "-rf", copy, marker], check=True)
    subprocess.run(["cp", "-r", clean_bed.path("lib", "python"), copy], check=True)
    init = os.path.join(copy, "gpushare", "__init__.py")
    with open(init, "a") as handle:
        handle.write(f"\nopen({marker!r}, 'w').close()\n")
    subprocess.run(["chown", "-R", USER, copy], check=True)
    line = clean_bed.plugstack_line().replace(
        f"pythonpath={clean_bed.path('lib', 'python')}", f"pythonpath={copy}")
    clean_bed.write_plugstack(line)
    job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n4", user=USER)
    _wait_for_log(clean_bed, "n4", rf"refusing pythonpath=: {re.escape(copy)}\S* is not "
                  "owned by root")
    _wait_drained(clean_bed, "n4")
    clean_bed.end_held(job_id)  # its epilog fails the same way: let it end first
    assert not os.path.exists(marker)

    # Root-owned but writable by others is refused as well, file by file.
    subprocess.run(["chown", "-R", "root", copy], check=True)
    os.chmod(init, 0o666)
    clean_bed.resume("n4")
    job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n4", user=USER)
    _wait_for_log(clean_bed, "n4",
                  re.escape(f"refusing pythonpath=: {init} is writable by group or others"))
    _wait_drained(clean_bed, "n4")
    clean_bed.end_held(job_id)
    assert not os.path.exists(marker)


def drain_reason(bed, node: str) -> str:
    """The node's whole reason (``scontrol show node -o`` as node_state reads it ends a value
    before a word with ``=``, as in ``pythonpath=``)."""
    return bed.run(["sinfo", "-h", "-N", "-n", node, "-o", "%E"]).stdout.strip()


def test_a_core_that_cannot_load_drains_the_node_from_c(clean_bed):
    """The core passes the trust check but does not load (a broken install, a missing
    libpython): no Python is left to report it, so the C glue drains the node with the
    cause and requeues the batch job held, as for any node fault, and the job's tasks never
    run unchecked."""
    core = clean_bed.path("lib", "spank_gpushare_core.so")
    saved = core + ".saved"
    os.rename(core, saved)
    try:
        with open(core, "w") as handle:  # root's, 0644: trusted, but not a library
            handle.write("not an ELF file\n")
        os.chmod(core, 0o644)
        job_id = clean_bed.sbatch("echo RAN", "--gres=gpu:1", "-w", "n4", user=USER)
        _wait_for_log(clean_bed, "n4", r"cannot load the Python core .*spank_gpushare_core\.so")
        state = _wait_drained(clean_bed, "n4")
        assert state["Reason"].startswith("gpushare: cannot load its Python core"), state
        assert clean_bed.wait_requeued_held(job_id)["JobState"] != "COMPLETED"
        assert "RAN" not in clean_bed.output(job_id, "")
        clean_bed.end_held(job_id)
    finally:
        os.replace(saved, core)
    clean_bed.resume("n4")
    job_id = clean_bed.sbatch("echo RAN", "--gres=gpu:1", "-w", "n4", user=USER)
    assert clean_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    assert "DRAIN" not in clean_bed.node_state("n4")["State"]


def test_a_pythonpath_without_the_core_drains_the_node_and_requeues_the_job(clean_bed):
    """pythonpath= names a root's directory that holds no gpushare: the core loads, its
    import fails in the worker. That is the node's fault, not the job's: the node is drained
    with the setting and the path, the batch job requeued held; a job that asked
    --no-requeue is not requeued, and its output says why."""
    empty = clean_bed.path("lib", "no-gpushare-here")
    os.makedirs(empty, mode=0o755, exist_ok=True)
    default = f"pythonpath={clean_bed.path('lib', 'python')}"
    assert default in clean_bed.plugstack_line()
    clean_bed.write_plugstack(clean_bed.plugstack_line().replace(default, f"pythonpath={empty}"))
    job_id = clean_bed.sbatch("echo RAN", "--gres=gpu:1", "-w", "n4", user=USER)
    _wait_drained(clean_bed, "n4")
    reason = drain_reason(clean_bed, "n4")
    assert reason == f"gpushare: cannot import its core from pythonpath={empty}", reason
    clean_bed.wait_requeued_held(job_id)
    assert "RAN" not in clean_bed.output(job_id, "")
    assert "ModuleNotFoundError: No module named 'gpushare'" in _slurmd_log(clean_bed, "n4")
    clean_bed.end_held(job_id)

    clean_bed.resume("n4")
    job_id = clean_bed.sbatch("echo RAN", "--gres=gpu:1", "-w", "n4", "--no-requeue",
                              user=USER)
    _wait_drained(clean_bed, "n4")
    info = clean_bed.wait_job(job_id)
    assert info["JobState"] != "COMPLETED" and info.get("Restarts") == "0", info
    output = clean_bed.output(job_id)
    assert "RAN" not in output, output
    assert (f"could not set up this job on node n4: gpushare cannot import its core from "
            f"pythonpath={empty}. The node was drained; submit the job again") in output, output


def test_the_builds_own_python_is_accepted_as_it_is(clean_bed):
    """pythonpath=<checkout>/build/pylib, as a site may point it after `make build`: the
    plugin's own check accepts every file the build left, and the job's prolog runs it."""
    pylib = os.path.join(slurmbed.BUILD, "pylib")
    default = f"pythonpath={clean_bed.path('lib', 'python')}"
    assert default in clean_bed.plugstack_line()
    clean_bed.write_plugstack(clean_bed.plugstack_line().replace(default, f"pythonpath={pylib}"))
    seen = len(_slurmd_log(clean_bed, "n3"))
    # A whole GPU: never joined in C, so the prolog checks pythonpath= and its worker runs
    # the Python there; the task waits for the worker's word, which fails it on an error.
    result = clean_bed.run(["srun", "--gres=gpu:h100:1", "-w", "n3", "-c1", "true"],
                           user=USER, check=False)
    log = _slurmd_log(clean_bed, "n3")[seen:]
    assert "refusing pythonpath=" not in log, log[-3000:]
    assert result.returncode == 0, (result.stderr, log[-3000:])
    job_id = last_job_id(clean_bed)
    wait_for_line(clean_bed, job_id, r"\btiming ")  # the prolog's Python ran


def test_core_library_others_can_write_is_never_loaded(clean_bed):
    core = clean_bed.path("lib", "spank_gpushare_core.so")
    os.chmod(core, 0o777)
    try:
        job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n4", user=USER)
        _wait_for_log(clean_bed, "n4", re.escape(
            f"refusing the Python core: {core} is writable by group or others"))
        _wait_drained(clean_bed, "n4")
        clean_bed.end_held(job_id)
    finally:
        os.chmod(core, 0o755)


def test_user_environment_cannot_steer_the_plugin(clean_bed, tmp_path):
    evil = clean_bed.path("out", "evil")
    os.makedirs(os.path.join(evil, "gpushare"), exist_ok=True)
    with open(os.path.join(evil, "gpushare", "__init__.py"), "w") as handle:
        handle.write("raise SystemExit('imported the user\\'s gpushare')\n")
    env = {"PYTHONHOME": "/nonexistent", "PYTHONPATH": evil, "PYTHONSTARTUP": "/nonexistent"}
    result = clean_bed.run(["srun", "--gres=mps:30", "bash", "-c",
                            "echo HOME=$PYTHONHOME PATHV=$PYTHONPATH "
                            "PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], user=USER, env=env)
    assert "HOME=/nonexistent" in result.stdout
    assert f"PATHV={evil}" in result.stdout
    assert "PCT=30" in result.stdout
    job_id = clean_bed.sbatch("echo HOME=$PYTHONHOME; echo PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                              "--gres=mps:40", user=USER, env=env)
    assert clean_bed.wait_job(job_id)["JobState"] == "COMPLETED"
    out = clean_bed.output(job_id)
    assert "HOME=/nonexistent" in out and "PCT=40" in out


def test_unknown_plugstack_key_refuses_to_run(clean_bed):
    clean_bed.write_plugstack(clean_bed.plugstack_line().rstrip() + " colour=blue\n")
    result = clean_bed.run(["srun", "true"], user=USER, check=False)
    assert result.returncode != 0
    assert "unknown plugstack argument 'colour=blue'" in result.stderr
    assert "accepted keys" in result.stderr


def test_a_line_broken_before_an_epilog_drains_with_gpushares_cause(clean_bed):
    """The line was fine at the job's start and is broken at its end: the epilog drains the
    node with gpushare's cause, not Slurm's bare "Epilog error". Once the line is mended,
    `gpushare mps --reap` gives back the job's share, and the node runs shared jobs again."""
    good = clean_bed.plugstack_line()
    started = clean_bed.path("out", f"broken-line-started-{time.monotonic_ns()}")
    job_id = clean_bed.sbatch(f"touch {started}; sleep 2", "--gres=mps:25", "-w", "n4",
                              user=USER)
    # The batch step itself must be running (its slurmstepd has read the good line): a line
    # broken before it starts fails the step's own start instead.
    slurmbed.wait_until("the job's script started", lambda: os.path.exists(started), 120)
    clean_bed.write_plugstack(good.rstrip() + " colour=blue\n")
    clean_bed.wait_job(job_id)
    _wait_for_log(clean_bed, "n4", r"unknown plugstack argument 'colour=blue'")
    state = _wait_drained(clean_bed, "n4")
    assert state.get("Reason", "").startswith(
        "gpushare: bad gpushare line in plugstack.conf"), state
    clean_bed.write_plugstack(good)
    reaped = clean_bed.run(["/usr/bin/python3", "-m", "gpushare.cli", "mps", "--node", "n4",
                            "--reap"], env={"PYTHONPATH": clean_bed.path("lib", "python")},
                           check=False)
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr
    clean_bed.resume("n4")
    again = clean_bed.sbatch("true", "--gres=mps:25", "-w", "n4", user=USER)
    assert clean_bed.wait_job(again)["JobState"] == "COMPLETED"


def test_bad_plugstack_value_fails_gpu_job_with_a_named_key(clean_bed):
    clean_bed.write_plugstack(clean_bed.plugstack_line().rstrip() + " verify=maybe\n")
    job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n4", user=USER)
    # A required plugin whose prolog fails drains the node: the config is a node problem.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = clean_bed.node_state("n4")
        if "DRAIN" in state.get("State", ""):
            break
        time.sleep(0.2)
    assert "DRAIN" in clean_bed.node_state("n4")["State"]
    with open(clean_bed.path("log", "slurmd-n4.log")) as handle:
        log = handle.read()
    assert "verify='maybe' is invalid: expected one of strict, warn, off" in log
    clean_bed.run(["scancel", str(job_id)], check=False)


def _wait_node_drained(bed, node: str) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "DRAIN" not in bed.node_state(node)["State"]:
        time.sleep(0.2)
    return bed.node_state(node)


def test_a_state_directory_that_is_a_symlink_fails_the_prolog_naming_it(clean_bed):
    bad = clean_bed.path("state-link")
    if not os.path.lexists(bad):
        os.symlink("/tmp", bad)
    line = clean_bed.plugstack_line().replace(f"state_dir={clean_bed.state_of('%n')}",
                                              f"state_dir={bad}")
    assert f"state_dir={bad}" in line
    clean_bed.write_plugstack(line)
    job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n3", user=USER)
    assert "DRAIN" in _wait_node_drained(clean_bed, "n3")["State"]
    with open(clean_bed.path("log", "slurmd-n3.log")) as handle:
        log = handle.read()
    assert f"refusing state_dir={bad}: {bad} is a symbolic link or not a directory" in log
    assert clean_bed.run(["scontrol", "ping"]).returncode == 0
    clean_bed.write_plugstack(clean_bed.plugstack_line())  # its epilog must not drain again
    clean_bed.run(["scancel", str(job_id)], check=False)
    clean_bed.wait_job(job_id)


def test_a_state_directory_below_one_others_can_write_fails_the_prolog_naming_it(clean_bed):
    """Every component of state_dir= is checked in C, as in Python: a directory above it
    that others can write (and is not sticky) would let them replace the state directory."""
    open_parent = clean_bed.path("open-parent")
    os.makedirs(os.path.join(open_parent, "state"), exist_ok=True)
    os.chmod(open_parent, 0o777)
    bad = os.path.join(open_parent, "state")
    line = clean_bed.plugstack_line().replace(f"state_dir={clean_bed.state_of('%n')}",
                                              f"state_dir={bad}")
    assert f"state_dir={bad}" in line
    clean_bed.write_plugstack(line)
    job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n3", user=USER)
    assert "DRAIN" in _wait_node_drained(clean_bed, "n3")["State"]
    with open(clean_bed.path("log", "slurmd-n3.log")) as handle:
        log = handle.read()
    assert (f"refusing state_dir={bad}: {open_parent} is writable by group or others "
            "(owner uid 0, mode 0777)") in log
    assert not os.listdir(bad)  # nothing was written below it
    clean_bed.write_plugstack(clean_bed.plugstack_line())
    clean_bed.run(["scancel", str(job_id)], check=False)
    clean_bed.wait_job(job_id)


def test_a_fifo_at_debug_log_neither_hangs_nor_fails_a_job(clean_bed):
    """debug_log= is opened without blocking and only as a regular file: a FIFO there (no
    reader) is refused once in slurmd's log, and the job runs as without the log."""
    fifo = clean_bed.path("debug.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo, 0o644)
    line = clean_bed.plugstack_line().replace(f"debug_log={clean_bed.debug_log}",
                                              f"debug_log={fifo}")
    assert f"debug_log={fifo}" in line
    clean_bed.write_plugstack(line)
    try:
        job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n3", user=USER)
        assert clean_bed.wait_job(job_id, timeout=60)["JobState"] == "COMPLETED"
        assert "DRAIN" not in clean_bed.node_state("n3")["State"]
        with open(clean_bed.path("log", "slurmd-n3.log")) as handle:
            log = handle.read()
        assert f"cannot open debug_log={fifo}" in log
    finally:
        clean_bed.write_plugstack(clean_bed.plugstack_line())


def test_python_exception_is_logged_with_job_and_traceback(clean_bed):
    # The job's record path is a directory: writing the record fails inside the core, an
    # error gpushare does not expect, so the node's fault. The prolog runs in a worker Slurm
    # does not wait for, so the worker drains the node itself with the error, and the job's
    # task fails with a message (the job asked not to be requeued).
    job_id = clean_bed.sbatch("true", "--gres=mps:10", "-w", "n3", "--hold", "--no-requeue",
                              user=USER)
    jobs = os.path.join(clean_bed.state_of("n3"), "jobs")
    os.makedirs(os.path.join(jobs, f"{job_id}.json"))
    try:
        clean_bed.run(["scontrol", "release", str(job_id)])
        state = _wait_node_drained(clean_bed, "n3")
        assert "DRAIN" in state["State"]
        # the prolog's reason, or the epilog's: the record path is still a directory then
        assert re.match(r"gpushare: job_(prolog|epilog) failed: Is a directory \(",
                        state["Reason"]), state
        info = clean_bed.wait_job(job_id)
        assert info["JobState"] != "COMPLETED", info
        with open(clean_bed.path("log", "slurmd-n3.log")) as handle:
            log = handle.read()
        assert f"gpushare: job {job_id}: job_prolog: job_prolog failed: Is a directory" in log
        assert "Traceback" in log and "IsADirectoryError" in log
        assert "gpushare: could not set up this job on " in clean_bed.output(job_id)
        # slurmd survived and still answers.
        assert clean_bed.run(["scontrol", "ping"]).returncode == 0
        # The epilog's worker fails on the same path, and drains the node again.
        slurmbed.wait_until("the epilog's worker", lambda: any(
            f"job={job_id} " in line and slurmbed.worker_ended(line, "job_epilog", "")
            for line in clean_bed.debug_lines()))
    finally:
        clean_bed.run(["scancel", str(job_id)], check=False)
        os.rmdir(os.path.join(jobs, f"{job_id}.json"))


def test_slurmd_never_loads_python(clean_bed):
    for node in clean_bed.nodes:
        pid = clean_bed._pids[f"slurmd-{node.name}"]
        with open(f"/proc/{pid}/maps") as handle:
            maps = handle.read()
        # slurmd loads the plugin (it exports slurm_spank_init), which links no Python;
        # the core, libpython and every extension module stay out of slurmd.
        assert "spank_gpushare.so" in maps
        for loaded in ("spank_gpushare_core.so", "libpython", "_cffi_backend"):
            assert loaded not in maps, f"slurmd {node.name} mapped {loaded}"
    assert not any("ctx=slurmd" in line for line in clean_bed.debug_lines())


def test_share_without_gpu_fails_the_task_not_the_node(clean_bed):
    result = clean_bed.run(["srun", "-w", "n2", "--gpu-share=25", "true"], user=USER,
                           check=False)
    assert result.returncode != 0
    assert "got no GPU on this node" in result.stderr
    assert "DRAIN" not in clean_bed.node_state("n2")["State"]


def test_gpu_share_reaches_the_submit_hook(bed, tmp_path):
    lua = tmp_path / "job_submit.lua"
    lua.write_text(
        "function slurm_job_submit(job_desc, part_list, submit_uid)\n"
        "  for _, entry in pairs(job_desc.spank_job_env or {}) do\n"
        "    slurm.log_user('seen ' .. entry)\n"
        "  end\n"
        "  return slurm.SUCCESS\n"
        "end\n"
        "function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)\n"
        "  return slurm.SUCCESS\n"
        "end\n"
        "return slurm.SUCCESS\n")
    port = bed.ctld_port + 50
    small = slurmbed.default_bed(root=bed.root + "-lua", port_base=port, node_count=1,
                                 prefix="lua", job_submit="lua", job_submit_lua=str(lua))
    with small:
        result = small.run(["sbatch", "--gres=mps:25", "--gpu-share=25", "--wrap", "true"],
                           user=USER)
    assert "seen _SLURM_SPANK_OPTION_gpushare_gpu_share=25" in result.stderr


def test_bed_stops_without_leftovers(bed):
    """The harness itself: after stop, no process, cgroup or file of the bed remains."""
    small = slurmbed.default_bed(root=bed.root + "-stop", port_base=bed.ctld_port + 60,
                                 node_count=2, prefix="stop")
    with small:
        job_id = small.sbatch("sleep 30", "--gres=mps:10", user=USER)
        small.wait_job(job_id, states={"RUNNING"})
        pids = dict(small._pids)
    for name, pid in pids.items():
        assert procfs.ended(pid), name
    assert not procfs.pids_mentioning(small.root + "/")
    for node in small.nodes:
        assert not slurmbed._glob_dirs("/sys/fs/cgroup", f"slurm_{node.name}")
    assert not os.path.exists(small.root)


def test_show_yes_writes_one_line_into_the_first_tasks_stderr(clean_bed):
    clean_bed.write_plugstack(clean_bed.plugstack_line().rstrip() + " show=yes\n")
    result = clean_bed.run(["srun", "-n2", "--gres=mps:20", "bash", "-c",
                            "echo JOB=$SLURM_JOB_ID"], user=USER)
    job_id = int(result.stdout.split("JOB=")[1].split()[0])
    lines = [line for line in result.stderr.splitlines() if line.startswith("gpushare:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gpushare: job {job_id}: CUDA_VISIBLE_DEVICES=0, 20% of the "
                               "GPU's SMs")


def test_gpu_task_without_its_imex_channel_stops_with_the_reason(clean_bed):
    """imex_channels=: a GPU task that finds no IMEX channel device fails, saying why."""
    import stat

    channels = clean_bed.path("imex")
    subprocess.run(["rm", "-rf", channels], check=True)
    os.makedirs(channels)
    with open(os.path.join(channels, "channel1"), "w"):
        pass  # a plain file is no channel
    clean_bed.write_plugstack(clean_bed.plugstack_line().rstrip() +
                              f" imex_channels={channels}\n")
    refused = clean_bed.run(["srun", "-w", "n2", "--gres=gpu:1", "true"], user=USER,
                            check=False)
    assert refused.returncode != 0
    assert f"gpushare: this GPU job has no IMEX channel in {channels}" in refused.stderr
    assert "SwitchType=switch/nvidia_imex" in refused.stderr
    # Jobs without GPUs need none.
    assert clean_bed.run(["srun", "-w", "n2", "true"], user=USER).returncode == 0
    os.mknod(os.path.join(channels, "channel7"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert clean_bed.run(["srun", "-w", "n2", "--gres=gpu:1", "true"], user=USER).returncode == 0
    assert "DRAIN" not in clean_bed.node_state("n2")["State"]
