"""In-test collectors for the sampler and the server (no NVML)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.collectors.base import NodeState
from exporter.errors import CollectorError


class FakeCollector:
    """Emits one gauge; can fail or block on an event, to exercise the sampler."""

    def __init__(self, name: str = "fake", value: float = 1.0) -> None:
        self.name = name
        self.interval_seconds: float | None = None
        self.value = value
        self.fail = False
        self.block: asyncio.Event | None = None
        self.calls = 0
        self.closed = False

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        self.calls += 1
        if self.block is not None:
            await self.block.wait()
        if self.fail:
            raise CollectorError("told to fail")
        fam = GaugeMetricFamily(f"{self.name}_value", "A test value.", labels=["k"])
        fam.add_metric(["v"], self.value)
        return [fam]

    async def close(self) -> None:
        self.closed = True
