# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare explain``: flags to job_desc fields the way sbatch fills them, then the rules."""

from __future__ import annotations

import json

import pytest

from gpushare.cli import main
from gpushare.cli.explain import FlagError, flags_to_job, time_str2secs
from gpushare.submit.facts import load_facts
from gpushare.submit.rules import NO_VAL
from luahook import facts_path


def test_flags_to_fields_2205():
    facts = load_facts(facts_path("h100-2205"))
    job, ignored = flags_to_job(
        ["--gres=gpu:1g.10gb:1,shard:2", "--gpus=h100:4", "--gpus-per-task", "1",
         "--gpus-per-socket=2", "-N", "2-4", "-n8", "--switches=1@5:00", "--array=1-10%2",
         "--gpu-share=25", "--gpu-mps", "--mem=4G"], facts)
    assert job["tres_per_node"] == "gres:gpu:1g.10gb:1,gres:shard:2"
    assert job["tres_per_job"] == "gres:gpu:h100:4"
    assert job["tres_per_task"] == "gres:gpu:1"
    assert job["tres_per_socket"] == "gres:gpu:2"
    assert (job["min_nodes"], job["max_nodes"], job["num_tasks"]) == (2, 4, 8)
    assert (job["req_switch"], job["wait4switch"]) == (1, 300)
    assert job["array_inx"] == "1-10%2"
    assert job["spank_job_env"] == ["_SLURM_SPANK_OPTION_gpushare_gpu_share=25",
                                    "_SLURM_SPANK_OPTION_gpushare_gpu_mps="]
    assert ignored == ["--mem=4G"]


def test_flags_to_fields_2311_and_defaults():
    facts = load_facts(facts_path("a100-2311"))
    job, _ = flags_to_job(["--gpus-per-task=a100:2", "--gpus-per-node=2"], facts)
    assert job["tres_per_task"] == "gres/gpu:a100=2"
    assert job["tres_per_node"] == "gres/gpu:2"
    assert job["min_nodes"] == job["req_switch"] == job["wait4switch"] == NO_VAL


@pytest.mark.parametrize("text, seconds", [
    ("5", 300), ("5:30", 330), ("1:00:00", 3600), ("1-2", 93600), ("1-0:30", 88200),
    ("1-00:00:10", 86410),
])
def test_time_str2secs(text, seconds):
    assert time_str2secs(text) == seconds


def test_bad_flags():
    facts = load_facts(facts_path("h100-2205"))
    for flags in (["-N", "two"], ["--switches=a"], ["--switches=1@soon"], ["-n", "x"]):
        with pytest.raises(FlagError):
            flags_to_job(flags, facts)


def test_cli_words_and_json(capsys):
    path = facts_path("h100-2205")
    assert main(["explain", "--facts", path, "--", "-N", "3", "--gres=gpu:h100:8"]) == 0
    out = capsys.readouterr().out
    assert "req_switch: (unset) -> 2" in out
    assert ("the user sees: gpushare: --switches=2@5:00 (3 nodes need 2 NVLink domains of "
            "at most 2 nodes)") in out
    assert "untyped GPU requests: whole (written in as h100, never a MIG slice)" in out
    assert main(["explain", "--facts", path, "--json", "--", "--gres=mps:150"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["decision"]["reject"]["code"] == 2072
    assert main(["explain", "--facts", "/nonexistent/facts.json", "--", "-N2"]) == 2
    assert "cannot read" in capsys.readouterr().out


@pytest.mark.parametrize("gres", ["gpu:1,mps:25", "gpu:::", "gpu:h100:-1", ":1", "mps:25,gpu:1"])
def test_requests_the_clients_refuse_get_slurms_answer(capsys, gres):
    """sbatch/srun refuse these before any hook runs: explain says what Slurm answers, not
    a gpushare message the user never sees."""
    path = facts_path("h100-2205")
    assert main(["explain", "--facts", path, "--", f"--gres={gres}"]) == 1
    out = capsys.readouterr().out
    assert ("the user sees: sbatch: error: Invalid generic resource (gres) specification"
            in out)
    assert "the user sees: gpushare:" not in out
    assert main(["explain", "--facts", path, "--json", "--", f"--gres={gres}"]) == 1
    assert json.loads(capsys.readouterr().out)["client_refusal"] == (
        "error: Invalid generic resource (gres) specification")


@pytest.mark.parametrize("share", ["0", "101", "abc", "25%", "2_5", ""])
def test_a_share_the_clients_refuse_gets_the_plugins_answer(capsys, share):
    """sbatch/srun's gpushare plugin refuses these itself (the job is never submitted):
    explain shows that message, not the hooks' rejection at submit."""
    path = facts_path("h100-2205")
    assert main(["explain", "--facts", path, "--", f"--gpu-share={share}"]) == 1
    out = capsys.readouterr().out
    assert (f"the user sees: sbatch: error: gpushare: --gpu-share={share} is invalid: give a "
            "whole percent of one GPU from 1 to 100, e.g. --gpu-share=25") in out
    assert "rejected at submit" not in out


@pytest.mark.parametrize("share", ["1", "100", "+25", " 25"])
def test_a_share_the_clients_accept_reaches_the_hooks(capsys, share):
    path = facts_path("h100-2205")
    main(["explain", "--facts", path, "--json", "--", f"--gpu-share={share}"])
    assert json.loads(capsys.readouterr().out)["client_refusal"] is None


def test_a_type_starting_with_a_digit_reaches_the_hooks(capsys):
    path = facts_path("h100-2205")
    assert main(["explain", "--facts", path, "--", "--gres=gpu:1g.10gb"]) == 1
    out = capsys.readouterr().out
    assert ('the user sees: gpushare: --gres item "gpu:1g.10gb" has no count, and Slurm '
            "reads a type that starts with a digit as a count; write the count after it, "
            "e.g. --gres=gpu:1g.10gb:1") in out


@pytest.mark.parametrize("uid", [0, 1000])
def test_roots_share_is_accepted_as_anyones(capsys, uid):
    path = facts_path("h100-2205")
    assert main(["explain", "--facts", path, "--uid", str(uid), "--", "--gres=mps:10"]) == 0
    assert "result: accepted unchanged" in capsys.readouterr().out


def test_explain_says_whether_an_untyped_gpu_gets_the_feature_or_is_refused(capsys):
    """Whole types and MIG slices on other nodes: the feature is added (to --constraint
    too); where a node has both, the request is refused and the type asked for."""
    assert main(["explain", "--facts", facts_path("split-mig-2205"), "--uid", "1000", "--",
                 "--gres=gpu:4", "--constraint=ib|eth"]) == 0
    out = capsys.readouterr().out
    assert ("untyped GPU requests: whole (kept on the nodes with feature gpushare_whole, "
            "whose Slurm GPUs are all whole: --constraint gets it added)") in out
    assert "  features: ib|eth -> (ib|eth)&gpushare_whole" in out
    assert main(["explain", "--facts", facts_path("mixed-mig-2205"), "--uid", "1000", "--",
                 "--gres=gpu:4"]) == 1
    out = capsys.readouterr().out
    assert ("untyped GPU requests: whole (refused: Slurm owns several whole-GPU types, a node "
            "has both them and MIG slices here; the user must name the type)") in out
    assert "name the type, e.g. --gres=gpu:a100:4" in out


def test_only_the_last_gres_counts_as_in_sbatch_and_srun(capsys):
    """Two --gres flags are not one request: the clients keep the last (22.05 and 26.05:
    --gres=gpu:1g.10gb:2 --gres=mps:10 is a job of mps:10 alone)."""
    facts = load_facts(facts_path("h100-2205"))
    job, ignored = flags_to_job(["--gres=gpu:1g.10gb:2", "--gres=mps:10"], facts)
    assert job["tres_per_node"] == "gres:mps:10"
    assert ignored == ["--gres=gpu:1g.10gb:2 (a later --gres replaces it)"]
    path = facts_path("h100-2205")
    main(["explain", "--facts", path, "--json", "--", "--gres=gpu:1g.10gb:2",
          "--gres=mps:10"])
    assert json.loads(capsys.readouterr().out)["client_refusal"] is None


def test_flags_before_the_separator_get_a_hint(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--facts", facts_path("h100-2205"), "--gres=mps:25"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gpushare explain")
    assert ("gpushare explain: error: unrecognized arguments: --gres=mps:25; put the job's "
            "sbatch/srun flags after --, e.g. gpushare explain -- --gres=mps:25") in err
    with pytest.raises(SystemExit):
        main(["render", "gres", "--plan", "p.yaml", "--bogus"])
    assert "gpushare render: error: unrecognized arguments: --bogus\n" in capsys.readouterr().err


def test_json_shows_unset_fields_as_null(capsys):
    path = facts_path("h100-2205")
    assert main(["explain", "--facts", path, "--json", "--", "--gres=mps:25"]) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert job["min_nodes"] is None and job["wait4switch"] is None
    assert NO_VAL not in job.values()
    assert main(["explain", "--facts", path, "--json", "--", "-N", "3",
                 "--gres=gpu:h100:8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["job"]["min_nodes"] == 3 and result["job"]["req_switch"] is None
    assert result["decision"]["changes"]["req_switch"] == 2


def test_a_share_beside_typed_whole_gpus_keeps_the_type_in_the_example(capsys):
    path = facts_path("h100-2205")
    assert main(["explain", "--facts", path, "--", "--gpu-share=30",
                 "--gres=gpu:h100:1"]) == 1
    assert ("ask for the share alone, or for whole GPUs alone, e.g. --gres=gpu:h100:1"
            in capsys.readouterr().out)
