"""Collectors on their own interval run beside the ticks: a slow round never delays the GPU series, and
its last families are served until it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.collectors.base import NodeState
from exporter.config import ExporterSettings
from exporter.sampler import Sampler
from tests.exporter.clocks import StepClock


class _Gauge:
    """A collector that returns one gauge; with `gate`, each round waits until the gate opens."""

    def __init__(self, name: str, interval: float | None, gate: asyncio.Event | None = None) -> None:
        self.name, self.interval_seconds, self.gate = name, interval, gate
        self.rounds = 0
        self.started = asyncio.Event()

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        self.rounds += 1
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        family = GaugeMetricFamily(f"{self.name}_round", "which round this is")
        family.add_metric([], float(self.rounds))
        return [family]

    async def close(self) -> None:
        return None


def _value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


async def test_a_slow_round_runs_beside_the_ticks_and_is_served_once_it_ends() -> None:
    gate = asyncio.Event()
    device, plugin = _Gauge("device", None), _Gauge("plugin", 5.0, gate)
    clock = StepClock()
    sampler = Sampler([device, plugin], ExporterSettings(slow_collector_wait_seconds=0.0), clock)
    try:
        first = (await sampler.sample_once()).body.decode()
        assert plugin.started.is_set() and not gate.is_set()  # its round is out, the tick is not
        assert _value(first, "device_round") == 1.0
        assert _value(first, "plugin_round") is None
        assert 'gpupulse_collector_success{collector="plugin"}' not in first  # no round has ended
        clock.advance(1.0)
        second = (await sampler.sample_once()).body.decode()
        assert _value(second, "device_round") == 2.0
        assert plugin.rounds == 1  # not started again while its round is out
        gate.set()
        await asyncio.sleep(0)  # the round finishes
        clock.advance(1.0)
        third = (await sampler.sample_once()).body.decode()
        assert _value(third, "plugin_round") == 1.0
        assert 'gpupulse_collector_success{collector="plugin"} 1.0' in third
        clock.advance(1.0)
        fourth = (await sampler.sample_once()).body.decode()
        assert plugin.rounds == 1 and _value(fourth, "plugin_round") == 1.0  # served until due again
        clock.advance(3.0)  # 5 s after its round started
        await sampler.sample_once()
        assert plugin.rounds == 2
    finally:
        gate.set()
        await sampler.close()


async def test_a_fast_slow_round_is_in_the_same_tick() -> None:
    plugin = _Gauge("plugin", 5.0)
    sampler = Sampler([plugin], ExporterSettings(slow_collector_wait_seconds=30.0), StepClock())
    try:
        text = (await sampler.sample_once()).body.decode()
    finally:
        await sampler.close()
    assert _value(text, "plugin_round") == 1.0
