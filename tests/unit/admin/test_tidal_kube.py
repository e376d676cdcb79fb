# SPDX-License-Identifier: GPL-2.0-or-later
"""The Kubernetes fence of a tidal move, through the real ``kubernetes`` client against a
stand-in API server that speaks the API's REST and JSON (scripts/kube_standin)."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from gpushare.admin.plan.lending import Device
from gpushare.admin.tidal.kube import (
    FENCED_ANNOTATION,
    TAINT_KEY,
    KubeError,
    KubeFence,
    Settings,
    api_from_kubeconfig,
    rule_name,
)
from kube_standin.apiserver import ApiServer

GPU0, GPU1 = Device("k8s-01", 0), Device("k8s-01", 1)
SLICE = Device("k8s-01", 2, 3)


@pytest.fixture
def server(tmp_path: str) -> Iterator[tuple[ApiServer, str]]:
    api = ApiServer()
    api.add_node("k8s-01", taints=[{"key": "site/maintenance", "effect": "PreferNoSchedule"}],
                 annotations={"site/owner": "ml-platform"})
    api.add_node("k8s-02")
    api.add_slice("k8s-01", "gpu.nvidia.com", ["gpu-0", "gpu-1", "gpu-2-mig-3"])
    url = api.start()
    config = os.path.join(str(tmp_path), "kubeconfig")
    with open(config, "w") as out:
        out.write(api.kubeconfig(url))
    yield api, config
    api.stop()


def fence(config: str, mode: str, **settings: str) -> KubeFence:
    return KubeFence(api_from_kubeconfig(config), Settings(mode=mode, **settings))


def test_a_dra_fence_is_a_device_taint_rule_on_the_published_device(server) -> None:
    api, config = server
    kube = fence(config, "dra")
    kube.fence(GPU1, "night-batch")
    kube.fence(SLICE, "night-batch")
    kube.fence(GPU1, "night-batch")  # again, as after a crash: no error, no second rule
    assert set(api.taint_rules) == {rule_name(GPU1), rule_name(SLICE)}
    spec = api.taint_rules[rule_name(GPU1)]["spec"]
    assert spec == {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "k8s-01",
                                       "device": "gpu-1"},
                    "taint": {"key": TAINT_KEY, "value": "night-batch", "effect": "NoSchedule"}}
    assert api.taint_rules[rule_name(SLICE)]["spec"]["deviceSelector"]["device"] == "gpu-2-mig-3"
    assert kube.fenced() == {GPU1, SLICE}
    kube.unfence(GPU1)
    kube.unfence(GPU1)  # gone already: no error
    assert kube.fenced() == {SLICE}
    assert api.nodes["k8s-01"]["spec"]["taints"] == [
        {"key": "site/maintenance", "effect": "PreferNoSchedule"}]


def test_a_dra_fence_on_a_name_the_driver_does_not_publish_is_refused(server) -> None:
    api, config = server
    kube = fence(config, "dra", device_name="gpu{gpu}")
    with pytest.raises(KubeError, match=r"no ResourceSlice .* publishes a device 'gpu0'.*"
                       r"fence nothing"):
        kube.fence(GPU0, "night-batch")
    assert api.taint_rules == {}


def test_the_pool_is_the_one_the_resource_slice_names(server) -> None:
    api, config = server
    api.add_slice("k8s-02", "gpu.nvidia.com", ["gpu-0"], pool="rack7-k8s-02")
    kube = fence(config, "dra")
    assert kube.dra_key(Device("k8s-02", 0)) == ("gpu.nvidia.com", "rack7-k8s-02", "gpu-0")


def test_a_nodes_resource_slices_are_listed_once_for_all_its_devices(server) -> None:
    api, config = server
    kube = fence(config, "dra")
    keys = [kube.dra_key(device) for device in (GPU0, GPU1, SLICE, GPU0)]
    assert [key[2] for key in keys] == ["gpu-0", "gpu-1", "gpu-2-mig-3", "gpu-0"]
    listed = [path for method, path in api.requests
              if method == "GET" and "/resourceslices" in path]
    assert len(listed) == 1, listed
    kube.fence(GPU1, "night-batch")  # the fence takes its pool from the same listing
    assert len([path for method, path in api.requests
                if method == "GET" and "/resourceslices" in path]) == 1


def test_a_resource_version_the_cluster_does_not_serve_is_a_clear_error(server) -> None:
    _, config = server
    kube = fence(config, "dra", api_version="v1alpha3")
    with pytest.raises(KubeError, match=r"listing the ResourceSlices of node k8s-01 failed "
                       r"\(404"):
        kube.fence(GPU0, "night-batch")


def test_a_node_fence_taints_the_node_and_keeps_the_sites_taints_and_annotations(
        server) -> None:
    api, config = server
    kube = fence(config, "node")
    kube.fence(GPU0, "night-batch")
    kube.fence(SLICE, "night-batch")
    node = api.nodes["k8s-01"]
    assert node["spec"]["taints"] == [
        {"key": "site/maintenance", "effect": "PreferNoSchedule"},
        {"key": TAINT_KEY, "value": "tidal", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"] == {"site/owner": "ml-platform",
                                               FENCED_ANNOTATION: "k8s-01:0,k8s-01:2.3"}
    assert kube.fenced() == {GPU0, SLICE}
    kube.unfence(GPU0)
    assert [t["key"] for t in api.nodes["k8s-01"]["spec"]["taints"]] == [
        "site/maintenance", TAINT_KEY]  # one device still fenced: the taint stays
    kube.unfence(SLICE)
    node = api.nodes["k8s-01"]
    assert node["spec"]["taints"] == [{"key": "site/maintenance",
                                       "effect": "PreferNoSchedule"}]
    assert node["metadata"]["annotations"] == {"site/owner": "ml-platform"}
    assert kube.fenced() == set()


def test_a_node_changed_between_read_and_write_is_read_again_not_overwritten(server) -> None:
    api, config = server
    raced = []

    def other_writer(name: str) -> None:  # another controller adds its taint first, once
        if not raced:
            raced.append(name)
            node = api.nodes[name]
            node["spec"]["taints"].append({"key": "other/cordon", "effect": "NoSchedule"})
            node["metadata"]["resourceVersion"] = api.bump()

    api.before_patch = other_writer
    fence(config, "node").fence(GPU1, "night-batch")
    keys = [t["key"] for t in api.nodes["k8s-01"]["spec"]["taints"]]
    assert keys == ["site/maintenance", "other/cordon", TAINT_KEY]
    assert [m for m, _ in api.requests].count("PATCH") == 2


def test_wrong_credentials_and_no_server_say_which_call_failed(server, tmp_path) -> None:
    api, config = server
    api.token = "rotated"
    with pytest.raises(KubeError, match=r"reading node k8s-01 failed \(401"):
        fence(config, "node").fence(GPU0, "night-batch")
    api.token = "s3cret"
    api.stop()
    with pytest.raises(KubeError, match=r"reading node k8s-01 failed"):
        fence(config, "node").fence(GPU0, "night-batch")
    with pytest.raises(KubeError, match=r"cannot load Kubernetes credentials from /nonexistent"):
        api_from_kubeconfig("/nonexistent/kubeconfig")


def test_rule_names_are_dns_labels_and_distinct() -> None:
    names = {rule_name(d) for d in (Device("Node_A", 0), Device("node-a", 0),
                                    Device("node-a", 0, 1), Device("x" * 80, 7, 6))}
    assert len(names) == 4
    for name in names:
        assert len(name) <= 63 and name == name.lower() and "_" not in name
