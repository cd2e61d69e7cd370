"""End to end on a scenario: 8 GPUs, pods sharing GPUs by time-slicing and MIG, a host process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.collectors.base import GpuProcess, GpuRef, NodeState, PodRef
from exporter.host.procfs import Procfs
from tests.attribution.conftest import SHARED_GPUS as SCENARIO
from tests.attribution.helpers import ProcfsTree, label_rows, procfs_from_scenario
from tests.fakes.kubelet import FakeKubelet, pods_from_scenario


def node_view(doc: dict[str, Any]) -> tuple[list[GpuRef], list[GpuProcess]]:
    """What the device and processes collectors would publish for the scenario."""
    gpus, processes = [], []
    for i, g in enumerate(doc["gpus"]):
        gpus.append(GpuRef(uuid=g["uuid"], index=str(i), name=g["model"], pci_bus_id=""))
        gpus += [
            GpuRef(g["uuid"], str(i), g["model"], "", mig_uuid=m["uuid"])
            for m in (g.get("mig") or {}).get("instances", ())
        ]
    for p in doc["processes"]:
        g = doc["gpus"][p["gpu"]]
        mig = g["mig"]["instances"][p["mig_instance"]]["uuid"] if "mig_instance" in p else ""
        processes.append(GpuProcess(g["uuid"], str(p["gpu"]), p["pid"], mig_uuid=mig))
    return gpus, processes


def test_fixture_is_a_valid_simulator_scenario() -> None:
    from exporter.sim.scenario import load_scenario

    scenario = load_scenario(str(SCENARIO))
    assert len(scenario.gpus) == 8
    assert "pods" in scenario.extra


async def test_every_process_and_gpu_is_tied_to_the_right_pod(
    shared_gpus_doc: dict[str, Any], kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path
) -> None:
    doc = shared_gpus_doc
    kubelet.pods = pods_from_scenario(doc)
    procfs_from_scenario(procfs, tmp_path / "pods", doc)
    gpus, processes = node_view(doc)
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
    )
    collector = AttributionCollector(settings, procfs=Procfs(str(procfs.root), 100))
    state = NodeState(gpus=gpus, processes=processes)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()

    assert state.pid_pods == {
        31001: PodRef("serving", "llama-70b-0", "vllm"),
        31002: PodRef("serving", "llama-70b-0", "vllm"),
        32001: PodRef("serving", "embed-0", "server"),
        32002: PodRef("serving", "rerank-0", "server"),
        32003: PodRef("batch", "ocr-0", "worker"),
        33001: PodRef("research", "train-0", "trainer"),
        33002: PodRef("research", "train-0", "trainer"),
        33003: PodRef("research", "train-0", "trainer"),
        33004: PodRef("research", "train-0", "trainer"),
        34001: PodRef("ml", "small-a", "worker"),
        34002: PodRef("ml", "small-b", "worker"),
        39001: PodRef("", "", ""),
    }
    rows = label_rows(families, "gpu_allocation_info", "gpu", "mig_uuid", "pod")
    assert {(gpu, pod) for gpu, _, pod in rows} == {
        ("0", "llama-70b-0"), ("1", "llama-70b-0"),
        ("2", "embed-0"), ("2", "rerank-0"), ("2", "ocr-0"),
        ("3", "train-0"), ("4", "train-0"), ("5", "train-0"), ("6", "train-0"),
        ("7", "small-a"), ("7", "small-b"),
    }  # fmt: skip
    assert {mig for gpu, mig, _ in rows if gpu == "7"} == {
        m["uuid"] for m in doc["gpus"][7]["mig"]["instances"]
    }
    cpu = label_rows(families, "gpu_process_host_cpu_seconds_total", "pid", "gpu", "pod")
    assert ("32002", "2", "rerank-0") in cpu and ("39001", "3", "") in cpu
    assert len(cpu) == 12
