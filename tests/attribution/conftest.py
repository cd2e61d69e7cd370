"""Fixtures for attribution tests: a fake kubelet on a unix socket, a procfs tree, NVML-like GPUs."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

# tests/fakes is shared by areas as `tests.fakes`; make the repo root importable if nothing else did.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from exporter.collectors.base import GpuRef  # noqa: E402
from tests.attribution.helpers import ProcfsTree  # noqa: E402
from tests.fakes.kubelet import FakeKubelet  # noqa: E402

SHARED_GPUS = Path(__file__).resolve().parents[1] / "fixtures" / "attribution" / "shared-gpus.yaml"
GPU_UUIDS = [f"GPU-0000000{i}-1111-2222-3333-44444444444{i}" for i in range(8)]
MIG_UUIDS = ["MIG-aaaaaaaa-0000-5555-6666-777777777770", "MIG-aaaaaaaa-0000-5555-6666-777777777771"]


@pytest.fixture
def gpus() -> list[GpuRef]:
    """Eight GPUs; GPU 7 is in MIG mode with two instances."""
    refs = [
        GpuRef(uuid=u, index=str(i), name="NVIDIA H100 80GB HBM3", pci_bus_id=f"0000:{i:02x}:00.0")
        for i, u in enumerate(GPU_UUIDS)
    ]
    refs += [
        GpuRef(
            uuid=GPU_UUIDS[7], index="7", name="NVIDIA H100 80GB HBM3", pci_bus_id="0000:07:00.0", mig_uuid=m
        )
        for m in MIG_UUIDS
    ]
    return refs


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    """A started fake kubelet; stopped (socket removed) after the test."""
    fake = FakeKubelet(str(tmp_path / "kubelet.sock"))
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def procfs(tmp_path: Path) -> ProcfsTree:
    """An empty procfs fixture tree."""
    return ProcfsTree(tmp_path / "proc")


@pytest.fixture
def shared_gpus_doc() -> dict[str, Any]:
    """The raw shared-gpus scenario (pods, processes, GPU and MIG UUIDs)."""
    with open(SHARED_GPUS, encoding="utf-8") as f:
        loaded: dict[str, Any] = yaml.safe_load(f)
    return loaded
