# SPDX-License-Identifier: GPL-2.0-or-later
"""What a pending job asks of one node, from each squeue form (``relayout/jobgres.py``):
GPUs per node (``--gres``, tres-per-node), per job (``--gpus``, tres-per-job) and per task
(``--gpus-per-task``, tres-per-task), as Slurm 22.05 and 23.11+ write them; a line that
does not read counts nothing and the round goes on."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpushare.admin.relayout.decide import Request
from gpushare.admin.relayout.demand import (
    SQUEUE_FORMAT,
    parse_partitions,
    parse_request,
    parse_submitted,
    pending,
    read_queue,
)
from gpushare.admin.relayout.jobgres import FIELDS, JobLine, gres_items, parse_line, per_node

NOW = datetime(2026, 1, 2, 12, 0, 0)
SINFO = "gpu|n[1-4]\n"
GPU = frozenset({"n1", "n2", "n3", "n4"})


def line(job: str, per_node_: str = "N/A", nodes: str = "1", tasks: str = "1",
         per_job: str = "N/A", per_task: str = "N/A", reason: str = "Resources",
         submitted: str = "2026-01-02T11:50:00") -> str:
    """One line of ``squeue -h -O SQUEUE_FORMAT``."""
    return "|".join([job, per_node_, submitted, "gpu", "alice", "physics", "1:00:00", nodes,
                     tasks, per_job, per_task, reason])


def asked(text: str) -> list[tuple[str, str, int]]:
    queue = read_queue(text, NOW, parse_partitions(SINFO))
    return [(r.job, r.kind, r.count) for r in queue.requests]


def test_the_format_names_fields_every_release_knows_and_prints_them_whole():
    assert SQUEUE_FORMAT == (
        "JobArrayID:|,tres-per-node:|,SubmitTime:|,Partition:|,UserName:|,Account:|,"
        "TimeLimit:|,NumNodes:|,NumTasks:|,tres-per-job:|,tres-per-task:|,Reason:0")
    assert len(FIELDS) == 12 and FIELDS[-1] == "Reason"


@pytest.mark.parametrize("prefix", ["gres:", "gres/"])  # 22.05, 23.11 and later
def test_per_node_requests_count_as_they_are_even_on_several_nodes(prefix):
    text = (line("1", f"{prefix}gpu:3g.40gb:2") + "\n"
            + line("2", f"{prefix}gpu:h100:8", nodes="4", tasks="4") + "\n"
            + line("3", f"{prefix}mps:25") + "\n"
            + line("4", f"{prefix}gpu:2") + "\n"
            + line("5", f"{prefix}gpu:h100:1,{prefix}gpu:1G.10GB:1") + "\n")
    assert asked(text) == [("1", "3g.40gb", 2), ("2", "whole", 8), ("3", "mps", 25),
                           ("4", "whole", 2), ("5", "whole", 1), ("5", "1g.10gb", 1)]


@pytest.mark.parametrize("prefix", ["gres:", "gres/"])
def test_per_job_requests_spread_over_the_jobs_nodes(prefix):
    text = "\n".join([
        line("1", per_job=f"{prefix}gpu:h100:32", nodes="4"),  # 8 a node
        line("2", per_job=f"{prefix}gpu:h100:9", nodes="4"),  # at least 3 on one node
        line("3", per_job=f"{prefix}gpu:3g.40gb:2"),  # one node
        line("4", per_job=f"{prefix}gpu:4", nodes="0"),  # nodes unset: one node's worth
        line("5", per_job=f"{prefix}gpu:1g.10gb:3", nodes="4294967294"),  # NO_VAL: the same
    ])
    assert asked(text) == [("1", "whole", 8), ("2", "whole", 3), ("3", "3g.40gb", 2),
                           ("4", "whole", 4), ("5", "1g.10gb", 3)]


def test_per_task_requests_count_the_tasks_of_one_node():
    text = "\n".join([
        line("1", per_task="gres:gpu:h100:1", tasks="16", nodes="2"),  # 22.05: 8 a node
        line("2", per_task="gres/gpu:h100=1", tasks="16", nodes="1"),  # 23.11+: all 16
        line("3", per_task="cpu=4,gres/gpu:1g.10gb=2", tasks="3", nodes="2"),  # 2 tasks × 2
        line("4", per_task="gres/gpu=1", tasks="5", nodes="2"),  # untyped: 3 tasks
        line("5", per_task="gres/gpu:3g.40gb:1", tasks="0"),  # tasks unset: one task
    ])
    assert asked(text) == [("1", "whole", 8), ("2", "whole", 16), ("3", "1g.10gb", 4),
                           ("4", "whole", 3), ("5", "3g.40gb", 1)]


def test_what_is_asked_per_node_is_not_counted_again_per_job_or_per_task():
    text = "\n".join([
        # --gpus=8 --gpus-per-node=2: the per-node field says what one node gets
        line("1", "gres/gpu:h100:2", nodes="4", per_job="gres/gpu:h100:8"),
        # --gpus=4 --gpus-per-task=2: 2 tasks; the total counts, once
        line("2", per_job="gres:gpu:3g.40gb:4", per_task="gres:gpu:3g.40gb:2", tasks="2"),
        # --gres=mps:25 with --gpus=2: different GRES, both count
        line("3", "gres/mps:25", per_job="gres/gpu:2"),
    ])
    assert asked(text) == [("1", "whole", 2), ("2", "3g.40gb", 4), ("3", "mps", 25),
                           ("3", "whole", 2)]


def test_the_requests_keep_the_jobs_wait_owner_limit_and_nodes():
    queue = read_queue(line("7", per_job="gres/gpu:1g.10gb:2"), NOW, parse_partitions(SINFO))
    assert queue.requests == [Request("7", "1g.10gb", 2, 600.0, GPU, "alice", "physics",
                                      3600.0)]
    assert [(ago, r.job) for ago, r in queue.recent] == [(600.0, "7")]


def test_held_jobs_asking_per_job_or_per_task_still_do_not_count():
    text = "\n".join([line("1", per_job="gres/gpu:2", reason="JobHeldUser"),
                      line("2", per_task="gres/gpu=1", tasks="4", reason="Dependency")])
    queue = read_queue(text, NOW, parse_partitions(SINFO))
    assert queue.requests == [] and queue.skipped == {"held": 1, "dependency": 1}


@pytest.mark.parametrize("fields", [
    {"per_node_": "gres/gpu:h100:two"},  # a count that is not one
    {"per_node_": "gres/gpu:a:b:2"},  # too many parts
    {"per_node_": "gres/gpu::2"},  # an empty type
    {"per_job": "gres/gpu:h100=x"},
    {"per_job": "gres/gpu:4", "nodes": "four"},  # a node count that is not one
    {"per_task": "gres/gpu:1", "tasks": "1.5"},
    {"per_task": "gres/gpu:h100:1:2=3"},
])
def test_a_job_whose_request_does_not_read_counts_nothing_and_the_round_goes_on(fields):
    text = line("1", **fields) + "\n" + line("2", "gres/gpu:1g.10gb:1") + "\n"
    queue = read_queue(text, NOW, parse_partitions(SINFO))
    assert [r.job for r in queue.requests] == ["2"]
    assert queue.skipped == {"GPU request unreadable": 1}


def test_lines_of_neither_form_and_requests_of_nothing_are_left_out():
    text = "\n".join(["", "garbage", "1|2|3", line("1"), line("2", "gres/nic:ib:1",
                                                             per_task="cpu=4,license/x=1"),
                      line("3", "gres/gpu:0"), line("4", "(null)", per_job="(null)")])
    queue = read_queue(text, NOW, parse_partitions(SINFO))
    assert queue.requests == [] and queue.skipped == {}


def test_the_older_lines_without_the_new_fields_read_as_before():
    old = "9|gres:gpu:3g.40gb:2|2026-01-02T11:50:00|gpu|bob|(null)|Resources\n"
    with_limit = "9|gres/gpu:3g.40gb:2|2026-01-02T11:50:00|gpu|bob|(null)|30:00|Priority\n"
    assert parse_line(old) == JobLine("9", "gres:gpu:3g.40gb:2", "2026-01-02T11:50:00", "gpu",
                                      "bob", "(null)", "", "Resources")
    expected = [Request("9", "3g.40gb", 2, 600.0, GPU, "bob", "")]
    assert read_queue(old, NOW, parse_partitions(SINFO)).requests == expected
    assert read_queue(with_limit, NOW, parse_partitions(SINFO)).requests == \
        [Request("9", "3g.40gb", 2, 600.0, GPU, "bob", "", 1800.0)]


def test_a_reason_with_commas_and_spaces_stays_whole():
    parsed = parse_line(line("5", per_job="gres/gpu:1", reason="ReqNodeNotAvail, "
                             "UnavailableNodes:n[3-4]"))
    assert parsed is not None and parsed.reason == "ReqNodeNotAvail, UnavailableNodes:n[3-4]"
    assert per_node(parsed) == [("whole", 1)]


def test_gres_items_read_each_form():
    assert gres_items("gres:gpu:1g.10gb:2,gres:mps:h100:50") == [
        ("gpu", "1g.10gb", 2), ("mps", "mps", 50)]
    assert gres_items("gres/gpu:H100=1k,gres/shard:4,cpu=2") == [("gpu", "whole", 1024)]
    assert gres_items("gpu:1g.10gb") == [("gpu", "1g.10gb", 1)]  # no count: one
    assert gres_items("gpu:h100:1(IDX:0)") == [("gpu", "whole", 1)]
    assert gres_items("N/A") == gres_items("(null)") == gres_items("") == []
    assert gres_items("gres/gpu:h100:x") is None


def test_parse_request_reads_a_per_node_field_and_nothing_from_garbage():
    assert parse_request("1", "gres/gpu:3g.40gb:2", 5.0) == [Request("1", "3g.40gb", 2, 5.0)]
    assert parse_request("1", "gres/gpu:3g.40gb:zz", 5.0) == []


def test_recent_submissions_read_per_job_and_per_task_requests_too():
    running = "\n".join([
        line("1", per_job="gres/gpu:1g.10gb:4", nodes="2", reason="None",
             submitted="2026-01-02T11:40:00"),
        line("2", per_task="gres/gpu:h100=1", tasks="2", reason="None",
             submitted="2026-01-02T11:59:00"),
        line("3", per_job="gres/gpu:nope:x", reason="None", submitted="2026-01-02T11:59:00"),
    ])
    assert [(ago, r.job, r.kind, r.count) for ago, r in parse_submitted(running, NOW)] == [
        (1200.0, "1", "1g.10gb", 2), (60.0, "2", "whole", 2)]


def test_pending_asks_squeue_for_the_long_format(tmp_path):
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\n"
                      f"[ \"$4\" = -O ] && [ \"$5\" = '{SQUEUE_FORMAT}' ] || exit 3\n"
                      f"echo '{line('1', per_job='gres/gpu:1g.10gb:2')}'\n")
    squeue.chmod(0o755)
    assert [(r.job, r.kind, r.count) for r in pending(str(squeue), now=NOW).requests] == \
        [("1", "1g.10gb", 2)]
