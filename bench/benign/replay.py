"""A benign fleet played through the exporter's own code in virtual time: what Prometheus would have
scraped from every node at every scrape time.

Each node's scenario runs under the simulated NVML (exporter/sim, installed under pynvml's C
symbols) on a ManualClock; the exporter's NVML collectors and sampler run unchanged, one sampling
round per scrape (a real exporter samples every second and a scrape reads the latest round; at one
round per scrape the scraped values are the same readings). An exporter restart is a new sampler,
GPU fleet and NVML session over the same scenario: NVML's own counters (energy, ECC) carry on, the
exporter's restart from zero, and its series are absent while it is down.

Pods are served by a stand-in for the attribution collector: it publishes the node's allocations and
PID -> pod map from the fleet's pod timeline into NodeState, as the collector does from the kubelet's
pod-resources and /proc, and renders gpu_allocation_info and gpu_training_rank_info through the
exporter's own metric specs and families. The kubelet client, /proc reads, engines, page cache and
progress collectors are not in the loop (docs/alerts.md, "Benign fleets").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from bench.benign.timeline import TRAINING_KIND, NodePlan
from exporter.attribution.ranks import RankRow, rank_info_family
from exporter.collectors.base import Collector, NodeState, PodRef
from exporter.collectors.gpus import GpuFleet
from exporter.collectors.series import family
from exporter.collectors.xid import XidCounter
from exporter.config import ExporterSettings
from exporter.nvml import Nvml
from exporter.registry import BUILTINS, BuiltinContext
from exporter.sampler import Sampler
from exporter.sim import ManualClock, install
from exporter.sim.scenario import parse_scenario
from gpupulse.metrics import attribution as specs

JOB = "gpupulse-exporter"
PORT = 9400
# the GPU calls' deadline: generous, the two shared cores of the bench machine are slow
SETTINGS = ExporterSettings(sampling_interval_seconds=1.0, gpu_call_timeout_seconds=5.0)


class PodTimeline:
    """The attribution collector's NodeState outputs and allocation series, from the pod timeline."""

    name = "attribution"
    interval_seconds: float | None = None  # every round

    def __init__(self, plan: NodePlan, clock: ManualClock) -> None:
        self.plan, self.clock = plan, clock

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        uuids = {int(g.index): g.uuid for g in state.gpus if not g.mig_uuid}
        tenants = self.plan.tenants_at(self.clock.monotonic())
        refs = {x.pid: PodRef(x.namespace, x.pod, x.container) for x in tenants}
        state.allocations = {uuids[x.gpu]: (refs[x.pid],) for x in tenants if x.gpu in uuids}
        state.pid_pods = refs
        info = family(specs.GPU_ALLOCATION_INFO)
        rows = []
        for x in tenants:
            if x.gpu not in uuids:
                continue
            uuid = uuids[x.gpu]
            info.add_metric([uuid, str(x.gpu), "", x.namespace, x.pod, x.container, "nvidia.com/gpu"], 1.0)
            if x.training_job:
                rows.append(
                    RankRow(
                        uuid,
                        str(x.gpu),
                        x.namespace,
                        x.pod,
                        TRAINING_KIND,
                        x.training_job,
                        str(x.rank),
                        str(x.gpu),
                        str(x.world_size),
                    )
                )
        return [f for f in (info, rank_info_family(rows)) if len(f)]

    async def close(self) -> None:
        return None


@dataclass
class Scrapes:
    """One node's scrapes: per series (sample name with labels) its value at each scrape index, None
    where absent; `up` per scrape index."""

    node: str
    times: list[float]
    up: list[int] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)

    def add(self, index: int, samples: dict[str, float]) -> None:
        for key, value in samples.items():
            column = self.series.get(key)
            if column is None:
                column = self.series[key] = [None] * len(self.times)
            column[index] = value


def parse_exposition(text: str, wanted: frozenset[str] | None) -> dict[str, float]:
    """Sample lines of Prometheus text exposition as {name{labels}: value}, kept when the sample's
    name is in `wanted` (None: all). Comments, timestamps-free lines only (the exporter sets none)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        key, _, value = line.rpartition(" ")
        brace = key.find("{")
        name = key if brace < 0 else key[:brace]
        if wanted is not None and name not in wanted:
            continue
        out[key] = float(value)
    return out


def _scrape_times(plan: NodePlan, end_seconds: float, interval: float) -> Iterator[float]:
    t = 0.0
    while t <= end_seconds:
        yield t
        t += interval


async def play_node(
    plan: NodePlan, end_seconds: float, interval: float, wanted: frozenset[str] | None
) -> Scrapes:
    """Every scrape of one node from 0 to `end_seconds`, one exporter run after another."""
    times = list(_scrape_times(plan, end_seconds, interval))
    out = Scrapes(plan.name, times, up=[0] * len(times))
    scenario = parse_scenario(plan.scenario, source=plan.name)
    for start, stop in plan.runs:
        due = [i for i, t in enumerate(times) if start <= t < stop]
        if not due:
            continue
        # a fresh exporter: the scenario clock at its start, wall time = scenario seconds (promtool's 0)
        clock = ManualClock(times[due[0]], start_unix=times[due[0]])
        sim = install(scenario, clock)
        sim.state.epoch_us = 0  # process-utilization timestamps on the same wall clock
        nvml = Nvml()
        fleet: GpuFleet | None = None
        try:
            nvml.init()
            nvml.discover()
            fleet = GpuFleet(nvml, clock, SETTINGS.gpu_call_timeout_seconds)
            ctx = BuiltinContext(fleet, XidCounter(), SETTINGS)
            collectors: list[Collector] = [make(ctx) for make in BUILTINS.values()]
            collectors.append(PodTimeline(plan, clock))
            sampler = Sampler(collectors, SETTINGS, clock, gpu_status=fleet)
            for i in due:
                clock.set(times[i])
                snapshot = await sampler.sample_once()
                if plan.scrape_fails(times[i]):
                    continue
                out.up[i] = 1
                out.add(i, parse_exposition(snapshot.body.decode(), wanted))
        finally:
            clean = fleet.close() if fleet is not None else True
            if clean:
                nvml.shutdown()
            sim.uninstall()
    return out


def play(
    plans: Sequence[NodePlan], end_seconds: float, interval: float, wanted: frozenset[str] | None
) -> list[Scrapes]:
    """Every node, one after another (one simulated NVML can be installed at a time)."""
    return [asyncio.run(play_node(p, end_seconds, interval, wanted)) for p in plans]
