"""What we emit matches the catalog and passes promtool's lint."""

from __future__ import annotations

import asyncio
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector as RegistryCollector
from prometheus_client.registry import CollectorRegistry

from demo.neighbours import line as neighbour_line
from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.collectors.base import GpuProcess, GpuRef, NodeState
from exporter.host.procfs import Procfs
from exporter.pagecache.collector import PageCacheCollector, PageCacheSettings
from gpupulse.metrics.attribution import ATTRIBUTION_METRICS
from gpupulse.metrics.pagecache import PAGECACHE_METRICS
from gpupulse.metrics.spec import validate
from tests.attribution.conftest import GPU_UUIDS
from tests.attribution.helpers import ProcfsTree, cgroup_v2_systemd, set_io
from tests.fakes.kubelet import FakeKubelet, pod


class _Static(RegistryCollector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


async def _all_families(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> list[Metric]:
    kubelet.pods = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
    weights = tmp_path / "models" / "llama"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"\0" * 8192)
    procfs.add(4001, cgroup_v2_systemd("aaaaaaa0-bbbb-cccc-dddd-eeeeeeeeeee0", "a" * 64), utime_ticks=10)
    set_io(procfs.root, 4001, rchar=4096, wchar=512)
    # a torchrun rank, so gpu_training_rank_info is written too
    procfs.set_environ(
        4001, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    )
    state = NodeState(gpus=gpus, processes=[GpuProcess(GPU_UUIDS[0], "0", 4001)])
    attribution = AttributionCollector(
        AttributionSettings(
            kubelet_socket_path=kubelet.socket_path, kubelet_pods_dir="", procfs_path=str(procfs.root)
        ),
        procfs=Procfs(str(procfs.root), 100),
    )
    pagecache = PageCacheCollector(PageCacheSettings(paths=(str(weights),), scan_mapped=False))
    try:
        return [*await attribution.collect(state), *await pagecache.collect(state)]
    finally:
        await attribution.close()
        await pagecache.close()


def test_specs_follow_the_catalog_conventions() -> None:
    assert validate(ATTRIBUTION_METRICS + PAGECACHE_METRICS) == []


async def test_every_sample_has_exactly_its_spec_labels(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    families = await _all_families(kubelet, procfs, tmp_path, gpus)
    specs = {s.name: s for s in ATTRIBUTION_METRICS + PAGECACHE_METRICS}
    seen = set()
    for family in families:
        for sample in family.samples:
            spec = specs[sample.name]
            seen.add(sample.name)
            assert tuple(sample.labels) == spec.labels, sample.name
    assert seen == set(specs)


@pytest.mark.integration
async def test_promtool_check_metrics_is_clean(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    registry = CollectorRegistry()
    registry.register(_Static(await _all_families(kubelet, procfs, tmp_path, gpus)))
    text = generate_latest(registry)
    proc = await asyncio.create_subprocess_exec(
        str(neighbour_line().promtool), "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    output, _ = await asyncio.wait_for(proc.communicate(text), 30)
    assert proc.returncode == 0, output.decode()
