# SPDX-License-Identifier: GPL-2.0-or-later
"""What each home side waits for (``admin/tidal/waiting.py``): Slurm's pending jobs as
squeue lists them, Kubernetes' unschedulable pods as the API server lists them (read through
the real ``kubernetes`` client from the stand-in API server)."""

from __future__ import annotations

import datetime

import pytest

from gpushare.admin.plan.lending import Demand, Device, LendingRule
from gpushare.admin.relayout.demand import read_queue
from gpushare.admin.tidal.kube import api_from_kubeconfig
from gpushare.admin.tidal.waiting import (
    DraClasses,
    KubePending,
    Waiting,
    WaitingError,
    kube_waiting,
    read_kube_pending,
    slurm_waiting,
)
from kube_standin.apiserver import ApiServer

NOW = datetime.datetime(2026, 12, 5, 12, 0)


def rule(home: str, nodes=("h1",), gpus=(0, 1), profile: str = "") -> LendingRule:
    devices = tuple(Device(n, g, 0 if profile else -1) for n in nodes for g in gpus)
    borrower = "slurm" if home == "kubernetes" else "kubernetes"
    return LendingRule("r", home, borrower, devices, None, Demand(10, 30), len(devices), 30,
                       ("batch",), profile, 1)


def squeue(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# -- Slurm --------------------------------------------------------------------------------
def test_slurm_counts_jobs_waiting_for_resources_in_a_partition_of_the_rules_nodes():
    text = squeue(
        "11|gres/gpu:2|2026-12-05T11:00:00|gpu|ann|a|60|Resources",
        "12|gres/gpu:a100:1|2026-12-05T11:00:00|gpu|bob|a|60|Priority",
        "13|gres/gpu:1|2026-12-05T11:00:00|gpu|ann|a|60|JobHeldUser",     # held
        "14|gres/gpu:1|2026-12-05T11:00:00|gpu|ann|a|60|Dependency",      # waits for 13
        "15|gres/gpu:1|2026-12-05T11:00:00|other|ann|a|60|Resources",     # not on h1
        "16|gres/gpu:1g.10gb:1|2026-12-05T11:00:00|gpu|ann|a|60|Resources",  # a slice
        "17|(null)|2026-12-05T11:00:00|gpu|ann|a|60|Resources")           # no GPU
    queue = read_queue(text, NOW, {"gpu": frozenset({"h1", "h2"}),
                                   "other": frozenset({"h9"})})
    assert slurm_waiting(rule("slurm", gpus=(0, 1, 2, 3)), queue) == 3
    assert slurm_waiting(rule("slurm", gpus=(0, 1)), queue) == 2  # capped at its devices
    assert slurm_waiting(rule("slurm", nodes=("h9",)), queue) == 1
    assert slurm_waiting(rule("slurm", gpus=(0,), profile="1g.10gb"), queue) == 1
    assert slurm_waiting(rule("slurm", nodes=("h3",)), queue) == 0


# -- Kubernetes ---------------------------------------------------------------------------
def pod(name: str, gpus: int = 0, resource: str = "nvidia.com/gpu", scheduled: str = "False",
        reason: str = "Unschedulable", selector=None, node_name=None, init: int = 0,
        claims=(), namespace: str = "serving") -> dict:
    spec: dict = {"containers": [{"name": "c", "resources": {"limits": {resource: str(gpus)}}
                                  if gpus else {}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": {resource: init}}}]
    if selector:
        spec["nodeSelector"] = selector
    if node_name:
        spec["nodeName"] = node_name
    status: dict = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": scheduled, "reason": reason}]}
    if claims:
        spec["resourceClaims"] = [{"name": f"claim{i}", "resourceClaimTemplateName": "t"}
                                  for i, _ in enumerate(claims)]
        status["resourceClaimStatuses"] = [{"name": f"claim{i}", "resourceClaimName": c}
                                           for i, c in enumerate(claims)]
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec,
            "status": status}


LABELS = {"h1": {"kubernetes.io/hostname": "h1", "pool": "infer"},
          "h2": {"kubernetes.io/hostname": "h2", "pool": "train"}}


def test_kubernetes_counts_unschedulable_pods_a_rule_node_admits():
    pending = KubePending(pods=[
        pod("a", 1),
        pod("b", 2, selector={"pool": "infer"}),
        pod("c", 1, selector={"pool": "train"}),                  # only h2 admits it
        pod("d", 1, node_name="h2"),                              # bound elsewhere
        pod("e", 1, scheduled="True", reason=""),                 # placed, pulling images
        pod("f", 1, reason="SchedulerError"),                     # not a lack of devices
        pod("g", 0, init=1),                                      # its init container asks
        pod("h", 1, resource="nvidia.com/mig-1g.10gb"),           # a slice
    ], labels=LABELS)
    assert kube_waiting(rule("kubernetes", gpus=range(8)), pending) == 4  # a, b's 2, g
    assert kube_waiting(rule("kubernetes", nodes=("h2",), gpus=range(8)), pending) == 4
    assert kube_waiting(rule("kubernetes", gpus=(0, 1)), pending) == 2  # capped
    assert kube_waiting(rule("kubernetes", gpus=range(4), profile="1g.10gb"), pending) == 1


def test_kubernetes_counts_the_unallocated_claims_of_unschedulable_pods():
    v1 = {"spec": {"devices": {"requests": [
        {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
        {"name": "m", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}
    v1beta1 = {"spec": {"devices": {"requests": [
        {"name": "g", "deviceClassName": "gpu.nvidia.com", "count": 1}]}}}
    alternatives = {"spec": {"devices": {"requests": [
        {"name": "g", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com"},
                                         {"name": "small", "deviceClassName": "mig.nvidia.com"}]}
    ]}}}
    every = {"spec": {"devices": {"requests": [
        {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                  "allocationMode": "All"}}]}}}
    pending = KubePending(
        pods=[pod("a", claims=("a-c0",)), pod("b", claims=("b-c0", "b-c1")),
              pod("c", claims=("gone",)), pod("d", claims=("a-c0",), namespace="other")],
        labels=LABELS,
        claims={("serving", "a-c0"): v1, ("serving", "b-c0"): v1beta1,
                ("serving", "b-c1"): alternatives})
    whole = rule("kubernetes", gpus=range(8))
    # a's 2, b's 1 + 1; "gone" is allocated, and d's claim is in another namespace
    assert kube_waiting(whole, pending) == 4
    assert kube_waiting(rule("kubernetes", gpus=range(4), profile="1g.10gb"), pending) == 1
    assert kube_waiting(whole, pending, DraClasses(gpu="other.example.com")) == 0
    pending.claims[("serving", "gone")] = every
    assert kube_waiting(whole, pending) == 8  # All: every device of the rule


@pytest.fixture
def api(tmp_path):
    server = ApiServer()
    for node, labels in LABELS.items():
        server.add_node(node)
        server.nodes[node]["metadata"]["labels"] = labels
    url = server.start()
    (tmp_path / "kubeconfig").write_text(server.kubeconfig(url))
    yield server, api_from_kubeconfig(str(tmp_path / "kubeconfig"))
    server.stop()


def test_the_pending_pods_and_open_claims_are_read_from_the_api_server(api):
    server, client = api
    running = pod("r", 1)
    running["status"] = {"phase": "Running"}
    server.pods = [pod("a", 1, selector={"pool": "infer"}), pod("b", claims=("b-c0",)),
                   running]
    open_claim = {"metadata": {"name": "b-c0", "namespace": "serving"}, "spec": {"devices": {
        "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    allocated = {"metadata": {"name": "x", "namespace": "serving"},
                 "status": {"allocation": {"devices": {"results": []}}}}
    server.claims = [open_claim, allocated]
    found = read_kube_pending(client, "v1")
    assert [p["metadata"]["name"] for p in found.pods] == ["a", "b"]
    assert found.labels["h1"]["pool"] == "infer"
    assert set(found.claims) == {("serving", "b-c0")}
    assert kube_waiting(rule("kubernetes", gpus=range(4)), found) == 2
    assert [path for _, path in server.requests if "resourceclaims" in path]
    # without DRA (the device plugin's node fence) no claim is asked for
    server.requests.clear()
    assert read_kube_pending(client, None).claims == {}
    assert not [path for _, path in server.requests if "resourceclaims" in path]


def test_an_api_server_that_refuses_is_an_error_not_nothing_waiting(api):
    server, client = api
    server.token = "rotated"
    with pytest.raises(WaitingError, match=r"listing pending pods failed .*401"):
        read_kube_pending(client, "v1")


def test_each_side_is_read_once_a_round_and_only_when_asked():
    asked = []

    def queue():
        asked.append("slurm")
        return read_queue("1|gres/gpu:1|2026-12-05T11:00:00|gpu|a|a|60|Resources\n", NOW)

    def pods():
        asked.append("kubernetes")
        raise WaitingError("Kubernetes API: listing pending pods failed (503)")

    waiting = Waiting(queue, pods)
    assert waiting.of(rule("slurm")) == 1 and waiting.of(rule("slurm")) == 1
    assert asked == ["slurm"]
    with pytest.raises(WaitingError, match="503"):
        waiting.of(rule("kubernetes"))

    def broken():
        raise OSError("squeue: no such file")

    with pytest.raises(WaitingError, match="reading what slurm waits for failed: squeue"):
        Waiting(broken, pods).of(rule("slurm"))
