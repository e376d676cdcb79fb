# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal --apply``'s moves end to end, against a fake slurmctld, a stand-in API
server and a stand-in kubelet (real ``kubernetes`` client, real gRPC), with the real
``gpushare tidal holders`` run as the site's command would run it on the node: a window
opens and GPU 0 goes to Slurm; it closes and GPU 0 comes home; a pod that keeps the GPU
undoes the lend; a run killed midway is finished or undone by the next."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys

import pytest
from tests.unit.admin.relayout_site import Clock, FakeSlurm

from gpushare.admin.plan import parse_plan
from gpushare.admin.plan.lending import Device
from gpushare.admin.relayout.controller import Settings
from gpushare.admin.relayout.demand import read_queue
from gpushare.admin.tidal.apply import Mover, TidalSettings
from gpushare.admin.tidal.journal import MoveEntry, TidalJournal, load_journal, save_journal
from gpushare.admin.tidal.kube import KubeFence, api_from_kubeconfig, rule_name
from gpushare.admin.tidal.kube import Settings as KubeSettings
from gpushare.admin.tidal.round import run_round
from gpushare.admin.tidal.state import STATE_NAME, lent_report, load_state
from gpushare.admin.tidal.waiting import Waiting, read_kube_pending
from gpushare.gpu.nvml_sim_plan import profile_from_plan
from kube_standin.apiserver import ApiServer
from kube_standin.kubelet import Kubelet, Pod

PLAN = """version: 1
slurm: {version: "24.11"}
node_groups:
  - name: infer
    nodes: h[1-2]
    gpu_model: a100-40gb
    gpus: 2
    layout:
      0: {owner: kubernetes}
      1: {owner: slurm}
lending:
  - name: night
    home: kubernetes
    nodes: h1
    gpus: 0
    window: {from: "20:00", to: "08:00"}
    max_lent: 1
    reclaim_minutes: 30
    borrowers: [batch]
"""
SLURM_CONF = """\
ClusterName=x
NodeName=h[1-2] CPUs=2 RealMemory=1000 Gres=gpu:a100:1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES
"""
NIGHT = datetime.datetime(2026, 12, 5, 22, 0)
MORNING = datetime.datetime(2026, 12, 6, 8, 5)
GPU0 = Device("h1", 0)


class FakeReservations:
    def __init__(self) -> None:
        self.now: dict[str, tuple[str, datetime.datetime, int]] = {}

    def set(self, name, node, start, minutes) -> None:
        self.now[name] = (node, start, minutes)

    def clear(self, name) -> None:
        self.now.pop(name, None)


DAY_RULE = """  - name: day
    home: slurm
    nodes: h1
    gpus: 1
    window: {from: "08:00", to: "20:00"}
    max_lent: 1
    reclaim_minutes: 30
    borrowers: [serving]
"""


class Site:
    def __init__(self, tmp_path, mode: str = "dra", plan: str = PLAN) -> None:
        plan_file = tmp_path / "plan.yaml"
        plan_file.write_text(plan)
        self.plan = parse_plan(plan, str(plan_file))
        profile = profile_from_plan(self.plan, "h1")
        self.uuid0 = profile["gpus"][0]["uuid"]
        (tmp_path / "h1.json").write_text(json.dumps(profile))
        (tmp_path / "slurm.conf").write_text(SLURM_CONF)
        self.slurm = FakeSlurm(str(tmp_path / "slurm.conf"))
        self.slurm.gres = {"h1": "gpu:a100:1", "h2": "gpu:a100:1"}
        self.api = ApiServer()
        for node in ("h1", "h2"):
            self.api.add_node(node)
            self.api.add_slice(node, "gpu.nvidia.com", ["gpu-0", "gpu-1"])
        url = self.api.start()
        (tmp_path / "kubeconfig").write_text(self.api.kubeconfig(url))
        self.kubelet = Kubelet(str(tmp_path / "kubelet.sock"))
        self.kubelet.start()
        self.kube = KubeFence(api_from_kubeconfig(str(tmp_path / "kubeconfig")),
                              KubeSettings(mode=mode))
        holders = [sys.executable, "-m", "gpushare.cli", "tidal", "holders", "--gpu", "{gpu}",
                   "--slice", "{slice}", "--profile", "{profile}", "--dra", "{dra}",
                   "--socket", str(tmp_path / "kubelet.sock"), "--source",
                   f"sim:{tmp_path / 'h1.json'}"]
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..",
                                                       "..", "src"))
        self.settings = TidalSettings(
            slurm=Settings(slurm_conf=str(tmp_path / "slurm.conf"),
                           cluster_gres_conf=str(tmp_path / "gres.conf"),
                           state_path=str(tmp_path / "relayout-state.json"),
                           drain_timeout_s=60, settle_timeout_s=10, poll_s=0.0, env=env),
            holders_command=shlex.join(holders), release_timeout_s=3)
        self.state_path = str(tmp_path / STATE_NAME)
        self.clock = Clock()
        self.reservations = FakeReservations()
        self.mode = mode
        self.squeue = ""  # what `squeue -h -t PD -o SQUEUE_FORMAT` prints

    def run(self, when: datetime.datetime) -> Mover:
        journal = load_journal(self.state_path) or TidalJournal(self.state_path + ".journal")
        mover = Mover(self.plan, self.slurm, self.kube, self.settings,
                      load_state(self.state_path), journal, clock=self.clock,
                      sleep=self.clock.sleep, wall=lambda: when.timestamp(),
                      reservations=self.reservations)
        waiting = Waiting(lambda: read_queue(self.squeue, when),
                          lambda: read_kube_pending(self.kube.api,
                                                    "v1" if self.mode == "dra" else None))
        run_round(mover, when, {}, waiting)
        return mover

    def gres_conf(self) -> str:
        with open(self.settings.slurm.cluster_gres_conf) as handle:
            return handle.read()

    def stop(self) -> None:
        self.api.stop()
        self.kubelet.stop()


@pytest.fixture
def site(tmp_path):
    made = Site(tmp_path)
    yield made
    made.stop()


def metrics(site, capsys) -> str:
    from gpushare.cli import main

    assert main(["tidal", "--metrics", "--plan", site.plan.path]) == 0
    return capsys.readouterr().out


def test_a_window_lends_an_idle_gpu_to_slurm_and_takes_it_back_when_it_closes(site, capsys):
    mover = site.run(NIGHT)
    assert site.kubelet.calls >= 2, mover.log  # asked before deciding, and before giving
    assert load_state(site.state_path).lent.keys() == {GPU0}, mover.log
    rule = site.api.taint_rules[rule_name(GPU0)]
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "h1",
                                              "device": "gpu-0"}
    assert site.slurm.calls == ["drain h1", "reconfigure", "resume h1"]
    assert site.slurm.gres["h1"] == "gpu:a100:2" and site.slurm.gres["h2"] == \
        "gpu:a100:1"
    assert "NodeName=h1 Name=gpu Type=a100 File=/dev/nvidia[0-1]\n" in site.gres_conf()
    assert "NodeName=h2 Name=gpu Type=a100 File=/dev/nvidia1\n" in site.gres_conf()
    assert not os.path.exists(site.state_path + ".journal")  # every move done
    # no job that would run past 08:00 starts on h1 (the reclaim's drain ends none)
    assert site.reservations.now == {
        "gpushare_tidal_h1": ("h1", datetime.datetime(2026, 12, 6, 8, 0), 30)}

    [row] = lent_report(site.plan, load_state(site.state_path), NIGHT)
    assert row == {"device": "h1 GPU 0", "rule": "night", "holder": "slurm",
                   "home": "kubernetes", "since": "2026-12-05 22:00",
                   "until": "2026-12-06 08:00"}

    assert 'gpushare_tidal_lent_devices{to="slurm"} 1\n' in metrics(site, capsys)

    site.run(NIGHT + datetime.timedelta(hours=2))  # still night: nothing more to do
    assert site.slurm.calls == ["drain h1", "reconfigure", "resume h1"]

    mover = site.run(MORNING)
    state = load_state(site.state_path)
    assert state.lent == {}, mover.log
    assert site.api.taint_rules == {}  # pods may land on GPU 0 again
    assert site.reservations.now == {}
    assert site.slurm.calls[3:] == ["drain h1", "reconfigure", "resume h1"]
    assert site.slurm.gres["h1"] == "gpu:a100:1"
    assert "NodeName=h[1-2] Name=gpu Type=a100 File=/dev/nvidia1\n" in site.gres_conf()
    assert state.counters.reclaims == 1
    assert state.counters.lent_seconds["slurm"] == pytest.approx(
        (MORNING - NIGHT).total_seconds())
    text = metrics(site, capsys)
    assert 'gpushare_tidal_lent_gpu_hours_total{to="slurm"} 10.08' in text
    assert "gpushare_tidal_reclaims_total 1\n" in text
    assert 'gpushare_tidal_lent_devices{to="slurm"} 0\n' in text and text.endswith("\n")


def test_a_gpu_a_pod_holds_is_not_lent(site):
    site.kubelet.pods = [Pod("serving", "llm-0", ids=(site.uuid0,))]
    mover = site.run(NIGHT)
    assert load_state(site.state_path).lent == {}
    assert site.api.taint_rules == {} and site.slurm.calls == []
    assert any("no move (0 lent, 1 of 1 at home busy, kubernetes needs 1): kubernetes "
               "needs 1 of the 1 at home: none to spare" in line for line in mover.log), \
        mover.log


def test_a_pod_that_keeps_the_gpu_past_the_release_timeout_undoes_the_lend(site):
    # Free when the round asks, then a pod starts before the fence went up and stays.
    site.kubelet.then = [[], [Pod("serving", "llm-0", ids=(site.uuid0,))]]
    mover = site.run(NIGHT)
    state = load_state(site.state_path)
    assert state.lent == {} and state.counters.refused["busy"] == 1, mover.log
    assert any("was still held after 3 s: pod serving/llm-0" in line for line in mover.log)
    assert site.api.taint_rules == {}  # the fence came down again
    assert site.slurm.calls == ["drain h1", "resume h1"]  # nothing given
    assert site.slurm.gres["h1"] == "gpu:a100:1"
    assert not os.path.exists(site.state_path + ".journal")


def _left(site, step: str, started, reclaim: bool = False) -> None:
    """The journal a run killed at ``step`` leaves (and the fence and drain it had made)."""
    source, target = ("slurm", "kubernetes") if reclaim else ("kubernetes", "slurm")
    journal = TidalJournal(site.state_path + ".journal",
                           [MoveEntry(GPU0, "night", source, target, reclaim, step, started)])
    save_journal(journal)
    site.kube.fence(GPU0, "night")
    site.slurm.drain("h1", "gpushare tidal: h1 GPU 0 kubernetes -> slurm (night)")
    site.slurm.calls.clear()


def test_a_lend_killed_before_it_gave_the_gpu_is_undone_by_the_next_run(site):
    _left(site, "fenced", "released")
    mover = site.run(datetime.datetime(2026, 12, 6, 12, 0))  # day: the window is closed
    assert any("left it at 'fenced'; undo" in line for line in mover.log)
    assert site.api.taint_rules == {} and site.slurm.calls == ["resume h1"]
    assert load_state(site.state_path).lent == {}
    assert not os.path.exists(site.state_path + ".journal")


def test_a_lend_killed_while_it_gave_the_gpu_is_finished_by_the_next_run(site):
    _left(site, "released", "given")
    mover = site.run(datetime.datetime(2026, 12, 6, 4, 0))
    assert any("left it at 'released'; finish" in line for line in mover.log)
    assert load_state(site.state_path).lent.keys() == {GPU0}
    assert rule_name(GPU0) in site.api.taint_rules  # the fence stays while it is lent
    assert site.slurm.calls == ["reconfigure", "resume h1"]
    assert site.slurm.gres["h1"] == "gpu:a100:2"


def test_a_node_fence_taints_the_node_while_the_gpu_is_lent(tmp_path):
    site = Site(tmp_path, mode="node")
    try:
        site.run(NIGHT)
        taints = site.api.nodes["h1"]["spec"]["taints"]
        assert [t["key"] for t in taints] == ["gpushare.io/lent"]
        assert site.api.nodes["h2"]["spec"]["taints"] == []
        site.run(MORNING)
        assert site.api.nodes["h1"]["spec"]["taints"] == []
        assert load_state(site.state_path).lent == {}
    finally:
        site.stop()


class Killed(BaseException):
    """The run dies here (a BaseException: nothing in the mover catches it)."""


def _owned_by_both(site) -> bool:
    """Slurm may place work on GPU 0 (it is in the state file and Slurm's gres) while
    Kubernetes may too (no fence)."""
    slurm_has = GPU0 in load_state(site.state_path).lent or site.slurm.gres["h1"] == "gpu:a100:2"
    return slurm_has and rule_name(GPU0) not in site.api.taint_rules


@pytest.mark.parametrize("reclaim", [False, True])
@pytest.mark.parametrize("at", [("started", "fenced"), ("step", "fenced"),
                                ("started", "released"), ("step", "released"),
                                ("started", "given"), ("step", "given"),
                                ("started", "unfenced"), ("step", "unfenced")])
def test_a_run_killed_at_any_step_never_gives_the_gpu_to_both_and_the_next_settles_it(
        site, reclaim, at, monkeypatch):
    if reclaim:
        site.run(NIGHT)  # lent, to be reclaimed
        assert load_state(site.state_path).lent.keys() == {GPU0}
    kind, where = at
    original = TidalJournal.mark

    def mark(self, move, step=None, started=None):
        """Killed just before ``where`` begins, or just after it was journalled done."""
        if (kind == "started" and started == where) or (kind == "step" and step == where):
            if kind == "step":
                original(self, move, step=step)
            assert not _owned_by_both(site)
            raise Killed()
        original(self, move, step=step, started=started)

    when = MORNING if reclaim else NIGHT
    with monkeypatch.context() as patch:
        patch.setattr(TidalJournal, "mark", mark)
        with pytest.raises(Killed):
            site.run(when)
    assert not _owned_by_both(site)
    assert os.path.exists(site.state_path + ".journal")
    mover = site.run(when)  # the next run settles the move, then decides again
    assert not _owned_by_both(site), mover.log
    assert not os.path.exists(site.state_path + ".journal")
    lent = load_state(site.state_path).lent
    # A reclaim is always finished; a lend that had given the GPU is finished, one that had
    # not is undone and made again by the same round (the window is still open).
    assert lent.keys() == (set() if reclaim else {GPU0}), mover.log
    assert site.slurm.gres["h1"] == ("gpu:a100:1" if reclaim else "gpu:a100:2")
    assert (rule_name(GPU0) in site.api.taint_rules) == (not reclaim)
    assert "DRAIN" not in site.slurm.state["h1"]


def test_a_gpu_slurm_lends_by_day_is_fenced_in_kubernetes_while_it_is_home(tmp_path):
    site = Site(tmp_path, plan=PLAN + DAY_RULE)
    gpu1 = Device("h1", 1)
    try:
        site.run(datetime.datetime(2026, 12, 5, 7, 45))  # neither rule lends now
        assert set(site.api.taint_rules) == {rule_name(gpu1)}  # Slurm's, at home
        assert site.slurm.calls == [] and load_state(site.state_path).lent == {}
        mover = site.run(datetime.datetime(2026, 12, 5, 9, 0))  # day: Slurm lends GPU 1
        assert load_state(site.state_path).lent.keys() == {gpu1}, mover.log
        assert site.api.taint_rules == {}  # Kubernetes may place pods on it now
        assert site.slurm.gres["h1"] == "", site.slurm.gres
        assert site.reservations.now == {}  # nothing of Slurm's runs on a GPU lent away
        mover = site.run(datetime.datetime(2026, 12, 5, 20, 30))  # home again, fenced
        assert load_state(site.state_path).lent.keys() == {GPU0}, mover.log  # night's lend
        assert rule_name(gpu1) in site.api.taint_rules
        assert site.slurm.gres["h1"] == "gpu:a100:2"
    finally:
        site.stop()


DEMAND_PLAN = PLAN.replace('    window: {from: "20:00", to: "08:00"}\n',
                           "    demand: {idle_below_percent: 50, for_minutes: 30}\n")
DAY_DEMAND_RULE = DAY_RULE.replace('    window: {from: "08:00", to: "20:00"}\n',
                                   "    demand: {idle_below_percent: 50, for_minutes: 30}\n")


def unschedulable(name: str, gpus: int) -> dict:
    return {"metadata": {"name": name, "namespace": "serving"},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


def test_a_demand_rule_takes_its_gpu_back_when_pods_cannot_be_placed(tmp_path):
    """Kubernetes' demand is read from its pending pods: a lent GPU comes back when a pod
    waits for one, and is not lent while one waits."""
    site = Site(tmp_path, plan=DEMAND_PLAN)
    try:
        start = datetime.datetime(2026, 12, 5, 10, 0)
        site.run(start)  # idle from now on
        mover = site.run(start + datetime.timedelta(minutes=31))
        assert load_state(site.state_path).lent.keys() == {GPU0}, mover.log
        # a job Slurm starts on h1 now must end within the 30 minutes promised: the
        # reservation starts 30 minutes on, and moves on with each round
        minutes = datetime.timedelta(minutes=1)
        assert site.reservations.now == {"gpushare_tidal_h1": ("h1", start + 61 * minutes, 30)}
        site.run(start + 36 * minutes)
        assert site.reservations.now == {"gpushare_tidal_h1": ("h1", start + 66 * minutes, 30)}
        site.api.pods = [unschedulable("llm-0", 1)]
        mover = site.run(start + datetime.timedelta(minutes=40))
        assert load_state(site.state_path).lent == {}, mover.log
        assert any("reclaimed: kubernetes needs 1 and holds 0" in line for line in mover.log)
        assert rule_name(GPU0) not in site.api.taint_rules  # the pod may land now
        assert site.reservations.now == {}
        # while it still waits (the scheduler has not placed it yet), nothing is lent
        mover = site.run(start + datetime.timedelta(minutes=90))
        assert load_state(site.state_path).lent == {}, mover.log
        assert any("at home busy, kubernetes needs 1)" in line for line in mover.log), mover.log
    finally:
        site.stop()


def test_an_unreadable_kubernetes_queue_moves_nothing(tmp_path):
    site = Site(tmp_path, plan=DEMAND_PLAN)
    try:
        start = datetime.datetime(2026, 12, 5, 10, 0)
        site.run(start)
        site.run(start + datetime.timedelta(minutes=31))
        assert load_state(site.state_path).lent.keys() == {GPU0}
        site.api.token = "rotated"  # the controller's credentials no longer work
        mover = site.run(start + datetime.timedelta(minutes=40))
        assert load_state(site.state_path).lent.keys() == {GPU0}, mover.log
        assert any("night: no move: " in line and "401" in line for line in mover.log), \
            mover.log
    finally:
        site.stop()


def test_slurm_lends_no_gpu_a_waiting_job_could_use_and_takes_one_back_for_it(tmp_path):
    site = Site(tmp_path, plan=PLAN + DAY_DEMAND_RULE)
    gpu1 = Device("h1", 1)
    waiting = "77|gres/gpu:1|2026-12-05T09:00:00|debug|ann|a|60|Resources\n"
    try:
        start = datetime.datetime(2026, 12, 5, 10, 0)
        site.squeue = waiting
        site.run(start)
        mover = site.run(start + datetime.timedelta(minutes=31))
        assert load_state(site.state_path).lent == {}, mover.log
        assert any("at home busy, slurm needs 1)" in line for line in mover.log), mover.log
        site.squeue = "77|gres/gpu:1|2026-12-05T09:00:00|debug|ann|a|60|JobHeldUser\n"
        site.run(start + datetime.timedelta(minutes=40))  # a held job waits for no GPU
        mover = site.run(start + datetime.timedelta(minutes=71))
        assert load_state(site.state_path).lent.keys() == {gpu1}, mover.log
        site.squeue = waiting
        mover = site.run(start + datetime.timedelta(minutes=80))
        assert load_state(site.state_path).lent == {}, mover.log
        assert site.slurm.gres["h1"] == "gpu:a100:1"
    finally:
        site.stop()


def test_a_node_with_its_own_gres_conf_renders_it_from_the_state_the_move_wrote(tmp_path):
    """--node-gres-command: each node renders its gres.conf (here `gpushare render gres`
    as a site runs it through ssh) after the state file says what is lent, before the
    reconfigure; a render that fails stops the move before slurmctld is told."""
    import dataclasses

    site = Site(tmp_path)
    own = str(tmp_path / "{node}.gres.conf")
    render = [sys.executable, "-m", "gpushare.cli", "render", "gres", "--plan", site.plan.path,
              "--node", "{node}", "--output", own]
    site.settings = dataclasses.replace(
        site.settings, node_gres_command=shlex.join(render),
        slurm=dataclasses.replace(site.settings.slurm, cluster_gres_conf=""))
    try:
        mover = site.run(NIGHT)
        assert load_state(site.state_path).lent.keys() == {GPU0}, mover.log
        with open(tmp_path / "h1.gres.conf") as handle:
            assert "NodeName=h1 Name=gpu Type=a100 File=/dev/nvidia[0-1]\n" in handle.read()
        assert not (tmp_path / "gres.conf").exists() and not (tmp_path / "h2.gres.conf").exists()
        assert site.slurm.calls == ["drain h1", "reconfigure", "resume h1"]

        site.settings = dataclasses.replace(site.settings, node_gres_command=shlex.join(
            [*render[:-1], str(tmp_path / "missing" / "{node}.gres.conf")]))
        mover = site.run(MORNING)
        assert any("rendering node h1's gres.conf failed (exit 2)" in line
                   for line in mover.log), mover.log
        assert site.slurm.calls[3:] == ["drain h1"]  # not told: the node stays drained
        assert load_state(site.state_path).lent == {}  # home in the state file
        assert rule_name(GPU0) in site.api.taint_rules  # still fenced: owned by neither
        site.settings = dataclasses.replace(site.settings, node_gres_command=shlex.join(render))
        mover = site.run(MORNING)  # the next run finishes the reclaim
        with open(tmp_path / "h1.gres.conf") as handle:
            assert "NodeName=h1 Name=gpu Type=a100 File=/dev/nvidia1\n" in handle.read()
        assert site.api.taint_rules == {} and "DRAIN" not in site.slurm.state["h1"], mover.log
    finally:
        site.stop()


def test_the_default_holders_command_asks_each_node_once_for_all_its_devices(tmp_path):
    """{devices}: one run of `gpushare tidal holders --devices` per node answers for each
    device asked; a device it leaves unanswered is an error, never free."""
    import dataclasses

    site = Site(tmp_path)
    runs = tmp_path / "runs"
    base = [sys.executable, "-m", "gpushare.cli", "tidal", "holders", "--devices", "{devices}",
            "--socket", str(tmp_path / "kubelet.sock"), "--source", f"sim:{tmp_path / 'h1.json'}"]
    counted = ["/bin/sh", "-c", f'echo run >> {runs} && exec "$0" "$@"', *base]
    site.settings = dataclasses.replace(site.settings, holders_command=shlex.join(counted))
    gpu1 = Device("h1", 1)
    try:
        site.kubelet.pods = [Pod("serving", "llm-0", ids=(site.uuid0,))]
        mover = site.run(datetime.datetime(2026, 12, 5, 12, 0))  # day: no move
        assert runs.read_text() == "run\n"  # one node asked, once
        runs.unlink()
        answers = mover.holders_on("h1", [GPU0, gpu1], "night")
        assert runs.read_text() == "run\n"
        assert answers[GPU0][0] == 1 and "pod serving/llm-0" in answers[GPU0][1]
        assert answers[gpu1][0] == 0

        mover = site.run(NIGHT)  # GPU 0 is held: not lent
        assert load_state(site.state_path).lent == {}, mover.log
        site.kubelet.pods = []
        mover = site.run(NIGHT)
        assert load_state(site.state_path).lent.keys() == {GPU0}, mover.log

        # a holders command that answers for no device: counted busy, nothing lent
        site.run(MORNING)
        silent = ["/bin/sh", "-c", "exit 0", *base]
        site.settings = dataclasses.replace(site.settings, holders_command=shlex.join(silent))
        mover = site.run(NIGHT + datetime.timedelta(days=1))
        assert load_state(site.state_path).lent == {}, mover.log
        assert any("no answer for h1 GPU 0 (exit 0)" in line for line in mover.log), mover.log
    finally:
        site.stop()
