"""GPU -> pod from the kubelet: idle GPUs, MIG, time-slicing, kubelet restarts."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.attribution.kubelet import PodResourcesClient
from exporter.collectors.base import GpuRef, NodeState, PodRef
from exporter.errors import CollectorError, PartialCollectorError, PodResourcesError
from tests.attribution.conftest import GPU_UUIDS, MIG_UUIDS
from tests.attribution.helpers import label_rows
from tests.fakes.kubelet import FakeKubelet, pod

ALLOC = "gpu_allocation_info"
ALLOC_LABELS = ("uuid", "gpu", "mig_uuid", "namespace", "pod", "container", "resource")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def make_collector(
    kubelet: FakeKubelet, tmp_path: Path, clock: FakeClock | None = None
) -> AttributionCollector:
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_refresh_interval_seconds=3600.0,  # tests drive refreshes themselves
        kubelet_max_stale_seconds=60.0,
        kubelet_pods_dir=str(tmp_path / "no-pods-dir"),
        procfs_path=str(tmp_path / "proc"),
    )
    return AttributionCollector(settings, clock=clock)


async def test_gpu_allocated_to_a_pod_shows_while_idle(
    kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (
        pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0], GPU_UUIDS[1]]}}),
        pod("serving", "web-0", {"nginx": {"cpu": []}}),
        pod("other", "fpga-job", {"main": {"xilinx.com/fpga": ["fpga0"]}}),
    )
    collector = make_collector(kubelet, tmp_path)
    state = NodeState(gpus=gpus, processes=())  # no process runs on any GPU
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()

    assert label_rows(families, ALLOC, *ALLOC_LABELS) == {
        (GPU_UUIDS[0], "0", "", "serving", "llama-0", "vllm", "nvidia.com/gpu"),
        (GPU_UUIDS[1], "1", "", "serving", "llama-0", "vllm", "nvidia.com/gpu"),
    }
    assert state.allocations == {
        GPU_UUIDS[0]: (PodRef("serving", "llama-0", "vllm"),),
        GPU_UUIDS[1]: (PodRef("serving", "llama-0", "vllm"),),
    }


async def test_mig_instances_map_to_parent_gpu_and_instance(
    kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (
        pod("ml", "small-a", {"worker": {"nvidia.com/mig-1g.10gb": [MIG_UUIDS[0]]}}),
        pod("ml", "small-b", {"worker": {"nvidia.com/mig-3g.40gb": [MIG_UUIDS[1]]}}),
    )
    collector = make_collector(kubelet, tmp_path)
    state = NodeState(gpus=gpus)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()

    assert label_rows(families, ALLOC, *ALLOC_LABELS) == {
        (GPU_UUIDS[7], "7", MIG_UUIDS[0], "ml", "small-a", "worker", "nvidia.com/mig-1g.10gb"),
        (GPU_UUIDS[7], "7", MIG_UUIDS[1], "ml", "small-b", "worker", "nvidia.com/mig-3g.40gb"),
    }
    assert state.allocations[MIG_UUIDS[1]] == (PodRef("ml", "small-b", "worker"),)


async def test_time_sliced_gpu_shared_by_three_pods_has_one_row_per_pod(
    kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    shared = "nvidia.com/gpu.shared"
    kubelet.pods = (
        pod("serving", "embed", {"server": {shared: [f"{GPU_UUIDS[2]}::0", f"{GPU_UUIDS[2]}::1"]}}),
        pod("serving", "rerank", {"server": {shared: [f"{GPU_UUIDS[2]}::2"]}}),
        pod("batch", "ocr", {"worker": {shared: [f"{GPU_UUIDS[2]}::3"]}}),
    )
    collector = make_collector(kubelet, tmp_path)
    state = NodeState(gpus=gpus)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()

    # Two replicas held by one container collapse into one row; each pod gets its own.
    assert label_rows(families, ALLOC, *ALLOC_LABELS) == {
        (GPU_UUIDS[2], "2", "", "serving", "embed", "server", shared),
        (GPU_UUIDS[2], "2", "", "serving", "rerank", "server", shared),
        (GPU_UUIDS[2], "2", "", "batch", "ocr", "worker", shared),
    }
    assert len(state.allocations[GPU_UUIDS[2]]) == 3


async def test_extra_resource_names_are_configurable(
    kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("lab", "x", {"c": {"example.com/vgpu": [GPU_UUIDS[3]]}}),)
    default = make_collector(kubelet, tmp_path)
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_pods_dir="",
        procfs_path=str(tmp_path / "proc"),
        extra_resource_names=("example.com/*",),
    )
    extra = AttributionCollector(settings)
    try:
        assert label_rows(await default.collect(NodeState(gpus=gpus)), ALLOC, "pod") == set()
        assert label_rows(await extra.collect(NodeState(gpus=gpus)), ALLOC, "pod") == {("x",)}
    finally:
        await default.close()
        await extra.close()


async def test_kubelet_restart_fails_the_round_keeps_last_mapping_then_recovers(
    kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
    clock = FakeClock()
    collector = make_collector(kubelet, tmp_path, clock)
    tracker = collector.tracker
    assert tracker is not None
    state = NodeState(gpus=gpus)
    try:
        await collector.collect(state)
        await kubelet.stop()  # kubelet restarting: socket gone
        await tracker.refresh_once()
        with pytest.raises(CollectorError, match="does not exist") as failed:
            await collector.collect(state)
        assert GPU_UUIDS[0] in state.allocations  # last good mapping still published
        # The failed round still carries true families, for a sampler that serves them.
        assert isinstance(failed.value, PartialCollectorError)
        assert label_rows(failed.value.families, ALLOC, "pod") == {("llama-0",)}

        clock.now += 61  # past max-stale: the mapping is dropped rather than served forever
        with pytest.raises(CollectorError) as stale:
            await collector.collect(state)
        assert state.allocations == {}
        assert isinstance(stale.value, PartialCollectorError)
        assert label_rows(stale.value.families, ALLOC, "pod") == set()

        kubelet.pods = (pod("serving", "llama-1", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
        await kubelet.start()
        await tracker.refresh_once()
        families = await collector.collect(state)
    finally:
        await collector.close()
    assert label_rows(families, ALLOC, "pod") == {("llama-1",)}


async def test_socket_missing_from_the_start_is_reported(tmp_path: Path, gpus: list[GpuRef]) -> None:
    absent = FakeKubelet(str(tmp_path / "never.sock"))
    collector = make_collector(absent, tmp_path)
    try:
        with pytest.raises(CollectorError, match=r"never\.sock does not exist"):
            await collector.collect(NodeState(gpus=gpus))
    finally:
        await collector.close()


async def test_rpc_error_and_garbage_are_pod_resources_errors(kubelet: FakeKubelet) -> None:
    client = PodResourcesClient(kubelet.socket_path, timeout_seconds=2.0)
    try:
        kubelet.fail_with = grpc.StatusCode.INTERNAL
        with pytest.raises(PodResourcesError, match="INTERNAL"):
            await client.list()
        kubelet.fail_with = None
        kubelet.garbage = b"\x0a\xff\xff"
        with pytest.raises(PodResourcesError, match="undecodable"):
            await client.list()
    finally:
        await client.close()


async def test_background_refresh_picks_up_changes_without_collect(
    kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("a", "p", {"c": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_refresh_interval_seconds=0.01,
        kubelet_pods_dir="",
        procfs_path=str(tmp_path / "proc"),
    )
    collector = AttributionCollector(settings)
    tracker = collector.tracker
    assert tracker is not None
    try:
        await collector.collect(NodeState(gpus=gpus))
        kubelet.pods = (pod("a", "q", {"c": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
        await tracker.wait_refreshed(tracker.refresh_count + 1)
        families = await collector.collect(NodeState(gpus=gpus))
    finally:
        await collector.close()
    assert label_rows(families, ALLOC, "pod") == {("q",)}


async def test_collect_never_calls_the_kubelet(
    kubelet: FakeKubelet, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("a", "p", {"c": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
    collector = make_collector(kubelet, tmp_path)
    try:
        await collector.collect(NodeState(gpus=gpus))  # starts the loop; its first List happens now
        calls = kubelet.calls
        for _ in range(5):
            await collector.collect(NodeState(gpus=gpus))
    finally:
        await collector.close()
    assert calls == 1
    assert kubelet.calls == calls
