# SPDX-License-Identifier: GPL-2.0-or-later
"""A stand-in for the kubelet's PodResources gRPC service on a unix socket (never shipped).

It serves ``v1.PodResourcesLister/List`` with the pods it is given, in the wire format the
kubelet uses (the message descriptions ``gpushare.admin.tidal.podresources`` builds from
the kubelet's api.proto), through a real gRPC server, so the client path is the real one.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any, Optional

__all__ = ["Kubelet", "Pod"]


class Pod:
    """A pod with one container holding device-plugin ids and/or DRA devices."""

    def __init__(self, namespace: str, name: str, ids: tuple[str, ...] = (),
                 resource: str = "nvidia.com/gpu",
                 dra: tuple[tuple[str, str, str], ...] = ()) -> None:
        self.namespace, self.name, self.ids, self.resource, self.dra = \
            namespace, name, ids, resource, dra


class Kubelet:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.pods: list[Pod] = []
        self.calls = 0
        self.fail: Optional[Any] = None  # a grpc.StatusCode to answer with instead
        self.then: list[list[Pod]] = []  # the pods from the next List calls on, one per call
        self.lock = threading.Lock()
        self._server: Any = None

    def _list(self, request: Any, context: Any) -> Any:
        from gpushare.admin.tidal.podresources import messages

        classes = messages()
        with self.lock:
            self.calls += 1
            if self.fail is not None:
                context.abort(self.fail, "stand-in told to fail")
            if self.then:
                self.pods = self.then.pop(0)
            reply = classes["ListPodResourcesResponse"]()
            for pod in self.pods:
                entry = reply.pod_resources.add(name=pod.name, namespace=pod.namespace)
                container = entry.containers.add(name="main")
                if pod.ids:
                    container.devices.add(resource_name=pod.resource, device_ids=list(pod.ids))
                for driver, pool, device in pod.dra:
                    claim = container.dynamic_resources.add(claim_name=f"{pod.name}-gpu",
                                                            claim_namespace=pod.namespace)
                    claim.claim_resources.add(driver_name=driver, pool_name=pool,
                                              device_name=device)
            return reply

    def start(self) -> None:
        import grpc

        from gpushare.admin.tidal.podresources import SERVICE, messages

        classes = messages()
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=classes["ListPodResourcesRequest"].FromString,
                response_serializer=classes["ListPodResourcesResponse"].SerializeToString)})
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
