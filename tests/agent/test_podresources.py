"""Pod attribution against a real gRPC server generated from the kubelet's own pod-resources proto."""

from __future__ import annotations

import pytest

from auditor.agent.podresources import Allocation, PodResourcesClient, attribute, messages
from auditor.agent.recorded import RecordedSampler
from auditor.agent.sampler import Device
from auditor.agent.server import Agent
from auditor.core.model import PodRef
from auditor.errors import SourceUnavailable

GPU0 = Device(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H200", "00000000:19:00.0")
GPU1 = Device(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA H200", "00000000:3B:00.0")
MIG_A = Device(
    2,
    "GPU-cccccccc-0000-0000-0000-000000000000",
    "NVIDIA H200",
    "00000000:4C:00.0",
    gi_id="3",
    gi_profile="1g.18gb",
    mig_uuid="MIG-11111111-2222-3333-4444-555555555555",
)
MIG_B = Device(
    2,
    "GPU-cccccccc-0000-0000-0000-000000000000",
    "NVIDIA H200",
    "00000000:4C:00.0",
    gi_id="5",
    gi_profile="3g.71gb",
    mig_uuid="MIG-66666666-2222-3333-4444-555555555555",
)
GPU3 = Device(3, "GPU-dddddddd-0000-0000-0000-000000000000", "NVIDIA H200", "00000000:5D:00.0")
DEVICES = [GPU0, GPU1, MIG_A, MIG_B, GPU3]


def test_our_messages_match_the_kubelet_proto_on_the_wire(kubelet_api):
    """Bytes from the kubelet's generated classes parse with ours, and ours parse with theirs."""
    pb = kubelet_api.pb2
    theirs = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    pb.ContainerResources(
                        name="c",
                        cpu_ids=[1],
                        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-x", "GPU-y"])],
                        dynamic_resources=[pb.DynamicResource(claim_name="claim")],
                    )
                ],
            ),
        ]
    )
    request_cls, response_cls = messages()
    ours = response_cls.FromString(theirs.SerializeToString())
    assert [(a.namespace, a.pod, a.container, a.resource, a.device_ids) for a in _allocs(ours)] == [
        ("ns", "p", "c", "nvidia.com/gpu", ("GPU-x", "GPU-y"))
    ]
    back = pb.ListPodResourcesResponse.FromString(ours.SerializeToString())
    assert back.pod_resources[0].containers[0].devices[0].device_ids == ["GPU-x", "GPU-y"]
    assert request_cls().SerializeToString() == pb.ListPodResourcesRequest().SerializeToString() == b""
    # the method path the client calls is the kubelet's: package v1, service PodResourcesLister, rpc List
    assert pb.DESCRIPTOR.package == "v1" and "PodResourcesLister" in pb.DESCRIPTOR.services_by_name
    assert "List" in pb.DESCRIPTOR.services_by_name["PodResourcesLister"].methods_by_name


def _allocs(resp):
    from auditor.agent.podresources import allocations

    return allocations(resp)


def test_list_and_attribute_whole_gpus_mig_and_time_slicing(kubelet):
    kubelet.set_pods(
        ("team-a", "train-0", "main", "nvidia.com/gpu", [GPU0.uuid]),
        ("team-a", "train-1", "main", "nvidia.com/gpu", ["1"]),  # --device-id-strategy=index
        ("team-b", "small", "worker", "nvidia.com/mig-1g.18gb", [MIG_A.mig_uuid]),
        ("team-b", "mid", "worker", "nvidia.com/mig-3g.71gb", [MIG_B.mig_uuid]),
        ("team-c", "share-2", "x", "nvidia.com/gpu", [GPU3.uuid + "::1"]),
        ("team-c", "share-1", "x", "nvidia.com/gpu", [GPU3.uuid + "::0"]),
        ("team-d", "nic", "x", "example.com/nic", ["eth9"]),
        ("team-e", "elsewhere", "x", "nvidia.com/gpu", ["GPU-not-on-this-node"]),
    )
    client = PodResourcesClient(kubelet.socket_path, timeout=5)
    try:
        allocs = client.list()
    finally:
        client.close()
    assert Allocation("team-a", "train-0", "main", "nvidia.com/gpu", (GPU0.uuid,)) in allocs
    owners, warnings = attribute(allocs, DEVICES)
    assert owners == {
        GPU0.key: PodRef("team-a", "train-0", "main"),
        GPU1.key: PodRef("team-a", "train-1", "main"),
        MIG_A.key: PodRef("team-b", "small", "worker"),
        MIG_B.key: PodRef("team-b", "mid", "worker"),
        GPU3.key: PodRef("team-c", "share-1", "x"),  # shared: the first by name, deterministically
    }
    assert any("shared" in w and "share-2" in w for w in warnings)
    assert any("GPU-not-on-this-node" in w for w in warnings)
    assert not any("eth9" in w for w in warnings)  # other resources are ignored, not reported


def test_extra_resource_names_are_attributed():
    allocs = [Allocation("ns", "p", "c", "example.com/h200", (GPU0.uuid,))]
    assert attribute(allocs, DEVICES)[0] == {}
    assert attribute(allocs, DEVICES, ("example.com/h200",))[0] == {GPU0.key: PodRef("ns", "p", "c")}


def test_unreachable_socket_is_source_unavailable(tmp_path):
    client = PodResourcesClient(str(tmp_path / "missing.sock"), timeout=1)
    try:
        with pytest.raises(SourceUnavailable, match="pod-resources List"):
            client.list()
    finally:
        client.close()


def test_agent_keeps_the_last_answer_then_drops_stale_owners(kubelet):
    """A kubelet restart keeps labels for stale_after seconds; after that GPUs go unattributed, never misattributed."""
    kubelet.set_pods(("team-a", "train-0", "main", "nvidia.com/gpu", [GPU0.uuid]))
    now = [1000.0]
    sampler = RecordedSampler(
        [GPU0, GPU1], {GPU0.key: [{"DCGM_FI_DEV_GPU_UTIL": 100.0}], GPU1.key: [{"DCGM_FI_DEV_GPU_UTIL": 0.0}]}
    )
    client = PodResourcesClient(kubelet.socket_path, timeout=2)
    agent = Agent(
        sampler, node_name="n1", pod_resources=client, stale_after=30, first_window=3600, clock=lambda: now[0]
    )
    agent.refresh_owners()
    agent.tick()
    kubelet.stop()
    agent.refresh_owners()  # fails: keeps the last answer
    assert agent.attribution_errors == 1
    now[0] += 10
    agent.tick()
    now[0] += 40
    agent.tick()
    means, _ = agent.window.take("t", now[0])
    owners = {(k, o) for k, o in means}
    assert (GPU0.key, PodRef("team-a", "train-0", "main")) in owners
    assert (GPU0.key, None) in owners  # the last tick, past stale_after
    assert (GPU1.key, None) in owners
    client.close()
