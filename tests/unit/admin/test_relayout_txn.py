# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --apply`` as a transaction, against the fake slurmctld and the real
node's step (simulated NVML): one run at a time, the journal before the first drain, a run
killed between its steps finished or rolled back by the next, slurm.conf checked before
anything is drained, Slurm 22.05's partly restored node resumed, and nodes that fail alone."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import replace

import pytest
from tests.unit.admin.relayout_site import Clock, decision, layout_of, make_site, run

from gpushare.admin.relayout.controller import RelayoutError, recover
from gpushare.admin.relayout.journal import (
    JournalError,
    LockBusy,
    journal_path,
    load_journal,
    run_lock,
)
from gpushare.admin.relayout.noderound import NodeRound
from gpushare.admin.relayout.slurmconf import node_gres_in
from gpushare.admin.relayout.slurmsync import SlurmSync
from gpushare.admin.relayout.state import load_state
from gpushare.gpu.inventory import load_nvml

WHOLE_1G = ["1g.10gb"] * 7
NEW_3G = ["3g.40gb", "3g.40gb"]


class Killed(BaseException):
    """The controller killed at this point (nothing after it runs, no handler sees it)."""


@pytest.fixture
def site(tmp_path):
    return make_site(tmp_path)


def repair(plan, settings, slurm):
    journal = load_journal(settings.state_path)
    assert journal is not None and journal.open_nodes
    clock = Clock()
    return recover(plan, journal, slurm, settings, clock=clock, sleep=clock.sleep,
                   wall=lambda: 6000.0)


def gres_line(settings, node="h1"):
    with open(settings.slurm_conf) as handle:
        return node_gres_in(handle.read(), node)


def test_a_second_run_is_told_who_holds_the_lock_and_acts_on_nothing(site, tmp_path):
    _plan, settings, _profile, _slurm = site
    busy = pytest.raises(LockBusy, match=rf"another gpushare relayout or tidal --apply runs "
                                         rf"\(\{{\"pid\": {os.getpid()}, \"host\"")
    with run_lock(settings.state_path), busy, run_lock(settings.state_path):
        pass  # pragma: no cover - never reached
    with run_lock(settings.state_path):  # released once the first run ended
        pass


def test_the_holder_is_named_by_a_command_that_can_be_typed_again(site, monkeypatch):
    _plan, settings, _profile, _slurm = site
    argv = ["gpushare", "relayout", "--apply", "--node-command", "ssh {node} step"]
    monkeypatch.setattr(sys, "argv", argv)
    with run_lock(settings.state_path), pytest.raises(LockBusy) as busy, \
            run_lock(settings.state_path):
        pass  # pragma: no cover - never reached
    holder = json.loads(str(busy.value).split("runs (", 1)[1].split("; lock ", 1)[0])
    assert shlex.split(holder["command"]) == argv


def test_a_lock_this_user_may_not_open_says_who_may(site, monkeypatch):
    _plan, settings, _profile, _slurm = site
    real_open = os.open

    def denied(name, *args, **kwargs):
        if str(name).endswith(".run.lock"):
            raise PermissionError(13, "Permission denied", name)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    lock = settings.state_path + ".run.lock"
    with pytest.raises(JournalError, match=rf"cannot open {lock}: Permission denied; .* as "
                                           "root on the controller host"), \
            run_lock(settings.state_path):
        pass  # pragma: no cover - never reached


def test_the_lock_is_never_a_users_symlink(site, tmp_path):
    _plan, settings, _profile, _slurm = site
    elsewhere = tmp_path / "elsewhere"
    os.symlink(elsewhere, settings.state_path + ".run.lock")
    with pytest.raises(JournalError, match="is a symbolic link; remove it"), \
            run_lock(settings.state_path):
        pass  # pragma: no cover - never reached
    assert not elsewhere.exists()


def test_the_journal_is_written_before_the_first_drain_and_removed_at_the_end(site):
    plan, settings, profile, slurm = site
    seen = []
    drain = slurm.drain

    def drain_and_look(name, reason):
        seen.append(load_journal(settings.state_path))
        drain(name, reason)

    slurm.drain = drain_and_look
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.resumed and layout_of(profile, 2) == NEW_3G
    [journal] = seen
    assert journal is not None and journal.decision == "r1"
    [entry] = journal.nodes
    assert (entry.node, entry.phase, [(g.gpu, g.old, g.new, g.status) for g in entry.gpus]) \
        == ("h1", "planned", [(2, "7x1g.10gb", "2x3g.40gb", "planned")])
    assert not os.path.exists(journal_path(settings.state_path))


def test_a_run_killed_after_the_drain_is_rolled_back_by_the_next(site):
    plan, settings, profile, slurm = site
    node = slurm.node
    polls = []

    def killed_on_first_poll(name):
        polls.append(name)
        if len(polls) == 2:  # start() looked, drained; the wait for idle dies
            raise Killed()
        return node(name)

    slurm.node = killed_on_first_poll
    with pytest.raises(Killed):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    slurm.node = node
    assert "DRAIN" in slurm.state["h1"]
    [outcome] = repair(plan, settings, slurm)
    assert "DRAIN" not in slurm.state["h1"] and slurm.calls[-1] == "resume h1"
    assert layout_of(profile, 2) == WHOLE_1G and outcome.failed is None
    assert load_journal(settings.state_path) is None


def test_a_rolled_back_node_is_waited_for_until_slurmctld_hears_from_it(site):
    """Slurm may show a resumed node NOT_RESPONDING until its ping answers: the run that rolled
    it back waits for that (bounded), so the round it decides next sees the node in service."""
    plan, settings, profile, slurm = site
    polls = []
    node = slurm.node

    def killed_on_first_poll(name):
        polls.append(name)
        if len(polls) == 2:
            raise Killed()
        return node(name)

    slurm.node = killed_on_first_poll
    with pytest.raises(Killed):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    away = {"polls": 3}

    def pinged_late(name):
        found = node(name)
        if "resume h1" in slurm.calls and away["polls"] > 0:
            away["polls"] -= 1
            return replace(found, states=(*found.states, "NOT_RESPONDING"))
        return found

    slurm.node = pinged_late
    [outcome] = repair(plan, settings, slurm)
    assert away["polls"] == 0 and outcome.failed is None
    assert "NOT_RESPONDING" not in slurm.node("h1").states
    assert not any("still shows" in line for line in outcome.log), outcome.log
    # A node that never answers within --settle-timeout is only said: the roll-back stands.
    slurm.node = killed_on_first_poll
    polls.clear()
    with pytest.raises(Killed):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    slurm.node = lambda name: replace(node(name), states=("IDLE", "NOT_RESPONDING"))
    [outcome] = repair(plan, settings, slurm)
    assert outcome.failed is None and load_journal(settings.state_path) is None
    assert any("not in service, after" in line for line in outcome.log), outcome.log
    assert layout_of(profile, 2) == WHOLE_1G


def _destroy_all(profile, index):
    """What a step killed between destroying and creating leaves: a GPU with no instances."""
    nvml = load_nvml(f"sim:{profile}")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    for gi_id in range(15):
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        except nvml.NVMLError:
            continue
        for ci_id in range(8):
            try:
                nvml.nvmlComputeInstanceDestroy(
                    nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
            except nvml.NVMLError:
                continue
        nvml.nvmlGpuInstanceDestroy(gi)


def _kill_after_the_destroy(site, monkeypatch) -> None:
    """A run killed once GPU 2's instances are destroyed and before any is created."""
    plan, settings, profile, slurm = site

    def killed_mid_step(self, change, layout, others=None):
        _destroy_all(profile, change.index)
        raise Killed()

    with monkeypatch.context() as patch:
        patch.setattr(NodeRound, "_run_step", killed_mid_step)
        with pytest.raises(Killed):
            run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))


def test_a_run_killed_after_the_destroy_is_finished_by_the_next(site, monkeypatch):
    plan, settings, profile, slurm = site

    _kill_after_the_destroy(site, monkeypatch)
    assert layout_of(profile, 2) == []  # no instances, the node drained, the state unaware
    assert ("h1", 2) not in load_state(settings.state_path).gpus
    [entry] = load_journal(settings.state_path).nodes
    assert entry.phase == "changing" and entry.gpus[0].status == "started"
    [outcome] = repair(plan, settings, slurm)
    assert outcome.failed is None and [c.new for c in outcome.applied] == ["2x3g.40gb"]
    assert layout_of(profile, 2) == NEW_3G
    assert load_state(settings.state_path).gpus[("h1", 2)].layout == "2x3g.40gb"
    assert "3g.40gb:2" in gres_line(settings) and "3g.40gb:2" in slurm.gres["h1"]
    assert "DRAIN" not in slurm.state["h1"] and load_journal(settings.state_path) is None


def test_a_finished_node_is_waited_for_until_slurmctld_hears_from_it(site, monkeypatch):
    """As a rolled-back node: a node whose change the next run finished is back in service
    (not NOT_RESPONDING) before that run decides its own round, which counts its new GPUs."""
    plan, settings, profile, slurm = site

    _kill_after_the_destroy(site, monkeypatch)
    node, away = slurm.node, {"polls": 3}

    def pinged_late(name):
        found = node(name)
        if slurm.calls and slurm.calls[-1] == "resume h1" and away["polls"] > 0:
            away["polls"] -= 1
            return replace(found, states=(*found.states, "NOT_RESPONDING"))
        return found

    slurm.node = pinged_late
    [outcome] = repair(plan, settings, slurm)
    assert outcome.failed is None and [c.new for c in outcome.applied] == ["2x3g.40gb"]
    assert away["polls"] == 0, "the run ended before slurmctld heard from the node"
    assert "NOT_RESPONDING" not in slurm.node("h1").states
    assert layout_of(profile, 2) == NEW_3G


def test_a_run_killed_while_it_waits_for_a_finished_node_leaves_it_settled(site, monkeypatch):
    """The node is finished and resumed before the wait: a run killed during the wait has
    marked it done, so the next run does not drain the healthy node again."""
    plan, settings, profile, slurm = site

    _kill_after_the_destroy(site, monkeypatch)
    node = slurm.node

    def killed_while_away(name):
        if slurm.calls and slurm.calls[-1] == "resume h1":
            raise Killed()
        return node(name)

    slurm.node = killed_while_away
    with pytest.raises(Killed):
        repair(plan, settings, slurm)
    slurm.node = node
    journal = load_journal(settings.state_path)
    assert journal is None or not journal.open_nodes, journal
    assert layout_of(profile, 2) == NEW_3G and "DRAIN" not in slurm.state["h1"]


def test_a_round_killed_midway_on_a_one_profile_slurm_is_finished_whole(site, monkeypatch):
    plan, settings, profile, slurm = site
    settings.one_profile_per_node = True

    def killed_mid_step(self, change, layout, others=None):
        _destroy_all(profile, change.index)
        raise Killed()

    with monkeypatch.context() as patch:
        patch.setattr(NodeRound, "_run_step", killed_mid_step)
        with pytest.raises(Killed):
            run(plan, settings, slurm, decision(("h1", 2, "whole"), ("h1", 3, "whole")))
    assert [g.status for g in load_journal(settings.state_path).nodes[0].gpus] == \
        ["started", "planned"]
    # The round the killed run began is finished whole: GPU 3, never started, too.
    [outcome] = repair(plan, settings, slurm)
    assert outcome.failed is None and sorted(c.index for c in outcome.applied) == [2, 3]
    assert layout_of(profile, 2) == layout_of(profile, 3) == "whole"
    assert "DRAIN" not in slurm.state["h1"] and load_journal(settings.state_path) is None


def test_a_gpu_that_takes_neither_layout_keeps_its_node_drained(site, monkeypatch):
    plan, settings, profile, slurm = site

    def killed_mid_step(self, change, layout, others=None):
        _destroy_all(profile, change.index)
        raise Killed()

    with monkeypatch.context() as patch:
        patch.setattr(NodeRound, "_run_step", killed_mid_step)
        with pytest.raises(Killed):
            run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    raw = json.loads(profile.read_text())
    raw["errors"] = {"nvmlDeviceCreateGpuInstanceWithPlacement": "INSUFFICIENT_RESOURCES"}
    profile.write_text(json.dumps(raw))
    [outcome] = repair(plan, settings, slurm)
    assert outcome.failed and "took neither 2x3g.40gb" in outcome.failed
    assert "DRAIN" in slurm.state["h1"] and "reconfigure" not in slurm.calls
    assert load_journal(settings.state_path) is None  # reported; the drain is for an admin


def test_a_run_killed_before_slurm_saw_the_change_is_finished_by_the_next(site, monkeypatch):
    plan, settings, profile, slurm = site
    with monkeypatch.context() as patch:
        patch.setattr(SlurmSync, "_make_slurm_see_it", lambda self: (_ for _ in ()).throw(
            Killed()))
        with pytest.raises(Killed):
            run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert layout_of(profile, 2) == NEW_3G and "1g.10gb:15" in gres_line(settings)
    assert load_journal(settings.state_path).nodes[0].phase == "slurm"
    [outcome] = repair(plan, settings, slurm)
    assert outcome.failed is None and "3g.40gb:2" in gres_line(settings)
    assert "DRAIN" not in slurm.state["h1"] and "3g.40gb:2" in slurm.gres["h1"]


def test_a_run_killed_between_nodes_settles_the_other_on_the_next(site):
    plan, settings, profile, slurm = site
    settings.parallel = 1
    node = slurm.node

    def h2_dies(name):
        if name == "h2" and "DRAIN" in slurm.state["h2"]:
            raise Killed()
        return node(name)

    slurm.node = h2_dies
    with pytest.raises(Killed):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb"), ("h2", 2, "2x3g.40gb")))
    slurm.node = node
    assert layout_of(profile, 2) == NEW_3G and "DRAIN" in slurm.state["h2"]
    journal = load_journal(settings.state_path)
    assert [(e.node, e.phase) for e in journal.nodes] == [("h1", "done"), ("h2", "planned")]
    outcomes = repair(plan, settings, slurm)
    assert [o.node for o in outcomes] == ["h2"] and "DRAIN" not in slurm.state["h2"]
    assert load_journal(settings.state_path) is None


def test_an_included_nodename_line_is_refused_before_anything_is_drained(site, tmp_path):
    plan, settings, _profile, slurm = site
    nodes = tmp_path / "nodes.conf"
    with open(settings.slurm_conf) as handle:
        conf = handle.read()
    nodes.write_text("".join(line for line in conf.splitlines(True)
                             if line.startswith("NodeName")))
    with open(settings.slurm_conf, "w") as handle:
        handle.write("".join(line for line in conf.splitlines(True)
                             if not line.startswith("NodeName")) + f"Include {nodes}\n")
    with pytest.raises(RelayoutError, match=rf"nothing drained: no NodeName line names h1 in "
                                            rf".*; it Includes {nodes}: .* name the included"):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert slurm.calls == [] and load_journal(settings.state_path) is None
    settings.slurm_conf = slurm.slurm_conf = str(nodes)  # the file holding the line: taken
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.resumed and "3g.40gb:2" in nodes.read_text()


def test_a_configless_slurm_without_the_file_is_refused_before_anything_is_drained(site):
    plan, settings, _profile, slurm = site
    settings.slurm_conf = "/run/slurm/conf/slurm.conf"
    settings.configless = True
    with pytest.raises(RelayoutError, match=r"slurmd's copy of a configless slurm\.conf"):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    settings.slurm_conf = os.path.join(os.path.dirname(settings.state_path), "absent.conf")
    with pytest.raises(RelayoutError, match=r"does not exist: this Slurm is configless "
                                            r"\(SlurmctldParameters=enable_configless\)"):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert slurm.calls == []


def test_a_symlinked_slurm_conf_is_written_through_and_stays_a_link(site, tmp_path):
    plan, settings, _profile, slurm = site
    real = tmp_path / "etc" / "slurm.conf"
    real.parent.mkdir(mode=0o755)
    os.replace(settings.slurm_conf, real)
    os.symlink(real, settings.slurm_conf)
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.resumed and os.path.islink(settings.slurm_conf)
    assert "3g.40gb:2" in real.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="root's checks of a symlink's target")
def test_a_symlink_to_a_users_file_is_refused_before_anything_is_drained(site, tmp_path):
    plan, settings, _profile, slurm = site
    mine = tmp_path / "users" / "slurm.conf"
    mine.parent.mkdir(mode=0o755)
    os.replace(settings.slurm_conf, mine)
    os.chown(mine, 65534, 65534)
    os.symlink(mine, settings.slurm_conf)
    with pytest.raises(RelayoutError, match=r"\(a symbolic link\): .* must be owned by root"):
        run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert slurm.calls == [] and os.path.islink(settings.slurm_conf)


def _wrapped(settings, tmp_path, rule):
    """The node's step behind a wrapper that answers for some GPUs itself (``rule``:
    python code on node, gpu, layout that exits, or falls through to the real step)."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("import os, sys\nnode, gpu, layout = sys.argv[1:4]\n" + rule
                       + "\nos.execv(sys.argv[4], sys.argv[4:])\n")
    settings.node_command = shlex.join([sys.executable, str(wrapper), "{node}", "{gpu}",
                                        "{layout}"]) + " " + settings.node_command


def test_slurm_22_05s_partly_restored_node_is_laid_back_and_resumed(site, tmp_path):
    plan, settings, profile, slurm = site
    settings.one_profile_per_node = True
    _wrapped(settings, tmp_path, "if gpu == '3' and layout == '2x3g.40gb':\n"
             "    print('GPU 3 is in use; kept 7x1g.10gb'); sys.exit(2)")
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb"),
                                                   ("h1", 3, "2x3g.40gb")))
    assert outcome.failed is None and outcome.resumed, outcome.log
    assert outcome.applied == [] and sorted(c.index for c, _ in outcome.restored) == [2, 3]
    assert layout_of(profile, 2) == WHOLE_1G and layout_of(profile, 3) == WHOLE_1G
    assert ("h1", 2) not in load_state(settings.state_path).gpus
    assert "DRAIN" not in slurm.state["h1"] and "1g.10gb:15" in gres_line(settings)


def test_one_nodes_failure_is_its_own(site, tmp_path):
    plan, settings, profile, slurm = site
    _wrapped(settings, tmp_path, "if node == 'h2':\n"
             "    print('NVML shows no instances'); sys.exit(3)")
    outcomes = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb"),
                                                   ("h2", 2, "2x3g.40gb")))
    by_node = {o.node: o for o in outcomes}
    assert by_node["h1"].resumed and layout_of(profile, 2) == NEW_3G
    assert by_node["h2"].failed and "layout is not known" in by_node["h2"].failed
    assert "DRAIN" in slurm.state["h2"] and "DRAIN" not in slurm.state["h1"]
    assert "3g.40gb:2" in gres_line(settings, "h1") and "1g.10gb:15" in gres_line(settings,
                                                                                  "h2")
    # Both were drained before either changed, so that both emptied at once.
    assert slurm.calls[:2] == ["drain h1", "drain h2"]



def test_a_killed_runs_node_someone_resumed_is_drained_again_and_never_resumed_unsettled(
        site, monkeypatch):
    plan, settings, profile, slurm = site

    def killed_mid_step(self, change, layout, others=None):
        _destroy_all(profile, change.index)
        raise Killed()

    with monkeypatch.context() as patch:
        patch.setattr(NodeRound, "_run_step", killed_mid_step)
        with pytest.raises(Killed):
            run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    slurm.resume("h1")  # an administrator put it back; jobs run on its other GPUs
    slurm.busy["h1"] = 10_000
    [outcome] = repair(plan, settings, slurm)
    assert slurm.calls[-3:-1] == ["resume h1", "drain h1"]  # drained again first
    assert outcome.failed and outcome.failed.startswith(
        "an interrupted run had begun changing its GPUs, and node h1's jobs still ran after "
        "--drain-timeout"), outcome.failed
    assert "DRAIN" in slurm.state["h1"] and layout_of(profile, 2) == []
