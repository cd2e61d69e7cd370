"""Fixtures of the end-to-end tests: the shipped scenario, a fake kubelet and disk-backed weights."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.kubelet import FakeKubelet, pods_from_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "exporter" / "scenarios" / "shared-node.yaml"


def _fs_type(path: Path) -> str:
    best, kind = "", ""
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            _dev, mount, fs = line.split()[:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fs
    return kind


@pytest.fixture
def scenario_path() -> Path:
    """The shipped scenario file."""
    return SCENARIO


@pytest.fixture
def scenario_doc() -> dict[str, Any]:
    """The raw shared-node scenario (every section, NVML and foreign)."""
    doc: dict[str, Any] = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    return doc


@pytest.fixture
async def kubelet(scenario_doc: dict[str, Any]) -> AsyncIterator[FakeKubelet]:
    """A fake kubelet listing the scenario's pods; its socket sits in a short directory (108-byte limit)."""
    with tempfile.TemporaryDirectory(prefix="gp-e2e-") as short:
        fake = FakeKubelet(str(Path(short) / "kubelet.sock"), pods_from_scenario(scenario_doc))
        await fake.start()
        try:
            yield fake
        finally:
            await fake.stop()


@pytest.fixture
def weights_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a disk-backed filesystem: fadvise cannot evict tmpfs pages."""
    if _fs_type(tmp_path) not in {"tmpfs", "ramfs"}:
        yield tmp_path / "weights"
        return
    fallback = ROOT / ".work" / "test-e2e" / tmp_path.name
    try:
        yield fallback
    finally:
        shutil.rmtree(fallback, ignore_errors=True)
