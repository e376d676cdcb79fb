# SPDX-License-Identifier: GPL-2.0-or-later
"""Which Kubernetes pods hold a device on this node, from the kubelet's PodResources API.

A device lent from Kubernetes to Slurm is given to Slurm only once no container holds it.
The kubelet says which devices each container was allocated through its PodResources gRPC
service (``v1.PodResourcesLister/List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``):
device-plugin devices by resource name and device id (the NVIDIA device plugin's ids are
GPU and MIG UUIDs), DRA devices by driver, pool and device name. Only what the kubelet
lists counts: a pod the API server knows but the kubelet has not started holds nothing yet,
and that is what the fence is for.

The messages are described here from the kubelet's ``api.proto`` (package ``v1``), the
fields this module reads only, and built at run time with protobuf's descriptor API, so no
generated code ties the module to one protobuf release. Unknown fields are skipped, as
protobuf always does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

__all__ = ["DEFAULT_SOCKET", "Holder", "PodResourcesError", "Wanted", "holders", "list_pods",
           "messages"]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE = "v1.PodResourcesLister"
LIST = f"/{SERVICE}/List"
MAX_MESSAGE = 16 << 20  # the kubelet's own limit on a response

# (message, [(field, number, type, repeated, message type)]) from the kubelet's api.proto
_STRING, _MESSAGE = "TYPE_STRING", "TYPE_MESSAGE"
_Field = tuple[str, int, str, bool, Optional[str]]
_MESSAGES: tuple[tuple[str, list[_Field]], ...] = (
    ("ListPodResourcesRequest", []),
    ("ListPodResourcesResponse", [("pod_resources", 1, _MESSAGE, True, "PodResources")]),
    ("PodResources", [("name", 1, _STRING, False, None), ("namespace", 2, _STRING, False, None),
                      ("containers", 3, _MESSAGE, True, "ContainerResources")]),
    ("ContainerResources", [("name", 1, _STRING, False, None),
                            ("devices", 2, _MESSAGE, True, "ContainerDevices"),
                            ("dynamic_resources", 5, _MESSAGE, True, "DynamicResource")]),
    ("ContainerDevices", [("resource_name", 1, _STRING, False, None),
                          ("device_ids", 2, _STRING, True, None)]),
    ("DynamicResource", [("claim_name", 2, _STRING, False, None),
                         ("claim_namespace", 3, _STRING, False, None),
                         ("claim_resources", 4, _MESSAGE, True, "ClaimResource")]),
    ("ClaimResource", [("driver_name", 2, _STRING, False, None),
                       ("pool_name", 3, _STRING, False, None),
                       ("device_name", 4, _STRING, False, None)]),
)

_classes: dict[str, Any] = {}


class PodResourcesError(RuntimeError):
    """The kubelet could not be asked (no socket, no answer in time, an error status)."""


def messages() -> dict[str, Any]:
    """The message classes, built once (shared with the test bed's kubelet stand-in)."""
    if _classes:
        return _classes
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="gpushare/podresources_v1.proto",
                                               package="v1", syntax="proto3")
    for name, fields in _MESSAGES:
        message = proto.message_type.add(name=name)
        for field, number, kind, repeated, type_name in fields:
            entry = message.field.add(name=field, number=number,
                                      type=descriptor_pb2.FieldDescriptorProto.Type.Value(kind))
            entry.label = (descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                           else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if type_name:
                entry.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    for name, _ in _MESSAGES:
        descriptor = pool.FindMessageTypeByName(f"v1.{name}")
        get_class = getattr(message_factory, "GetMessageClass", None)
        _classes[name] = (get_class(descriptor) if get_class is not None
                          else message_factory.MessageFactory(pool).GetPrototype(descriptor))
    return _classes


@dataclass(frozen=True)
class Wanted:
    """A device to look for: device-plugin ids (a GPU's UUID and its MIG devices' UUIDs),
    and/or a DRA device as driver, pool and name."""

    ids: frozenset[str] = frozenset()
    dra: Optional[tuple[str, str, str]] = None


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    container: str
    what: str  # "nvidia.com/gpu GPU-1234..." or "DRA gpu.nvidia.com/node1/gpu-0 (claim ns/c)"

    def describe(self) -> str:
        return f"pod {self.namespace}/{self.pod} container {self.container} holds {self.what}"


def list_pods(socket_path: str = DEFAULT_SOCKET, timeout: float = 10.0) -> Any:
    """The kubelet's ``List`` answer (a ``ListPodResourcesResponse``)."""
    import grpc

    classes = messages()
    request_class, response_class = (classes["ListPodResourcesRequest"],
                                     classes["ListPodResourcesResponse"])
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    try:
        with grpc.insecure_channel(f"unix://{socket_path}", options=options) as channel:
            call = channel.unary_unary(LIST, request_serializer=request_class.SerializeToString,
                                       response_deserializer=response_class.FromString)
            return call(request_class(), timeout=timeout)
    except grpc.RpcError as err:
        code = err.code() if hasattr(err, "code") else None
        details = err.details() if hasattr(err, "details") else str(err)
        raise PodResourcesError(
            f"the kubelet's PodResources API at {socket_path} did not answer List "
            f"({getattr(code, 'name', code)}: {details}); is the kubelet running on this node, "
            "and is this root?") from None


def holders(wanted: Iterable[Wanted], answer: Any) -> list[Holder]:
    """The containers in ``answer`` (from ``list_pods``) that hold any wanted device."""
    wanted = list(wanted)
    ids = frozenset().union(*(w.ids for w in wanted)) if wanted else frozenset()
    dra = {w.dra for w in wanted if w.dra is not None}
    found = []
    for pod in answer.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    if device_id in ids:
                        found.append(Holder(pod.namespace, pod.name, container.name,
                                            f"{devices.resource_name} {device_id}"))
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    key = (resource.driver_name, resource.pool_name, resource.device_name)
                    if key in dra:
                        found.append(Holder(
                            pod.namespace, pod.name, container.name,
                            f"DRA {'/'.join(key)} (claim {claim.claim_namespace}/"
                            f"{claim.claim_name})"))
    return found
