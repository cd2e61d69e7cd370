"""Simulated NVML + the exporter's sampler + attribution: /metrics ties processes and GPUs to pods."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.host.procfs import Procfs
from tests.attribution.conftest import SHARED_GPUS as SCENARIO
from tests.attribution.helpers import ProcfsTree, procfs_from_scenario
from tests.exporter.harness import simulated_exporter
from tests.fakes.kubelet import FakeKubelet, pods_from_scenario


def series(text: str, name: str) -> list[dict[str, str]]:
    """Label sets of every sample of `name` in exposition text."""
    out = []
    for match in re.finditer(rf"^{name}\{{([^}}]*)\}} ", text, re.M):
        out.append(dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))))
    return out


async def test_metrics_show_each_process_and_gpu_with_its_pod(
    shared_gpus_doc: dict[str, Any], kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path
) -> None:
    doc = shared_gpus_doc
    kubelet.pods = pods_from_scenario(doc)
    procfs_from_scenario(procfs, tmp_path / "pods", doc)
    settings = AttributionSettings(
        interval_seconds=1.0,
        kubelet_socket_path=kubelet.socket_path,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
    )
    attribution = AttributionCollector(settings, procfs=Procfs(str(procfs.root), 100))
    try:
        async with simulated_exporter(
            SCENARIO, collectors=["device", "processes", "mig"], extra=[attribution]
        ) as h:
            # Tick 1 publishes the processes, tick 2 attributes them, tick 3 labels them.
            for _ in range(3):
                await h.tick(1.0)
            text = h.text()
    finally:
        await attribution.close()

    memory = {
        s["pid"]: (s["namespace"], s["pod"], s["container"])
        for s in series(text, "gpu_process_memory_used_bytes")
    }
    assert memory["31001"] == ("serving", "llama-70b-0", "vllm")
    assert memory["32001"] == ("serving", "embed-0", "server")
    assert memory["32002"] == ("serving", "rerank-0", "server")
    assert memory["32003"] == ("batch", "ocr-0", "worker")
    assert memory["34002"] == ("ml", "small-b", "worker")
    assert memory["39001"] == ("", "", "")
    shared = {s["pod"] for s in series(text, "gpu_allocation_info") if s["gpu"] == "2"}
    assert shared == {"embed-0", "rerank-0", "ocr-0"}
    idle_allocated = {s["gpu"] for s in series(text, "gpu_allocation_info")}
    assert idle_allocated == {str(i) for i in range(8)}
    assert 'gpupulse_collector_success{collector="attribution"} 1.0' in text
    cpu = {s["pid"]: s["pod"] for s in series(text, "gpu_process_host_cpu_seconds_total")}
    assert cpu["33004"] == "train-0"
