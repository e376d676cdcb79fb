# SPDX-License-Identifier: GPL-2.0-or-later
"""What each home side waits for: the work a tidal round adds to the devices it holds.

A rule lends what its home side does not need and, with a demand, reclaims when the home
side needs more than it holds. Running work alone never says that (it fits in what the home
side holds), so the work that waits for a device is read too:

- **Slurm**: the pending jobs that wait for resources, read as relayout reads them
  (``relayout.demand``: held jobs, dependencies and a future ``--begin`` do not count), in a
  partition with one of the rule's nodes, asking a whole GPU (a whole-GPU rule) or the
  rule's MIG profile: each such job's GPUs per node.
- **Kubernetes**: the pods its scheduler could not place (``Pending`` with condition
  ``PodScheduled=False``, reason ``Unschedulable``) whose ``nodeName`` and ``nodeSelector``
  admit one of the rule's nodes, asking ``nvidia.com/gpu`` (a whole-GPU rule) or
  ``nvidia.com/mig-<profile>`` (the device plugin's mixed strategy), or holding an
  unallocated ResourceClaim whose requests name the DRA driver's GPU or MIG device class.
  Node affinity and tolerations are not evaluated: such a pod counts where its
  ``nodeSelector`` allows, which reclaims sooner, never later.

A figure is capped at the rule's devices. A side that cannot be read moves nothing for the
rule that round (the caller logs why): guessing "nothing waits" would lend away what the
home side needs, guessing "all" would end borrowed work early.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from gpushare.admin.plan.lending import LendingRule
from gpushare.admin.relayout.demand import Queue
from gpushare.admin.slurm_client import SlurmClientError
from gpushare.admin.tidal.moves import K8S, SLURM

__all__ = ["DraClasses", "KubePending", "Waiting", "WaitingError", "kube_waiting",
           "read_kube_pending", "slurm_waiting"]

WHOLE_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE = "nvidia.com/mig-{profile}"
GROUP = "resource.k8s.io"


class WaitingError(RuntimeError):
    """A home side's waiting work could not be read; the message says which call."""


@dataclass
class KubePending:
    """The unschedulable pods, every node's labels, and the unallocated claims by
    (namespace, name)."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class DraClasses:
    gpu: str = "gpu.nvidia.com"
    mig: str = "mig.nvidia.com"


def _nodes(rule: LendingRule) -> frozenset[str]:
    return frozenset(d.node for d in rule.devices)


def slurm_waiting(rule: LendingRule, queue: Queue) -> int:
    """The GPUs Slurm's waiting jobs ask of the kind the rule lends, on its nodes."""
    kind = rule.profile.lower() if rule.profile else "whole"
    nodes = _nodes(rule)
    total = sum(r.count for r in queue.requests
                if r.kind == kind and (r.nodes is None or r.nodes & nodes))
    return min(total, len(rule.devices))


def _unschedulable(pod: dict[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return bool(condition.get("status") == "False"
                        and condition.get("reason") == "Unschedulable")
    return False


def _admits(pod: dict[str, Any], node: str, labels: dict[str, str]) -> bool:
    spec = pod.get("spec") or {}
    if spec.get("nodeName") and spec["nodeName"] != node:
        return False
    return all(labels.get(key) == value
               for key, value in (spec.get("nodeSelector") or {}).items())


def _resource_count(pod: dict[str, Any], name: str) -> int:
    """The pod's effective request of an extended resource: its containers' sum, or its
    largest init container's where that is larger (as the scheduler counts it)."""
    def count(container: dict[str, Any]) -> int:
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):  # equal for extended resources when both given
            value = (resources.get(part) or {}).get(name)
            if value is not None:
                try:
                    return int(str(value))
                except ValueError:
                    return 0
        return 0

    spec = pod.get("spec") or {}
    running = sum(count(c) for c in spec.get("containers") or [])
    init = max((count(c) for c in spec.get("initContainers") or []), default=0)
    return max(running, init)


def _requests(claim: dict[str, Any]) -> Iterable[tuple[str, int]]:
    """(device class, count) of a claim's requests, in resource.k8s.io v1 (``exactly``,
    ``firstAvailable``) and v1beta1 (flat) form; allocationMode All counts as unbounded."""
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exact = request.get("exactly") or request
        options = [exact] if exact.get("deviceClassName") else \
            list(request.get("firstAvailable") or [])
        for option in options[:1]:
            unbounded = option.get("allocationMode") == "All"
            yield str(option.get("deviceClassName", "")), \
                1 << 30 if unbounded else int(option.get("count") or 1)


def _claim_names(pod: dict[str, Any]) -> list[str]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in status.get("resourceClaimStatuses") or []}
    names = []
    for ref in spec.get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
        if name:
            names.append(str(name))
    return names


def kube_waiting(rule: LendingRule, pending: KubePending,
                 classes: DraClasses = DraClasses()) -> int:
    """The devices Kubernetes' unschedulable pods ask of the kind the rule lends, among
    pods that one of its nodes admits."""
    nodes = _nodes(rule)
    resource = MIG_RESOURCE.format(profile=rule.profile) if rule.profile else WHOLE_RESOURCE
    dra_class = classes.mig if rule.profile else classes.gpu
    total = 0
    for pod in pending.pods:
        if not _unschedulable(pod):
            continue
        if not any(_admits(pod, node, pending.labels.get(node, {})) for node in nodes):
            continue
        total += _resource_count(pod, resource)
        namespace = (pod.get("metadata") or {}).get("namespace", "")
        for name in _claim_names(pod):
            claim = pending.claims.get((namespace, name))
            if claim is not None:
                total += sum(n for cls, n in _requests(claim) if cls == dra_class)
    return min(total, len(rule.devices))


def read_kube_pending(api: Any, dra_version: Optional[str]) -> KubePending:
    """The pending pods, node labels and (with ``dra_version``) unallocated claims, asked
    of the API server through the ``kubernetes`` client."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    found = KubePending()
    try:
        reply = core.list_pod_for_all_namespaces(field_selector="status.phase=Pending",
                                                 _preload_content=False)
        found.pods = list(json.loads(reply.data).get("items") or [])
    except Exception as err:
        raise WaitingError(f"Kubernetes API: listing pending pods failed "
                           f"({getattr(err, 'status', None) or err})") from None
    if not any(_unschedulable(p) for p in found.pods):
        return found
    try:
        nodes = api.sanitize_for_serialization(core.list_node()).get("items", [])
    except Exception as err:
        raise WaitingError(f"Kubernetes API: listing nodes failed "
                           f"({getattr(err, 'status', None) or err})") from None
    found.labels = {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {})
                    for n in nodes}
    if dra_version and any(_claim_names(p) for p in found.pods):
        try:
            claims = client.CustomObjectsApi(api).list_cluster_custom_object(
                GROUP, dra_version, "resourceclaims")
        except Exception as err:
            raise WaitingError(f"Kubernetes API: listing ResourceClaims failed "
                               f"({getattr(err, 'status', None) or err})") from None
        for claim in claims.get("items", []):
            meta = claim.get("metadata") or {}
            if not (claim.get("status") or {}).get("allocation"):
                found.claims[(meta.get("namespace", ""), meta.get("name", ""))] = claim
    return found


class Waiting:
    """Each side's waiting work for a round, each read at most once (lazily: a round with
    no rule homed on a side never asks it)."""

    def __init__(self, slurm_queue: Callable[[], Queue],
                 kube_pending: Callable[[], KubePending],
                 classes: DraClasses = DraClasses()) -> None:
        self._read = {SLURM: slurm_queue, K8S: kube_pending}
        self._seen: dict[str, Any] = {}
        self.classes = classes

    def _side(self, side: str) -> Any:
        if side not in self._seen:
            try:
                self._seen[side] = self._read[side]()
            except (SlurmClientError, OSError, ValueError) as err:  # squeue, sinfo
                raise WaitingError(f"reading what {side} waits for failed: {err}") from None
        return self._seen[side]

    def of(self, rule: LendingRule) -> int:
        """The devices the rule's home side waits for (WaitingError: unknown)."""
        if rule.home == SLURM:
            return slurm_waiting(rule, self._side(SLURM))
        return kube_waiting(rule, self._side(K8S), self.classes)
