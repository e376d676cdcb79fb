# SPDX-License-Identifier: GPL-2.0-or-later
"""The submit hooks inside the real slurmctld: job_submit.lua and the job_submit/gpushare
plugin (the Python rules), each in its own bed rendered from tests/plans/bed.yaml.

Each hook gets a module-scoped bed on ``GPUSHARE_BED_PORT`` + 100 (Lua) or + 130 (Python),
rooted at ``<GPUSHARE_BED_ROOT>-lua`` / ``-py``. pytest groups the tests by hook and stops
one bed before it starts the next. These beds use the plan's node names (n1..n5), like the
session ``bed``; Slurm names cgroups after nodes, so jobs must never run in two of them at
once. That holds: the tests here do not use the session bed, which is idle between tests,
and only one of the two hook beds is up at a time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

import slurmbed
from slurmbed import stored

ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed")
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200"))
LUA = os.path.join(slurmbed.REPO, "submit_hooks", "job_submit.lua")
VECTORS = os.path.join(slurmbed.REPO, "tests", "vectors")
NO_VAL = 4294967294
HOOKS = ("lua", "py")
SCRIPT = 'echo "CVD=$CUDA_VISIBLE_DEVICES PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"'


def hook_bed(hook: str) -> slurmbed.SlurmBed:
    """A plan bed whose slurmctld runs one of the two hooks."""
    root = f"{ROOT}-{hook}"
    if hook == "lua":
        return slurmbed.plan_bed(root=root, port_base=PORT + 100, job_submit="lua",
                                 job_submit_lua=LUA)
    return slurmbed.with_python_hook(slurmbed.plan_bed(root=root, port_base=PORT + 130))


@pytest.fixture(scope="module", params=HOOKS)
def hooked(request):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    if not os.path.exists(os.path.join(slurmbed.BUILD, "spank_gpushare.so")):
        subprocess.run(["make", "-C", slurmbed.REPO, "build"], check=True)
    bed = hook_bed(request.param)
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()


def submit(bed: slurmbed.SlurmBed, *args: str, script: str = SCRIPT,
           user: str = slurmbed.TEST_USERS[0]) -> subprocess.CompletedProcess[str]:
    return bed.run(["sbatch", "--parsable", f"--output={bed.out_dir}/%A_%a.out"
                    if "--array" in " ".join(args) else f"--output={bed.out_dir}/%j.out",
                    *args, "--wrap", script], user=user, check=False)


def accepted(result: subprocess.CompletedProcess[str]) -> int:
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip().split(";")[0])


def gpushare_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "gpushare:" in line]


def ctld_log(bed: slurmbed.SlurmBed) -> str:
    with open(bed.path("log", "slurmctld.log"), errors="replace") as handle:
        return handle.read()


def hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def prolog_rc(bed: slurmbed.SlurmBed, job_id: int) -> list[str]:
    return [line for line in bed.debug_lines()
            if f"job={job_id} cb=job_prolog" in line and " rc=" in line]


# ---- placement ----------------------------------------------------------------------------

def test_two_node_gpu_job_lands_in_one_domain(hooked):
    result = submit(hooked, "-N2", "--gres=gpu:h100:1")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [
        "sbatch: gpushare: --switches=1@1:00 (2 nodes fit in one NVLink domain)"]
    info = hooked.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    assert info["Switches"] == "1@00:01:00"
    assert info["NodeList"] in ("n[1-2]", "n[3-4]")


def test_three_node_gpu_job_gets_two_switches_and_runs(hooked):
    result = submit(hooked, "-N3", "--gres=gpu:h100:1")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [
        "sbatch: gpushare: --switches=2@1:00 (3 nodes need 2 NVLink domains of at most 2 "
        "nodes)"]
    info = hooked.wait_job(job_id)
    assert info["Switches"] == "2@00:01:00"
    assert info["JobState"] == "COMPLETED", info


# ---- GPUs per node: --gpus-per-node and --gres=gpu (Slurm 26.05 refuses the pair) ---------

TWICE = ("asks for the GPUs of each node twice (as --gpus-per-node with --gres=gpu does), "
         "and Slurm 26.05 no longer takes both")


def test_gpus_per_node_stays_one_request(hooked):
    """--gpus-per-node fills tres_per_node as --gres=gpu does: the hook writes the type in
    place and never a second gpu item (nor mps beside it), and --switches as ever."""
    result = submit(hooked, "-N2", "--gpus-per-node=1")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [stored(
        "sbatch: gpushare: --gres=gpu:1 -> gres:gpu:h100:1 (a GPU without a type is a whole "
        "h100 here); --switches=1@1:00 (2 nodes fit in one NVLink domain)")]
    info = hooked.wait_job(job_id)
    assert info["TresPerNode"] == stored("gres:gpu:h100:1")
    assert info["JobState"] == "COMPLETED", info
    refused = submit(hooked, "--gpus-per-node=h100:1", "--gpu-share=25")
    assert refused.returncode != 0
    assert gpushare_lines(refused.stderr) == [
        "sbatch: error: gpushare: --gpu-share=25 is a share of one GPU and cannot be combined "
        "with whole GPUs (--gres=gpu:h100:1); ask for the share alone, or for whole GPUs "
        "alone, e.g. --gres=gpu:h100:1"]


def test_gpus_per_node_beside_gres_gpu_by_release(hooked):
    """Before 26.05 the pair passes as it always did. From 26.05 sbatch refuses it itself,
    and the hook (told the release) refuses a --gres that asks for one node's GPUs twice,
    which the client lets through. (An untyped item beside a typed one never reaches the
    hooks: Slurm refuses it, "with and without type identification".)"""
    pair = submit(hooked, "--hold", "--gpus-per-node=h100:1", "--gres=gpu:h100:1")
    twice = submit(hooked, "--hold", "--gres=gpu:h100:2,gpu:h100:1")
    try:
        if slurmbed.slurm_release() >= (26, 5):
            assert pair.returncode != 0
            assert "--gpus-per-node and --gres=gpu are mutually exclusive" in pair.stderr
            assert gpushare_lines(pair.stderr) == []
            assert twice.returncode != 0
            assert gpushare_lines(twice.stderr) == [
                f"sbatch: error: gpushare: --gres=gpu:h100:2,gpu:h100:1 {TWICE}; ask once, "
                "e.g. --gres=gpu:h100:1 or --gpus-per-node=h100:1"]
            return
        for result, tres in ((pair, "gres:gpu:h100:1,gres:gpu:h100:1"),
                             (twice, "gres:gpu:h100:2,gres:gpu:h100:1")):
            assert gpushare_lines(result.stderr) == []
            assert hooked.job(accepted(result))["TresPerNode"] == stored(tres)
    finally:
        for result in (pair, twice):
            if result.returncode == 0:
                hooked.run(["scancel", result.stdout.strip().split(";")[0]], check=False)


# ---- rejections ---------------------------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    (["--gres=mps:150"], "--gres=mps:150"),
    (["--gres=gpu:7g.80gb:1"], "--gres=gpu:7g.80gb:1"),
    (["--gpu-share=30", "--gres=gpu:h100:1"], "--gpu-share=30"),
    (["--gres=mps:0"], "--gres=mps:0"),
    (["--gres=gpu:1g.10g:1"], "--gres=gpu:1g.10g:1"),
    (["-N5", "--gres=gpu:h100:1"], "-N 5"),
])
def test_bad_request_fails_at_sbatch_with_the_hooks_message(hooked, args, flag):
    result = submit(hooked, *args)
    assert result.returncode != 0
    assert result.stdout.strip() == ""
    lines = gpushare_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"sbatch: error: gpushare: {flag} ")
    assert "Invalid generic resource (gres) specification" in result.stderr


# ---- rewrites that run --------------------------------------------------------------------

def test_mig_request_by_autodetect_name_is_normalised_and_runs_on_its_slice(hooked):
    result = submit(hooked, "--gres=gpu:nvidia_a100_1g.10gb:1")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [
        stored("sbatch: gpushare: --gres=gpu:nvidia_a100_1g.10gb:1 -> gres:gpu:1g.10gb:1")]
    info = hooked.wait_job(job_id)
    assert info["TresPerNode"] == stored("gres:gpu:1g.10gb:1")
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"] == "n5"
    assert re.search(r"^CVD=\d+ ", hooked.output(job_id), re.M), hooked.output(job_id)
    # The prolog verified the slice Slurm handed out against the node's (simulated) NVML.
    prologs = prolog_rc(hooked, job_id)
    assert prologs and all(line.endswith(" rc=0") for line in prologs), prologs


@pytest.mark.smoke
def test_gpu_share_without_gres_becomes_mps_and_runs_capped(hooked):
    result = submit(hooked, "--gpu-share=25")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [
        stored("sbatch: gpushare: --gpu-share=25 -> gres:mps:25")]
    info = hooked.wait_job(job_id)
    assert info["TresPerNode"] == stored("gres:mps:25")
    assert info["JobState"] == "COMPLETED", info
    assert re.search(r"^CVD=\d+ PCT=25$", hooked.output(job_id), re.M), hooked.output(job_id)



def test_private_mps_flag_passes_the_hook_and_gets_its_daemon(hooked):
    # slurmctld 22.05 hands a flag option to the hooks as "(null)"; it must read as set.
    result = submit(hooked, "--gres=gpu:h100:2", "--gpu-mps", "-w", "n2",
                    script="echo CVD=$CUDA_VISIBLE_DEVICES PIPE=$CUDA_MPS_PIPE_DIRECTORY")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == []
    info = hooked.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    out = hooked.output(job_id)
    assert re.search(rf"^CVD=0,1 PIPE={re.escape(hooked.state_of('n2'))}/mps/job{job_id}/pipe$",
                     out, re.M), out

# ---- untouched ----------------------------------------------------------------------------

@pytest.mark.parametrize("args, tres", [
    (["--gres=gpu:h100:1"], "gres:gpu:h100:1"),
    (["-N2"], None),
    (["-N2", "-n2"], None),
])
def test_single_node_and_cpu_only_jobs_untouched(hooked, args, tres):
    result = submit(hooked, *args)
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == []
    info = hooked.wait_job(job_id)
    assert info.get("TresPerNode") == (stored(tres) if tres else tres)
    assert "Switches" not in info
    assert info["JobState"] == "COMPLETED", info


def test_job_array_is_handled_once_and_every_task_runs(hooked):
    result = submit(hooked, "--array=1-4", "-N2", "--gres=gpu:h100:1")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [
        "sbatch: gpushare: --switches=1@1:00 (2 nodes fit in one NVLink domain)"]
    deadline = time.monotonic() + 120
    records: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        out = hooked.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        records = [dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", line))
                   for line in out.splitlines() if line.strip()]
        if len(records) == 4 and all(r["JobState"] == "COMPLETED" for r in records):
            break
        time.sleep(0.3)
    assert sorted(r["ArrayTaskId"] for r in records) == ["1", "2", "3", "4"], records
    for record in records:
        assert record["JobState"] == "COMPLETED", record
        assert record["Switches"] == "1@00:01:00"
        assert record["NodeList"] in ("n[1-2]", "n[3-4]")


# ---- what a site meets on its first day ---------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--gres=mps:10"], ["--gpu-share=25"], ["--gres=gpu:h100:1", "--gpu-mps"]])
def test_roots_share_is_accepted_and_runs_as_anyones(hooked, args):
    """Slurm's own MPS tests run as root: root's share passes the hook as a user's does
    and runs under a daemon of root's own; no node drains."""
    result = hooked.run(["sbatch", "--parsable", f"--output={hooked.out_dir}/%j.out", *args,
                         "--wrap", SCRIPT], check=False)
    job_id = accepted(result)
    assert hooked.wait_job(job_id)["JobState"] == "COMPLETED", hooked.logs()
    ran = hooked.run(["srun", *args, "true"], check=False, timeout=60)
    assert ran.returncode == 0, ran.stderr
    states = hooked.run(["sinfo", "-h", "-o", "%T"]).stdout.split()
    assert not any(state.startswith("drain") for state in states), states


def test_roots_whole_gpu_job_runs(hooked):
    result = hooked.run(["sbatch", "--parsable", f"--output={hooked.out_dir}/%j.out",
                         "--gres=gpu:h100:1", "--wrap", SCRIPT], check=False)
    job_id = accepted(result)
    assert hooked.wait_job(job_id)["JobState"] == "COMPLETED"


def test_untyped_gpu_gets_a_whole_gpu_never_a_slice(hooked):
    """The bed's plan says untyped_gpu: h100. On n5, whose only free GPUs are MIG slices
    and one whole A100, an untyped request cannot be placed: it never lands on a slice."""
    result = submit(hooked, "--gres=gpu:1")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [stored(
        "sbatch: gpushare: --gres=gpu:1 -> gres:gpu:h100:1 (a GPU without a type is a whole "
        "h100 here)")]
    info = hooked.wait_job(job_id)
    assert info["TresPerNode"] == stored("gres:gpu:h100:1")
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"] in ("n1", "n2", "n3", "n4")
    on_mig_node = submit(hooked, "--gres=gpu:1", "-w", "n5")
    assert on_mig_node.returncode != 0
    assert "Requested node configuration is not available" in on_mig_node.stderr


@pytest.fixture
def whole_policy(hooked):
    """The bed's facts with policy untyped_gpu: whole (its nodes: n1-n4 whole H100, n5 a
    whole A100 beside Slurm's 1g.10gb slices), loaded into the running hook; restored
    after, node features too."""
    with open(hooked.facts_path) as handle:
        rendered = handle.read()
    facts = json.loads(rendered)
    assert facts["gpu_types"] == ["a100", "h100"] and facts["mig_types"] == ["1g.10gb"]
    assert "whole_gpu_feature" not in facts  # n5 has both whole GPUs and slices

    def load(**keys: object) -> None:
        with open(hooked.facts_path, "w") as handle:
            json.dump(dict(facts, policy=dict(facts["policy"], untyped_gpu="whole"), **keys),
                      handle)
        _reload(hooked)

    try:
        yield load
    finally:
        with open(hooked.facts_path, "w") as handle:
            handle.write(rendered)
        _reload(hooked)
        hooked.run(["scontrol", "update", "NodeName=n[1-4]", "AvailableFeatures=",
                    "ActiveFeatures="], check=False)


def test_untyped_gpu_is_kept_whole_by_the_node_feature(hooked, whole_policy):
    """Several whole types and Slurm's MIG slices: where a node has both, an untyped
    --gres=gpu:4 is refused with the type to name; where the facts carry the feature of
    the nodes without slices, it gets --constraint for it (merged with the user's) and runs
    on whole GPUs there."""
    whole_policy()
    refused = submit(hooked, "--gres=gpu:4")
    assert refused.returncode != 0
    assert gpushare_lines(refused.stderr) == [
        "sbatch: error: gpushare: --gres=gpu:4 does not say which GPU, and here it could get "
        "a MIG slice (whole GPUs: a100, h100; MIG: 1g.10gb, and a node has both whole GPUs "
        "and MIG slices for Slurm); name the type, e.g. --gres=gpu:a100:4"]

    whole_policy(whole_gpu_feature="gpushare_whole")
    for nodes, features in (("n[1-2]", "gpushare_whole,ib"), ("n[3-4]", "gpushare_whole,eth")):
        hooked.run(["scontrol", "update", f"NodeName={nodes}", f"AvailableFeatures={features}",
                    f"ActiveFeatures={features}"])
    note = ("(a GPU without a type is a whole GPU here: nodes with gpushare_whole have no "
            "MIG slice)")
    result = submit(hooked, "--gres=gpu:4")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [
        f"sbatch: gpushare: --gres=gpu:4: --constraint=gpushare_whole {note}"]
    info = hooked.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    assert info["Features"] == "gpushare_whole"
    assert info["NodeList"] in ("n1", "n2", "n3", "n4")
    assert info["TresPerNode"] == stored("gres:gpu:4")

    merged = submit(hooked, "--gres=gpu:4", "--constraint=ib|eth")
    job_id = accepted(merged)
    assert gpushare_lines(merged.stderr) == [
        f"sbatch: gpushare: --gres=gpu:4: --constraint=ib|eth -> "
        f"--constraint=(ib|eth)&gpushare_whole {note}"]
    info = hooked.wait_job(job_id)
    assert info["Features"] == "(ib|eth)&gpushare_whole"
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"] in ("n1", "n2", "n3", "n4")


def test_tasks_spanning_nodes_without_N_get_switches(hooked):
    """-n 16 --gpus-per-task=1: no -N, but 16 GPUs need 2 of the bed's 8-GPU nodes."""
    result = submit(hooked, "-n16", "--gpus-per-task=h100:1")
    job_id = accepted(result)
    assert gpushare_lines(result.stderr) == [
        "sbatch: gpushare: --switches=1@1:00 (16 GPUs (2 nodes of 8) fit in one NVLink "
        "domain)"]
    info = hooked.wait_job(job_id)
    assert info["Switches"] == "1@00:01:00"
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"] in ("n[1-2]", "n[3-4]")


@pytest.mark.parametrize("gres", ["gpu:1,mps:25", "gpu:::", "gpu:h100:-1", ":1",
                                  "gpu:1g.10gb"])
def test_explain_says_what_slurm_answers(hooked, gres):
    """gpushare explain predicts what the user sees, whether sbatch itself refuses the
    request before any hook runs, or the hook does."""
    explained = subprocess.run([sys.executable, "-m", "gpushare.cli", "explain", "--facts",
                                hooked.facts_path, "--uid", "1000", "--", f"--gres={gres}"],
                               capture_output=True, text=True, check=False)
    assert explained.returncode == 1, explained.stdout
    predicted = [line.split("the user sees: ", 1)[1] for line in explained.stdout.splitlines()
                 if line.startswith("the user sees: ")]
    result = submit(hooked, "--hold", f"--gres={gres}")
    assert result.returncode != 0
    first = result.stderr.splitlines()[0]
    if predicted[0].startswith("sbatch: "):
        assert first == predicted[0], (first, explained.stdout)
    else:
        assert first == f"sbatch: error: {predicted[0]}", (first, explained.stdout)


# ---- the conformance vectors written for the bed -----------------------------------------

def _bed_vectors() -> list[dict]:
    with open(os.path.join(VECTORS, "bed.json")) as handle:
        return json.load(handle)["vectors"]


@pytest.fixture(scope="class")
def vector_bed(hooked):
    with open(hooked.facts_path) as handle:
        rendered = handle.read()
    with open(os.path.join(VECTORS, "bed.json")) as handle:
        facts_name = json.load(handle)["facts"]
    with open(os.path.join(VECTORS, "facts", f"{facts_name}.json")) as handle:
        facts = json.load(handle)
    # The vectors are written in 22.05's syntax; the facts follow the running Slurm.
    facts["gres_syntax"] = "23.11" if slurmbed.slash_gres() else "22.05"
    with open(hooked.facts_path, "w") as handle:
        json.dump(facts, handle)
    _reload(hooked)
    try:
        yield hooked
    finally:
        with open(hooked.facts_path, "w") as handle:
            handle.write(rendered)
        _reload(hooked)


class TestVectorsThroughSlurmctld:
    """tests/vectors/bed.json (each vector with the sbatch flags that give its job fields)
    through slurmctld, with the vectors' facts file loaded into the running hook."""

    @pytest.mark.parametrize("vector", _bed_vectors(), ids=[v["name"] for v in _bed_vectors()])
    def test_vector(self, vector_bed, vector):
        """sbatch --hold: slurmctld's stored job (or its rejection) is what the vector says."""
        result = submit(vector_bed, "--hold", *vector["sbatch"])
        expect = vector["expect"]
        if "reject" in expect:
            assert result.returncode != 0
            assert gpushare_lines(result.stderr) == [f"sbatch: error: {expect['reject']}"]
            return
        job_id = accepted(result)
        try:
            message = expect["message"]
            per_task = "tres_per_task" in vector["job"]
            assert gpushare_lines(result.stderr) == (
                [stored(f"sbatch: {message}", per_task)] if message else [])
            final = dict(vector["job"], **expect["changes"])
            info = vector_bed.job(job_id)
            for field, shown in (("tres_per_node", "TresPerNode"), ("tres_per_job", "TresPerJob"),
                                 ("tres_per_task", "TresPerTask"),
                                 ("tres_per_socket", "TresPerSocket")):
                want = final.get(field)
                assert info.get(shown) == (stored(want, field == "tres_per_task") if want
                                           else want), (shown, info)
            switches = final.get("req_switch", NO_VAL)
            if switches == NO_VAL:
                assert "Switches" not in info, info
            else:
                count, _, wait = info["Switches"].partition("@")
                assert int(count) == switches
                if final.get("wait4switch", NO_VAL) != NO_VAL:
                    assert wait == hms(final["wait4switch"])
        finally:
            vector_bed.run(["scancel", str(job_id)], check=False)


# ---- internal errors ----------------------------------------------------------------------

def _reload(bed: slurmbed.SlurmBed) -> None:
    """Make slurmctld load the hook again: Lua re-reads a script whose mtime changed; the
    Python plugin reloads its facts on ``scontrol reconfigure``."""
    if bed.job_submit == "lua":
        script = bed.path("etc", "job_submit.lua")
        later = os.stat(script).st_mtime + 2
        os.utime(script, (later, later))
    else:
        # The plugin compares slurm.conf's load time, kept in whole seconds.
        time.sleep(1.1)
        bed.run(["scontrol", "reconfigure"])


def test_unreadable_facts_never_break_slurmctld(hooked):
    with open(hooked.facts_path) as handle:
        good = handle.read()
    log_before = len(ctld_log(hooked))
    try:
        with open(hooked.facts_path, "w") as handle:
            handle.write("{not json")
        _reload(hooked)
        result = submit(hooked, "--hold", "--gres=mps:150")
        new_log = ctld_log(hooked)[log_before:]
        assert re.search(r"error: .*gpushare.*facts", new_log), new_log
        assert hooked.run(["squeue", "-h"]).returncode == 0  # slurmctld still answers
        # Slurm 24.11 re-executes slurmctld on reconfigure: the plugin starts afresh too.
        fresh = hooked.job_submit == "lua" or slurmbed.slurm_release() >= (24, 11)
        if fresh:
            # The hook loads without facts and passes every job unchanged.
            job_id = accepted(result)
            assert gpushare_lines(result.stderr) == []
            assert hooked.job(job_id)["TresPerNode"] == stored("gres:mps:150")
            hooked.run(["scancel", str(job_id)], check=False)
        else:
            # The plugin keeps the facts it had and says so.
            assert "keeping the facts loaded before" in new_log
            assert result.returncode != 0
            assert gpushare_lines(result.stderr)[0].startswith(
                "sbatch: error: gpushare: --gres=mps:150 ")
    finally:
        with open(hooked.facts_path, "w") as handle:
            handle.write(good)
        _reload(hooked)
    result = submit(hooked, "--hold", "--gres=mps:150")
    assert result.returncode != 0
    assert gpushare_lines(result.stderr)[0].startswith("sbatch: error: gpushare: --gres=mps:150 ")
