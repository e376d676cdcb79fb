# SPDX-License-Identifier: GPL-2.0-or-later
"""Demand that can start: only jobs that wait for resources count, on the nodes of their
partitions, their wait weighs up to a bound, and no user or account counts for more than
its share."""

from __future__ import annotations

from datetime import datetime

from gpushare.admin.mig_profiles import find_model
from gpushare.admin.relayout.decide import (
    MAX_WAIT_S,
    MIN_SHARE_GPUS,
    GpuState,
    Request,
    decide,
    request_values,
    share_cap,
    wait_weight,
)
from gpushare.admin.relayout.demand import parse_partitions, read_queue
from gpushare.admin.relayout.menu import Menu, MenuItem, parse_layout

H100 = find_model("h100-80gb")
NOW = datetime(2026, 1, 2, 12, 0, 0)

# squeue -h -t PD -o "%i|%b|%V|%P|%u|%a|%r" as Slurm 22.05 prints it (gres:gpu:..., no
# accounting: account "(null)"; job 107's reason as 22.05.8 gave a job whose type only
# drained nodes had), and 24.11 (gres/gpu:...).
SQUEUE_22_05 = """\
101|gres:gpu:3g.40gb:1|2026-01-01T12:00:00|debug|alice|(null)|JobHeldUser
102|gres:gpu:3g.40gb:1|2026-01-01T12:00:00|debug|alice|(null)|JobHeldAdmin
103|gres:gpu:3g.40gb:1|2026-01-02T11:59:00|debug|alice|(null)|Dependency
104|gres:gpu:3g.40gb:1|2026-01-02T11:59:00|debug|alice|(null)|BeginTime
105|gres:gpu:1g.10gb:1|2026-01-02T11:50:00|debug|bob|(null)|Resources
106|gres:gpu:1g.10gb:2|2026-01-02T11:58:00|debug,gpu|carol|(null)|Priority
107|gres:gpu:1g.10gb:1|2026-01-02T11:58:00|debug|dave|(null)|ReqNodeNotAvail, UnavailableNodes:n3
109|gres:gpu:1g.10gb:1|2026-01-02T11:58:00|debug|erin|(null)|PartitionTimeLimit
108|gres:gpu:1g.10gb:1|2026-01-02T11:58:00|nosuch|dave|(null)|Resources
"""
SQUEUE_24_11 = """\
201|gres/gpu:3g.40gb:1|2026-01-01T12:00:00|gpu|alice|physics|JobHeldUser
202|gres/gpu:1g.10gb:1|2026-01-02T11:50:00|gpu|bob|chem|Resources
203|gres/gpu:1g.10gb:1|2026-01-02T11:50:00|gpu|bob|chem|QOSMaxGRESPerUser
204|N/A|2026-01-02T11:50:00|gpu|bob|chem|Priority
"""
# sinfo -h -a -o "%R|%N": a line per partition and node state.
SINFO = "debug|n[1-2]\ndebug|n3\ngpu|n3\nempty|\n"


def layout(text):
    parsed, why = parse_layout(text, H100)
    assert parsed is not None, why
    return parsed


def menu_of(*names):
    return Menu(tuple(MenuItem(layout(n), 0, 99, 1) for n in names), 0, 1)


def idle(layout_name, count, node="n1"):
    return [GpuState(node, i, "g", layout(layout_name), False, True) for i in range(count)]


def test_partitions_are_read_from_sinfo_once_per_state_line():
    assert parse_partitions(SINFO) == {"debug": frozenset({"n1", "n2", "n3"}),
                                       "gpu": frozenset({"n3"}), "empty": frozenset()}


def test_only_jobs_waiting_for_resources_count_on_the_nodes_of_their_partitions():
    queue = read_queue(SQUEUE_22_05, NOW, parse_partitions(SINFO))
    debug, both = frozenset({"n1", "n2", "n3"}), frozenset({"n1", "n2", "n3"})
    assert queue.requests == [Request("105", "1g.10gb", 1, 600.0, debug, "bob", ""),
                              Request("106", "1g.10gb", 2, 120.0, both, "carol", ""),
                              Request("107", "1g.10gb", 1, 120.0, debug, "dave", "")]
    assert queue.skipped == {"held": 2, "dependency": 1, "--begin in the future": 1,
                             "reason PartitionTimeLimit": 1,
                             "partition nosuch unknown or without nodes": 1}
    later = read_queue(SQUEUE_24_11, NOW, parse_partitions(SINFO))
    assert later.requests == [Request("202", "1g.10gb", 1, 600.0, frozenset({"n3"}), "bob",
                                      "chem")]
    assert later.skipped == {"held": 1, "reason QOSMaxGRESPerUser": 1}


def test_held_dependent_and_begin_jobs_do_not_move_the_layout():
    # Four day-old jobs for 3g.40gb that cannot start, twenty fresh ones for 1g.10gb that can.
    lines = [f"{i}|gres:gpu:3g.40gb:1|2026-01-01T12:00:00|debug|alice|(null)|{reason}"
             for i, reason in enumerate(("JobHeldUser", "JobHeldAdmin", "Dependency",
                                         "BeginTime"))]
    lines += [f"{10 + i}|gres:gpu:1g.10gb:1|2026-01-02T12:00:00|debug|u{i}|(null)|Resources"
              for i in range(20)]
    queue = read_queue("\n".join(lines), NOW, parse_partitions(SINFO))
    menu = {"g": menu_of("7x1g.10gb", "2x3g.40gb")}
    decision = decide(queue.requests, idle("2x3g.40gb", 4), menu)
    assert {c.new for c in decision.changes} == {"7x1g.10gb"}
    # The same jobs, all waiting for resources, would have taken the GPUs the other way.
    counted = read_queue("\n".join(lines).replace("JobHeldUser", "Resources")
                         .replace("JobHeldAdmin", "Resources").replace("Dependency", "Priority")
                         .replace("BeginTime", "Priority"), NOW, parse_partitions(SINFO))
    assert decide(counted.requests, idle("7x1g.10gb", 4), menu).changes


def test_a_partition_without_the_node_does_not_move_its_gpus():
    menu = {"g": menu_of("7x1g.10gb", "2x3g.40gb")}
    elsewhere = [Request(str(j), "3g.40gb", 1, 1200, frozenset({"n2"}), f"u{j}")
                 for j in range(4)]
    assert decide(elsewhere, idle("7x1g.10gb", 2), menu).changes == []
    here = [Request(str(j), "3g.40gb", 1, 1200, frozenset({"n1", "n2"}), f"u{j}")
            for j in range(4)]
    assert [c.node for c in decide(here, idle("7x1g.10gb", 2), menu).changes] == ["n1", "n1"]


def test_a_wait_weighs_up_to_its_bound():
    assert wait_weight(0) == 1.0 and wait_weight(600) == 2.0
    assert wait_weight(4 * 86400) == wait_weight(MAX_WAIT_S) == 7.0
    assert wait_weight(MAX_WAIT_S / 2) < wait_weight(MAX_WAIT_S)


def test_the_share_cap_holds_each_owner_to_a_quarter_of_what_all_count():
    # Eight owners of 1 each and one of 100: capped, the large one counts as much as the
    # others' quarter share allows: c = 0.25 (8 + c) -> 8/3, over the floor.
    cap = share_cap([100.0] + [1.0] * 8)
    assert abs(cap - 8 / 3) < 1e-9
    assert abs(cap - 0.25 * (8 + cap)) < 1e-9
    assert share_cap([1.0] * 8) == float("inf")  # nobody over a quarter
    assert share_cap([100.0]) == MIN_SHARE_GPUS  # alone: the floor
    assert share_cap([100.0, 1.0]) == MIN_SHARE_GPUS


def test_one_user_flooding_the_queue_does_not_steer_the_layout():
    menu = {"g": menu_of("7x1g.10gb", "2x3g.40gb")}
    flood = [Request(f"m{j}", "3g.40gb", 1, MAX_WAIT_S, None, "mallory", "lab")
             for j in range(40)]
    others = [Request(f"o{j}", "1g.10gb", 1, 600, None, f"user{j % 5}", f"acct{j % 5}")
              for j in range(14)]
    # Without a cap mallory's 40 jobs would take every GPU to 2x3g.40gb.
    unnamed = [Request(r.job, r.kind, r.count, r.wait_s) for r in flood + others]
    assert {c.new for c in decide(unnamed, idle("7x1g.10gb", 4), menu).changes} == \
        {"2x3g.40gb"}
    decision = decide(flood + others, idle("7x1g.10gb", 4), menu)
    assert len(decision.changes) <= 2  # her two GPUs' worth (MIN_SHARE_GPUS), no more
    values = request_values(flood + others, {"3g.40gb": 3, "1g.10gb": 1})
    assert abs(sum(values[:40]) - MIN_SHARE_GPUS) < 1e-9
    assert values[40:] == [1 / 7 * 2] * 14  # the others count in full


def test_one_account_alone_is_not_held_back_as_a_whole():
    queue = [Request(str(j), "3g.40gb", 1, 600, None, f"u{j}", "everyone") for j in range(12)]
    values = request_values(queue, {"3g.40gb": 3})
    assert values == [3 / 7 * 2] * 12


def test_the_24_11_description_of_req_node_not_avail_counts_as_waiting():
    text = ("301|gres/gpu:1g.10gb:1|2026-01-02T11:50:00|gpu|bob|chem|UNLIMITED|Nodes required "
            "for job are DOWN, DRAINED or reserved for jobs in higher priority partitions\n")
    queue = read_queue(text, NOW, parse_partitions(SINFO))
    assert [r.job for r in queue.requests] == ["301"] and queue.skipped == {}
