"""The exporter's NVML side on a simulated node with a manual clock, driven tick by tick."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from exporter.collectors.base import Collector
from exporter.collectors.gpus import GpuFleet
from exporter.collectors.xid import XidCounter
from exporter.config import ExporterSettings
from exporter.nvml import Nvml, XidWatcher
from exporter.registry import BUILTINS, BuiltinContext
from exporter.sampler import Sampler
from exporter.sim import ManualClock, SimulatedNvml, install, load_scenario
from exporter.sim.scenario import Scenario
from exporter.snapshot import Snapshot
from tests.exporter.clocks import ScenarioClock

SETTINGS = ExporterSettings(sampling_interval_seconds=1.0, gpu_call_timeout_seconds=0.3)


@dataclass
class Harness:
    scenario: Scenario
    sim: SimulatedNvml
    clock: ManualClock
    start: float
    nvml: Nvml
    fleet: GpuFleet
    xids: XidCounter
    watcher: XidWatcher
    sampler: Sampler

    def expected_xids(self) -> int:
        """XID events the scenario has delivered by now (those before the watcher registered are lost)."""
        now = self.clock.monotonic()
        n = sum(e.count for e in self.scenario.events if self.start <= e.at_seconds <= now)
        for g in self.scenario.gpus:
            lost = g.lost_at_seconds
            if g.xid_on_loss and lost is not None and self.start <= lost <= now:
                n += 1
        return n

    async def settle_xids(self, timeout_seconds: float = 30.0) -> None:
        """Wait until the event thread has handed over every XID due by now (the bound only ends a
        broken run: on a machine under load the thread took more than 5 s to be scheduled)."""
        deadline = time.monotonic() + timeout_seconds
        want = self.expected_xids()
        while sum(self.xids.counts().values()) < want:
            if time.monotonic() > deadline:
                raise AssertionError(f"XID events not delivered: {self.xids.counts()} of {want}")
            await asyncio.sleep(0.01)

    async def returned(self, gpu_index: int, timeout_seconds: float = 30.0) -> None:
        """Wait until the GPU's hung call has returned (its worker thread woke after the clock moved
        past the hang); the timeout only turns a hang into a failure, no result depends on it."""
        worker = self.fleet.slots[gpu_index].worker
        deadline = time.monotonic() + timeout_seconds
        while worker.stuck:
            if time.monotonic() > deadline:
                raise AssertionError(f"GPU {gpu_index}'s hung call did not return")
            await asyncio.sleep(0.001)

    async def tick(self, advance_seconds: float = 1.0) -> Snapshot:
        """Move scenario time, let XIDs arrive, and take one sample."""
        if advance_seconds:
            self.clock.advance(advance_seconds)
        await self.settle_xids()
        return await self.sampler.sample_once()

    def text(self) -> str:
        assert self.sampler.snapshot is not None
        return self.sampler.snapshot.body.decode()


@asynccontextmanager
async def simulated_exporter(
    scenario: str | Path,
    start_seconds: float = 0.0,
    settings: ExporterSettings = SETTINGS,
    collectors: Sequence[str] | None = None,
    extra: Sequence[Collector] = (),
) -> AsyncIterator[Harness]:
    """A sampler over every built-in collector (or `collectors`) on the scenario, not yet sampled."""
    spec = load_scenario(str(scenario))
    clock = ManualClock(start_seconds)
    sim = install(spec, clock)
    nvml = Nvml()
    watcher: XidWatcher | None = None
    fleet: GpuFleet | None = None
    try:
        nvml.init()
        nvml.discover()
        exporter_clock = ScenarioClock(clock, sim.epoch_us)
        fleet = GpuFleet(nvml, exporter_clock, settings.gpu_call_timeout_seconds)
        xids = XidCounter()
        watcher = XidWatcher(nvml.devices, xids.add, asyncio.get_running_loop(), wait_timeout_ms=50)
        watcher.start()
        ctx = BuiltinContext(fleet, xids, settings)
        names = list(BUILTINS) if collectors is None else list(collectors)
        built = [BUILTINS[n](ctx) for n in names] + list(extra)
        sampler = Sampler(built, settings, exporter_clock, gpu_status=fleet)
        yield Harness(spec, sim, clock, start_seconds, nvml, fleet, xids, watcher, sampler)
    finally:
        if watcher is not None:
            watcher.stop()
        clean = fleet.close() if fleet is not None else True
        if clean:
            nvml.shutdown()
        sim.uninstall()


_VOLATILE = [
    (re.compile(r"^(gpupulse_collector_duration_seconds\{[^}]*\}) .*$", re.M), r"\1 <duration>"),
    (re.compile(r"^(gpupulse_last_sample_timestamp_seconds) .*$", re.M), r"\1 <timestamp>"),
    (re.compile(r'python_version="[^"]*"'), 'python_version="<python>"'),
    (re.compile(r'(gpupulse_build_info\{[^}]*)version="[^"]*"'), r'\1version="<version>"'),
]


def normalise(text: str) -> str:
    """Exposition text without the values that change from run to run."""
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return text
