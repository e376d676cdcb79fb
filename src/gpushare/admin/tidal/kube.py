# SPDX-License-Identifier: GPL-2.0-or-later
"""The Kubernetes side of a tidal move: the fence that keeps new pods off a device.

Before a device Kubernetes owns is given to Slurm, no new pod may land on it; running pods
are not evicted (the move waits for them through the kubelet, ``podresources``). Two fences,
by how the node's GPUs reach Kubernetes:

- ``dra`` (the NVIDIA DRA driver): a ``DeviceTaintRule`` per device, effect NoSchedule,
  selecting the driver, the node's pool and the device's name. The device must be in one of
  the node's ResourceSlices first: a taint on a name the driver does not publish would fence
  nothing, and both schedulers would own the device, so that is refused.
- ``node`` (the device plugin, which has no per-device fence): a NoSchedule taint on the
  whole node while any of its devices is fenced, with an annotation listing which. Coarse,
  never wrong: no new pod that does not tolerate the taint lands on any of the node's GPUs.

Every object written is labelled as gpushare's, so ``fenced`` reads the fences back after a
crash and an operator finds them with ``kubectl get devicetaintrules -l
app.kubernetes.io/managed-by=gpushare``. The calls go through the ``kubernetes`` client
(``CoreV1Api`` for nodes, ``CustomObjectsApi`` for the resource.k8s.io objects, so one client
serves every API version of them); node updates are JSON patches guarded by the node's
resourceVersion, so two writers never lose each other's taints.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Optional

from gpushare.admin.plan.lending import Device

__all__ = ["FENCE_MODES", "KubeError", "KubeFence", "Settings", "api_from_kubeconfig",
           "rule_name"]

FENCE_MODES = ("dra", "node")
TAINT_KEY = "gpushare.io/lent"
FENCED_ANNOTATION = "gpushare.io/tidal-fenced"
MANAGED = {"app.kubernetes.io/managed-by": "gpushare"}
GROUP = "resource.k8s.io"
_DNS = re.compile(r"[^a-z0-9-]+")
CONFLICT_RETRIES = 5


class KubeError(RuntimeError):
    """The API server refused or could not be reached; the message says which call."""


@dataclass(frozen=True)
class Settings:
    mode: str = "dra"
    driver: str = "gpu.nvidia.com"
    api_version: str = "v1"  # of resource.k8s.io: v1, v1beta2 or v1alpha3 on older clusters
    device_name: str = "gpu-{gpu}"  # the DRA driver's name of a whole GPU
    slice_name: str = "gpu-{gpu}-mig-{slice}"  # and of a MIG slice (see its ResourceSlices)

    def dra_device(self, device: Device) -> str:
        template = self.device_name if device.slice < 0 else self.slice_name
        return template.format(node=device.node, gpu=device.gpu, slice=device.slice)


def api_from_kubeconfig(path: Optional[str]) -> Any:
    """An ApiClient from a kubeconfig file, else the in-cluster service account."""
    from kubernetes import client, config

    try:
        if path is None:
            config.load_incluster_config()
            return client.ApiClient()
        return config.new_client_from_config(config_file=path)
    except Exception as err:  # the loaders raise several types; all mean "no credentials"
        where = path or "the in-cluster service account"
        raise KubeError(f"cannot load Kubernetes credentials from {where}: {err}") from None


def rule_name(device: Device) -> str:
    """The DeviceTaintRule's name: a DNS label from the device, hashed where the node name
    is not one already (two devices never share a name)."""
    suffix = f"gpu{device.gpu}" + (f"-s{device.slice}" if device.slice >= 0 else "")
    node = _DNS.sub("-", device.node.lower()).strip("-")
    name = f"gpushare-tidal-{node}-{suffix}"
    if node != device.node or len(name) > 63:
        digest = hashlib.sha256(device.node.encode()).hexdigest()[:8]
        name = f"gpushare-tidal-{node[:30]}-{digest}-{suffix}"
    return name


def _api_error(what: str, err: Exception) -> KubeError:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None) or err
    return KubeError(f"Kubernetes API: {what} failed ({status or 'no answer'}: {reason})")


class KubeFence:
    """Puts up, takes down and reads back the fences of devices (see the module's text)."""

    def __init__(self, api: Any, settings: Settings) -> None:
        from kubernetes import client

        if settings.mode not in FENCE_MODES:
            raise ValueError(f"fence mode {settings.mode!r} is not one of {FENCE_MODES}")
        self.api = api
        self.settings = settings
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        # Each node's ResourceSlices of the driver, listed once per fence (one tidal run,
        # one round): a round asks for the pools of every device of a node.
        self._slices: dict[str, list[dict[str, Any]]] = {}

    # -- DRA ------------------------------------------------------------------------------
    def _node_slices(self, node: str) -> list[dict[str, Any]]:
        if node not in self._slices:
            try:
                found = self.custom.list_cluster_custom_object(
                    GROUP, self.settings.api_version, "resourceslices",
                    field_selector=f"spec.nodeName={node},spec.driver={self.settings.driver}")
            except Exception as err:
                raise _api_error(f"listing the ResourceSlices of node {node}", err) from None
            self._slices[node] = list(found.get("items", []))
        return self._slices[node]

    def _slice_pool(self, device: Device) -> str:
        """The pool that publishes the device on its node (refused when none does)."""
        name = self.settings.dra_device(device)
        for item in self._node_slices(device.node):
            spec = item.get("spec", {})
            if any(d.get("name") == name for d in spec.get("devices", [])):
                return str(spec.get("pool", {}).get("name", device.node))
        raise KubeError(
            f"no ResourceSlice of driver {self.settings.driver} on node {device.node} "
            f"publishes a device {name!r}: a taint on it would fence nothing. Set the device "
            "name template to the driver's names (kubectl get resourceslices -o yaml)")

    def dra_key(self, device: Device) -> tuple[str, str, str]:
        """(driver, pool, device) as the kubelet reports a DRA claim of the device."""
        return (self.settings.driver, self._slice_pool(device), self.settings.dra_device(device))

    def _fence_dra(self, device: Device, rule: str) -> None:
        driver, pool, name = self.dra_key(device)
        body = {"apiVersion": f"{GROUP}/{self.settings.api_version}", "kind": "DeviceTaintRule",
                "metadata": {"name": rule_name(device),
                             "labels": {**MANAGED, "gpushare.io/rule": rule},
                             "annotations": {FENCED_ANNOTATION: _device_text(device)}},
                "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": name},
                         "taint": {"key": TAINT_KEY, "value": rule, "effect": "NoSchedule"}}}
        try:
            self.custom.create_cluster_custom_object(GROUP, self.settings.api_version,
                                                     "devicetaintrules", body)
        except Exception as err:
            if getattr(err, "status", None) != 409:  # already there: fenced before a crash
                raise _api_error(f"creating DeviceTaintRule {rule_name(device)}", err) from None

    def _unfence_dra(self, device: Device) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, self.settings.api_version,
                                                     "devicetaintrules", rule_name(device))
        except Exception as err:
            if getattr(err, "status", None) != 404:
                raise _api_error(f"deleting DeviceTaintRule {rule_name(device)}", err) from None

    def _fenced_dra(self) -> set[Device]:
        try:
            found = self.custom.list_cluster_custom_object(
                GROUP, self.settings.api_version, "devicetaintrules",
                label_selector="app.kubernetes.io/managed-by=gpushare")
        except Exception as err:
            raise _api_error("listing gpushare's DeviceTaintRules", err) from None
        devices = set()
        for item in found.get("items", []):
            text = item.get("metadata", {}).get("annotations", {}).get(FENCED_ANNOTATION, "")
            devices |= _parse_devices(text)
        return devices

    # -- node taint -----------------------------------------------------------------------
    def _read_node(self, node: str) -> dict[str, Any]:
        try:
            return dict(self.api.sanitize_for_serialization(self.core.read_node(node)))
        except Exception as err:
            raise _api_error(f"reading node {node}", err) from None

    def _set_node(self, node: str, change: Any) -> None:
        """Apply ``change(fenced set) -> fenced set`` to the node's annotation and taint,
        retried when another writer changed the node in between."""
        for _ in range(CONFLICT_RETRIES):
            body = self._read_node(node)
            meta = body.get("metadata", {})
            annotations = dict(meta.get("annotations") or {})
            fenced = _parse_devices(annotations.get(FENCED_ANNOTATION, ""))
            wanted = change(fenced)
            if wanted == fenced:
                return
            taints = [t for t in (body.get("spec", {}).get("taints") or [])
                      if t.get("key") != TAINT_KEY]
            if wanted:
                annotations[FENCED_ANNOTATION] = ",".join(_device_text(d) for d in sorted(wanted))
                taints.append({"key": TAINT_KEY, "value": "tidal", "effect": "NoSchedule"})
            else:
                annotations.pop(FENCED_ANNOTATION, None)
            patch = [{"op": "test", "path": "/metadata/resourceVersion",
                      "value": meta.get("resourceVersion", "")},
                     {"op": "add", "path": "/metadata/annotations", "value": annotations},
                     {"op": "add", "path": "/spec/taints", "value": taints}]
            try:
                self.core.patch_node(node, patch)
                return
            except Exception as err:
                if getattr(err, "status", None) not in (409, 422):  # a failed test: retry
                    raise _api_error(f"updating node {node}'s taints", err) from None
        raise KubeError(f"node {node} kept changing under {CONFLICT_RETRIES} updates of its "
                        "taints; try again")

    def _fenced_nodes(self) -> set[Device]:
        try:
            nodes = self.core.list_node()
        except Exception as err:
            raise _api_error("listing nodes", err) from None
        devices = set()
        for node in self.api.sanitize_for_serialization(nodes).get("items", []):
            text = (node.get("metadata", {}).get("annotations") or {}).get(FENCED_ANNOTATION)
            devices |= _parse_devices(text or "")
        return devices

    # -- the fence ------------------------------------------------------------------------
    def fence(self, device: Device, rule: str) -> None:
        """No new pod lands on ``device`` from now on (idempotent)."""
        if self.settings.mode == "dra":
            self._fence_dra(device, rule)
        else:
            self._set_node(device.node, lambda fenced: fenced | {device})

    def unfence(self, device: Device) -> None:
        """Pods may land on ``device`` again (idempotent)."""
        if self.settings.mode == "dra":
            self._unfence_dra(device)
        else:
            self._set_node(device.node, lambda fenced: fenced - {device})

    def fenced(self) -> set[Device]:
        """Every device gpushare has fenced, read back from the API server."""
        return self._fenced_dra() if self.settings.mode == "dra" else self._fenced_nodes()


def _device_text(device: Device) -> str:
    return f"{device.node}:{device.gpu}" + (f".{device.slice}" if device.slice >= 0 else "")


def _parse_devices(text: str) -> set[Device]:
    devices = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        node, _, where = part.rpartition(":")
        gpu, _, piece = where.partition(".")
        if node and gpu.isdigit() and (not piece or piece.isdigit()):
            devices.add(Device(node, int(gpu), int(piece) if piece else -1))
    return devices
