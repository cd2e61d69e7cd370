"""DRA attribution: claims from pod-resources `dynamic_resources`, devices named through this node's
ResourceSlices (resource.k8s.io v1, falling back to v1beta2/v1beta1), against the in-process API server
through the exporter's own LIST/WATCH client and the fake kubelet speaking the real pod-resources proto."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.attribution.devices import allocations_from_pods, resolve, resource_matcher
from exporter.attribution.podresources_proto import (
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
)
from exporter.attribution.slices import ResourceSliceSource, SliceSettings, index_slices
from exporter.collectors.base import GpuRef, NodeState
from exporter.host.procfs import Procfs
from tests.attribution.conftest import GPU_UUIDS, MIG_UUIDS
from tests.attribution.helpers import ProcfsTree, procfs_from_scenario
from tests.attribution.test_end_to_end import series
from tests.exporter.harness import simulated_exporter
from tests.fakes.kube_api import FakeKubeAPI, resourceslices_from_scenario
from tests.fakes.kubelet import FakeKubelet, pods_from_scenario

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


def gpu_device(name: str, uuid: str) -> dict[str, Any]:
    """A device as NVIDIA's DRA driver publishes a whole GPU (resource.k8s.io/v1 form)."""
    return {
        "name": name,
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}, "index": {"int": 0}},
    }


def mig_device(name: str, uuid: str, parent: str) -> dict[str, Any]:
    """A MIG device: `uuid` is the MIG device's, `parentUUID` its GPU's."""
    return {
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": uuid},
            "parentUUID": {"string": parent},
            "profile": {"string": "1g.10gb"},
        },
    }


def claim(name: str, namespace: str, *devices: str, pool: str = NODE) -> DynamicResource:
    return DynamicResource(name, namespace, tuple(ClaimResource(DRIVER, pool, d) for d in devices))


def dra_pod(namespace: str, name: str, *claims: DynamicResource, container: str = "main") -> PodResources:
    return PodResources(name, namespace, (ContainerResources(container, (), claims),))


def publish_node(api: FakeKubeAPI) -> None:
    """GPUs 0-3 as DRA devices, GPU 7's two MIG devices, and another node's slice."""
    api.add_resourceslice(
        f"{NODE}-{DRIVER}-gpus",
        NODE,
        DRIVER,
        NODE,
        [gpu_device(f"gpu-{i}", GPU_UUIDS[i]) for i in range(4)]
        + [mig_device(f"gpu-7-mig-{i}", MIG_UUIDS[i], GPU_UUIDS[7]) for i in range(2)],
    )
    api.add_resourceslice("node-b-gpus", "node-b", DRIVER, "node-b", [gpu_device("gpu-0", "GPU-elsewhere")])


# A DRA node: a claim of its own, a claim shared by two pods, a MIG claim, GPU 3 unallocated,
# beside a device-plugin pod (a mixed node).
DRA_PODS = (
    dra_pod("serving", "llama-0", claim("llama-gpus", "serving", "gpu-0")),
    dra_pod("serving", "embed-0", claim("shared-gpu", "serving", "gpu-1")),
    dra_pod("serving", "rerank-0", claim("shared-gpu", "serving", "gpu-1")),
    dra_pod("research", "nb-0", claim("mig-small", "research", "gpu-7-mig-0"), container="jupyter"),
    PodResources(
        "train-0",
        "ml",
        (ContainerResources("worker", (ContainerDevices("nvidia.com/gpu", (GPU_UUIDS[4],)),)),),
    ),
)


def test_index_reads_v1_and_v1beta1_shapes_and_qualified_attribute_names() -> None:
    v1 = {
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "p", "generation": 1},
            "devices": [gpu_device("gpu-0", "GPU-a")],
        }
    }
    v1beta1 = {
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "q"},
            "devices": [{"name": "gpu-0", "basic": {"attributes": {f"{DRIVER}/uuid": {"string": "GPU-b"}}}}],
        }
    }
    other = {
        "spec": {"driver": "net.example.com", "pool": {"name": "p"}, "devices": [gpu_device("x", "GPU-c")]}
    }
    index = index_slices([v1, v1beta1, other], [DRIVER])
    assert {k: v.uuid for k, v in index.items()} == {
        (DRIVER, "p", "gpu-0"): "GPU-a",
        (DRIVER, "q", "gpu-0"): "GPU-b",
    }


def test_index_keeps_only_the_newest_generation_of_a_pool() -> None:
    def sl(gen: int, uuid: str, name: str) -> dict[str, Any]:
        return {
            "spec": {
                "driver": DRIVER,
                "pool": {"name": "p", "generation": gen},
                "devices": [gpu_device(name, uuid)],
            }
        }

    index = index_slices([sl(1, "GPU-old", "gpu-0"), sl(2, "GPU-new", "gpu-1")], [DRIVER])
    assert list(index) == [(DRIVER, "p", "gpu-1")]  # the generation-1 slice is stale


def test_malformed_slices_are_skipped_not_fatal() -> None:
    bad: list[Any] = [
        {},
        {"spec": None},
        {"spec": {"driver": DRIVER, "pool": "p"}},
        {"spec": {"driver": DRIVER, "pool": {"name": "p"}, "devices": [{"name": 3}, "x", {"name": "d"}]}},
    ]
    assert index_slices(bad, [DRIVER]) == {}


def test_claim_devices_become_allocations_shared_claims_split_mig_keeps_parent(gpus: list[GpuRef]) -> None:
    index = index_slices(
        [
            {
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": NODE},
                    "devices": [gpu_device(f"gpu-{i}", GPU_UUIDS[i]) for i in range(4)]
                    + [
                        mig_device("gpu-7-mig-0", MIG_UUIDS[0], GPU_UUIDS[7]),
                        mig_device("m9", "MIG-unknown", GPU_UUIDS[7]),
                    ],
                }
            }
        ],
        [DRIVER],
    )
    pods = (*DRA_PODS, dra_pod("research", "nb-1", claim("late", "research", "m9", "gpu-9")))
    rows = resolve(allocations_from_pods(pods, resource_matcher(), index), gpus)
    got = {(r.pod.pod, r.uuid, r.gpu, r.mig_uuid, r.resource) for r in rows}
    assert got == {
        ("llama-0", GPU_UUIDS[0], "0", "", DRIVER),
        ("embed-0", GPU_UUIDS[1], "1", "", DRIVER),
        ("rerank-0", GPU_UUIDS[1], "1", "", DRIVER),
        ("nb-0", GPU_UUIDS[7], "7", MIG_UUIDS[0], DRIVER),
        ("train-0", GPU_UUIDS[4], "4", "", "nvidia.com/gpu"),
        # a MIG device NVML does not list: its slice still names the GPU
        ("nb-1", GPU_UUIDS[7], "7", "MIG-unknown", DRIVER),
        # a device no slice names (yet): the pod shows, without a uuid
        ("nb-1", "", "", "", DRIVER),
    }
    assert not any(r.uuid == GPU_UUIDS[3] for r in rows)  # GPU 3 is nobody's


def test_other_drivers_claims_are_not_gpus(gpus: list[GpuRef]) -> None:
    pod = dra_pod("ns", "p", DynamicResource("nic", "ns", (ClaimResource("net.example.com", NODE, "eth1"),)))
    assert allocations_from_pods((pod,), resource_matcher(), {}) == ()


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    server = FakeKubeAPI()
    await server.start()
    yield server
    await server.stop()


def source_for(api: FakeKubeAPI, tmp_path: Path) -> ResourceSliceSource:
    token = tmp_path / "token"
    token.write_text(api.token)
    return ResourceSliceSource(
        SliceSettings(NODE, api.url, token_path=token, ca_path=None, retry_seconds=0.05)
    )


@pytest.mark.parametrize(
    ("served", "expected"),
    [(("v1", "v1beta2", "v1beta1"), "v1"), (("v1beta2", "v1beta1"), "v1beta2"), (("v1beta1",), "v1beta1")],
)
async def test_source_uses_the_newest_served_version_and_the_node_selector(
    api: FakeKubeAPI, tmp_path: Path, served: tuple[str, ...], expected: str
) -> None:
    api.resourceslice_versions = served
    publish_node(api)
    source = source_for(api, tmp_path)
    source.start()
    try:
        await source.wait_until(lambda: source.stats.lists > 0, 10)
        assert source.version == expected
        index = source.index()
        assert index[(DRIVER, NODE, "gpu-2")].uuid == GPU_UUIDS[2]
        assert index[(DRIVER, NODE, "gpu-7-mig-1")].parent_uuid == GPU_UUIDS[7]
        assert all(pool == NODE for _, pool, _ in index)  # node-b's slice never listed
        lists = api.calls("GET", r"/apis/resource\.k8s\.io/.*/resourceslices$")
        assert lists and all(c.query.get("fieldSelector") == f"spec.nodeName={NODE}" for c in lists)
    finally:
        await source.close()


async def test_source_follows_the_watch_new_and_deleted_slices(api: FakeKubeAPI, tmp_path: Path) -> None:
    source = source_for(api, tmp_path)
    source.start()
    try:
        await source.wait_until(lambda: source.stats.watches > 0, 10)
        await api.wait_open_watches(1)
        assert source.index() == {}
        publish_node(api)
        await source.wait_until(lambda: (DRIVER, NODE, "gpu-0") in source.index(), 10)
        api.remove_resourceslice(f"{NODE}-{DRIVER}-gpus")
        await source.wait_until(lambda: source.index() == {}, 10)
        assert source.stats.lists == 1  # followed by the watch, not by listing again
    finally:
        await source.close()


async def test_a_version_no_longer_served_after_an_upgrade_is_left_for_one_that_is(
    api: FakeKubeAPI, tmp_path: Path
) -> None:
    api.resourceslice_versions = ("v1beta2", "v1beta1")
    publish_node(api)
    source = source_for(api, tmp_path)
    source.start()
    try:
        await source.wait_until(lambda: source.stats.watches > 0, 10)
        await api.wait_open_watches(1)
        assert source.version == "v1beta2"
        api.resourceslice_versions = ("v1",)  # the upgrade: the API server restarts serving only v1
        api.close_watches()
        await source.wait_until(lambda: source.version == "v1" and source.stats.watches > 2, 10)
        assert source.index()[(DRIVER, NODE, "gpu-2")].uuid == GPU_UUIDS[2]
        assert source.stats.lists == 2 and source.stats.failures == 1  # one 404 WATCH, then one LIST
    finally:
        await source.close()


async def test_no_dra_api_on_the_server_keeps_an_empty_index_and_says_why(
    api: FakeKubeAPI, tmp_path: Path
) -> None:
    api.resourceslice_versions = ()  # Kubernetes before 1.32 with DRA off
    source = source_for(api, tmp_path)
    source.start()
    try:
        await source.wait_until(lambda: source.stats.failures > 0, 10)
        assert source.index() == {} and "not served" in source.error
    finally:
        await source.close()


async def test_api_errors_keep_the_last_good_index(api: FakeKubeAPI, tmp_path: Path) -> None:
    publish_node(api)
    source = source_for(api, tmp_path)
    source.start()
    try:
        await source.wait_until(lambda: source.stats.watches > 0, 10)
        api.fail("GET", r"/apis/resource\.k8s\.io/v1/resourceslices", 500, "InternalError", times=3)
        api.close_watches()
        await source.wait_until(lambda: source.stats.failures > 0, 10)
        assert source.index()[(DRIVER, NODE, "gpu-0")].uuid == GPU_UUIDS[0]
    finally:
        await source.close()


async def test_collector_attributes_dra_claims_on_a_mixed_node(
    api: FakeKubeAPI, kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    publish_node(api)
    kubelet.pods = DRA_PODS
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path, kubelet_pods_dir="", kubelet_first_wait_seconds=5
    )
    collector = AttributionCollector(settings)
    collector.use_slices(source_for(api, tmp_path))
    state = NodeState(gpus=gpus)
    try:
        metrics = list(await collector.collect(state))
    finally:
        await collector.close()
    (info,) = [m for m in metrics if m.name == "gpu_allocation_info"]
    rows = {
        (s.labels["pod"], s.labels["gpu"], s.labels["mig_uuid"], s.labels["resource"]) for s in info.samples
    }
    assert rows == {
        ("llama-0", "0", "", DRIVER),
        ("embed-0", "1", "", DRIVER),
        ("rerank-0", "1", "", DRIVER),
        ("nb-0", "7", MIG_UUIDS[0], DRIVER),
        ("train-0", "4", "", "nvidia.com/gpu"),
    }
    assert [p.pod for p in state.allocations[GPU_UUIDS[1]]] == ["embed-0", "rerank-0"]
    assert state.allocations[MIG_UUIDS[0]][0].pod == "nb-0"


async def test_collector_without_slices_reports_claims_without_uuid_as_a_partial_round(
    kubelet: FakeKubelet, gpus: list[GpuRef]
) -> None:
    from exporter.errors import PartialCollectorError

    kubelet.pods = DRA_PODS[:1]
    collector = AttributionCollector(
        AttributionSettings(kubelet_socket_path=kubelet.socket_path, kubelet_pods_dir="")
    )
    try:
        with pytest.raises(PartialCollectorError, match="DRA claim devices without a uuid") as err:
            await collector.collect(NodeState(gpus=gpus))
    finally:
        await collector.close()
    (info,) = [m for m in err.value.families if m.name == "gpu_allocation_info"]
    assert [(s.labels["pod"], s.labels["uuid"]) for s in info.samples] == [("llama-0", "")]


DRA_SCENARIO = Path(__file__).resolve().parents[1] / "fixtures" / "attribution" / "dra-node.yaml"


async def test_dra_node_end_to_end_every_gpu_reported_and_every_process_attributed(
    api: FakeKubeAPI, kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path
) -> None:
    doc = yaml.safe_load(DRA_SCENARIO.read_text())
    resourceslices_from_scenario(api, doc)
    kubelet.pods = pods_from_scenario(doc)
    procfs_from_scenario(procfs, tmp_path / "pods", doc)
    settings = AttributionSettings(
        interval_seconds=1.0,
        kubelet_socket_path=kubelet.socket_path,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
        kubelet_first_wait_seconds=5,
    )
    attribution = AttributionCollector(settings, procfs=Procfs(str(procfs.root), 100))
    token = tmp_path / "token"
    token.write_text(api.token)
    attribution.use_slices(
        ResourceSliceSource(SliceSettings(str(doc["node"]), api.url, token_path=token, ca_path=None))
    )
    try:
        async with simulated_exporter(
            DRA_SCENARIO, collectors=["device", "processes", "mig"], extra=[attribution]
        ) as h:
            for _ in range(3):  # publish processes, attribute them, label them
                await h.tick(1.0)
            text = h.text()
    finally:
        await attribution.close()
    uuids = [g["uuid"] for g in doc["gpus"]]
    # every GPU is reported, the one nobody claimed included (dcgm-exporter lost them on DRA nodes)
    assert {s["uuid"] for s in series(text, "gpu_info")} == set(uuids)
    rows = {(s["pod"], s["gpu"], s["mig_uuid"], s["resource"]) for s in series(text, "gpu_allocation_info")}
    mig0 = doc["gpus"][3]["mig"]["instances"][0]["uuid"]
    assert rows == {
        ("llama-0", "0", "", DRIVER),
        ("embed-0", "1", "", DRIVER),
        ("rerank-0", "1", "", DRIVER),
        ("nb-0", "3", mig0, DRIVER),
        ("train-0", "4", "", "nvidia.com/gpu"),
    }
    memory = {s["pid"]: s["pod"] for s in series(text, "gpu_process_memory_used_bytes")}
    assert memory == {
        "41001": "llama-0",
        "42001": "embed-0",
        "42002": "rerank-0",
        "44001": "nb-0",
        "45001": "train-0",
    }
    assert 'gpupulse_collector_success{collector="attribution"} 1.0' in text


async def test_a_cluster_without_dra_logs_the_failure_once(
    api: FakeKubeAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.resourceslice_versions = ()
    source = source_for(api, tmp_path)
    source.start()
    try:
        await source.wait_until(lambda: source.stats.failures >= 3, 10)
    finally:
        await source.close()
    warnings = [
        r for r in caplog.records if r.name == "exporter.attribution.slices" and r.levelname == "WARNING"
    ]
    assert len(warnings) == 1
