"""Fixtures for the Kubernetes tests: the in-process API server, a real client, a stepping clock."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

# `pytest tests/kube` (not only `python -m pytest`) must find tests.fakes
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from gpupulse.clock import Clock  # noqa: E402
from remediation.backends.kubernetes import KubernetesBackend, KubernetesBackendSettings  # noqa: E402
from remediation.kube.client import KubeClient, KubeClientSettings  # noqa: E402
from tests.fakes.kube_api import FakeKubeAPI  # noqa: E402


class StepClock(Clock):
    """A clock whose sleep returns at once and moves time forward; hooks run after each sleep."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.base = datetime(2026, 1, 1, tzinfo=UTC)
        self.sleeps: list[float] = []
        self.after_sleep: list[Callable[[int], None]] = []

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.utcnow().timestamp()

    def utcnow(self) -> datetime:
        return self.base + timedelta(seconds=self.t)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        for hook in self.after_sleep:
            hook(len(self.sleeps))
        await asyncio.sleep(0)


class GatedClock(StepClock):
    """Like StepClock, but the first sleep waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        await super().sleep(seconds)


@pytest.fixture
async def kube_api() -> AsyncIterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def kube_client(kube_api: FakeKubeAPI, tmp_path: Path) -> AsyncIterator[KubeClient]:
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    client = await KubeClient.connect(
        KubeClientSettings(kubeconfig_path=str(kubeconfig), request_timeout_seconds=5.0)
    )
    yield client
    await client.close()


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


def backend_settings(**overrides: object) -> KubernetesBackendSettings:
    """Test settings: short deadlines so a blocked drain ends within a few stepped seconds."""
    values: dict[str, object] = {
        "namespace": "gpupulse",
        "identity": "replica-a",
        "eviction_deadline_seconds": 20.0,
        "eviction_backoff_initial_seconds": 1.0,
        "eviction_backoff_max_seconds": 8.0,
        "node_lease_duration_seconds": 60,
    }
    values.update(overrides)
    return KubernetesBackendSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def make_backend(kube_client: KubeClient, clock: StepClock) -> Callable[..., KubernetesBackend]:
    def make(**overrides: object) -> KubernetesBackend:
        return KubernetesBackend(kube_client, backend_settings(**overrides), clock)

    return make
