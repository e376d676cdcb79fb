# SPDX-License-Identifier: GPL-2.0-or-later
"""Which pods hold a device, asked of a stand-in kubelet through real gRPC on a unix socket
in the kubelet's wire format (scripts/kube_standin/kubelet.py)."""

from __future__ import annotations

import os
from typing import Iterator

import grpc
import pytest

from gpushare.admin.tidal.podresources import (
    PodResourcesError,
    Wanted,
    holders,
    list_pods,
    messages,
)
from kube_standin.kubelet import Kubelet, Pod

GPU1 = "GPU-6d3c1a4e-0001"


@pytest.fixture
def kubelet(tmp_path) -> Iterator[Kubelet]:
    socket_path = os.path.join(str(tmp_path), "kubelet.sock")
    stand_in = Kubelet(socket_path)
    stand_in.start()
    yield stand_in
    stand_in.stop()


def test_device_plugin_ids_and_dra_claims_name_their_pods(kubelet) -> None:
    kubelet.pods = [
        Pod("serving", "llm-0", ids=("GPU-6d3c1a4e-0000",)),
        Pod("serving", "llm-1", ids=(GPU1, "GPU-6d3c1a4e-0002")),
        Pod("batch", "embed-7", dra=(("gpu.nvidia.com", "k8s-01", "gpu-3"),)),
        Pod("batch", "other-node", dra=(("gpu.nvidia.com", "k8s-02", "gpu-3"),)),
    ]
    answer = list_pods(kubelet.socket_path)
    found = holders([Wanted(ids=frozenset({GPU1})),
                     Wanted(dra=("gpu.nvidia.com", "k8s-01", "gpu-3"))], answer)
    assert [h.describe() for h in found] == [
        f"pod serving/llm-1 container main holds nvidia.com/gpu {GPU1}",
        "pod batch/embed-7 container main holds DRA gpu.nvidia.com/k8s-01/gpu-3 "
        "(claim batch/embed-7-gpu)"]
    assert holders([Wanted(ids=frozenset({"GPU-6d3c1a4e-0009"}))], answer) == []
    assert holders([], answer) == []


def test_fields_the_module_does_not_read_are_skipped_not_refused(kubelet) -> None:
    """A newer kubelet sends more (cpu_ids, memory, topology): only the named fields are read."""
    response = messages()["ListPodResourcesResponse"]()
    pod = response.pod_resources.add(name="p", namespace="n")
    pod.containers.add(name="c").devices.add(resource_name="nvidia.com/gpu", device_ids=[GPU1])
    wire = response.SerializeToString()
    # field 3 of ContainerResources (cpu_ids, packed int64) appended to the container
    container = b"\x0a\x01c" + b"\x12" + bytes([len(b"\x0a\x0envidia.com/gpu\x12" +
                                                    bytes([len(GPU1)]) + GPU1.encode())]) + \
        b"\x0a\x0envidia.com/gpu\x12" + bytes([len(GPU1)]) + GPU1.encode() + b"\x1a\x02\x01\x02"
    pod_bytes = b"\x0a\x01p\x12\x01n\x1a" + bytes([len(container)]) + container
    newer = b"\x0a" + bytes([len(pod_bytes)]) + pod_bytes
    assert len(newer) == len(wire) + 4
    parsed = messages()["ListPodResourcesResponse"].FromString(newer)
    assert [h.pod for h in holders([Wanted(ids=frozenset({GPU1}))], parsed)] == ["p"]


def test_a_kubelet_that_cannot_be_asked_is_a_clear_error(kubelet, tmp_path) -> None:
    kubelet.fail = grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(PodResourcesError, match=r"did not answer List \(PERMISSION_DENIED: "
                       r"stand-in told to fail\)"):
        list_pods(kubelet.socket_path)
    with pytest.raises(PodResourcesError, match=r"no-such\.sock did not answer List "
                       r"\(UNAVAILABLE"):
        list_pods(os.path.join(str(tmp_path), "no-such.sock"), timeout=2)
