"""The sampling loop: runs the collectors each tick and publishes one immutable Snapshot.

Scrapes only ever read `Sampler.snapshot`; nothing on the serving path calls a collector.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from prometheus_client.core import Metric

from exporter.collectors.base import Collector, CollectorError, GpuRef, NodeState
from exporter.collectors.self import CollectorRound, self_families
from exporter.config import Clock, ExporterSettings
from exporter.snapshot import Snapshot

log = logging.getLogger(__name__)

SnapshotHook = Callable[[Snapshot], Awaitable[None]]


class GpuStatus(Protocol):
    """What the sampler needs from the GPU fleet: freshness of the last device round, stale GPUs."""

    answered: bool
    fatal: str | None  # set when the exporter cannot recover and should exit

    def stale_gpus(self) -> Sequence[tuple[str, str, bool]]: ...

    def gpu_states(self) -> Sequence[tuple[GpuRef, str]]: ...


class Sampler:
    """Runs every collector once per tick (concurrently) and publishes the result."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        settings: ExporterSettings,
        clock: Clock,
        gpu_status: GpuStatus | None = None,
        state: NodeState | None = None,
        hooks: Sequence[SnapshotHook] = (),
    ) -> None:
        self.collectors = list(collectors)
        self.settings, self.clock, self.gpu_status = settings, clock, gpu_status
        self.state = state if state is not None else NodeState()
        self.hooks = list(hooks)
        self.snapshot: Snapshot | None = None
        self.last_good_unix: float | None = None
        self.last_good_monotonic: float | None = None
        self.ticks = 0
        self._cached: dict[str, tuple[float, list[Metric], CollectorRound]] = {}
        self._hook_tasks: set[asyncio.Task[None]] = set()

    async def _run_collector(self, collector: Collector) -> tuple[list[Metric], CollectorRound]:
        start = time.perf_counter()
        try:
            # asyncio.timeout, unlike wait_for, does not wrap the round in one more task
            async with asyncio.timeout(self.settings.collector_timeout_seconds):
                families = list(await collector.collect(self.state))
            ok = True
        except CollectorError as exc:
            log.warning("collector %s failed: %s", collector.name, exc)
            families, ok = list(exc.families), False
        except TimeoutError:
            log.warning(
                "collector %s took longer than %.1f s",
                collector.name,
                self.settings.collector_timeout_seconds,
            )
            families, ok = [], False
        except Exception:
            log.exception("collector %s crashed", collector.name)
            families, ok = [], False
        return families, CollectorRound(ok, time.perf_counter() - start)

    async def _collect(self, collector: Collector, now: float) -> tuple[list[Metric], CollectorRound]:
        # A collector with its own slower interval keeps serving its last families between rounds.
        cached = self._cached.get(collector.name)
        if collector.interval_seconds is not None and cached is not None and now < cached[0]:
            return cached[1], cached[2]
        families, round_ = await self._run_collector(collector)
        due = now + (collector.interval_seconds or 0.0)
        self._cached[collector.name] = (due, families, round_)
        return families, round_

    async def sample_once(self, precompress: bool = False) -> Snapshot:
        """Run one tick and publish its snapshot. With `precompress`, the gzip body is made on a
        thread before publishing (zlib runs without the GIL), so no scrape compresses on the loop
        while the previous snapshot keeps being served."""
        now = self.clock.monotonic()
        results = await asyncio.gather(*(self._collect(col, now) for col in self.collectors))
        rounds = {col.name: r for col, (_, r) in zip(self.collectors, results, strict=True)}
        good = self._is_good(rounds)
        taken_unix, taken_mono = self.clock.time(), self.clock.monotonic()
        if good:
            self.last_good_unix, self.last_good_monotonic = taken_unix, taken_mono
        families = merge_families([f for fams, _ in results for f in fams])
        stale = self.gpu_status.stale_gpus() if self.gpu_status is not None else ()
        families += self_families(rounds, self.last_good_unix, stale)
        snap = Snapshot.build(
            families,
            taken_at_unix=taken_unix,
            taken_at_monotonic=taken_mono,
            good=good,
            gpus=self._gpu_states(),
            rounds=rounds,
        )
        if precompress:
            await asyncio.to_thread(snap.gzipped)
        self.snapshot = snap
        self.ticks += 1
        self._fire_hooks(snap)
        return snap

    def _gpu_states(self) -> list[tuple[GpuRef, str]]:
        if self.gpu_status is not None:
            return list(self.gpu_status.gpu_states())
        return [(g, "up") for g in self.state.gpus if not g.mig_uuid]

    def _is_good(self, rounds: dict[str, CollectorRound]) -> bool:
        if not rounds:
            return True
        if "device" in rounds:
            answered = self.gpu_status.answered if self.gpu_status is not None else True
            return rounds["device"].success and answered
        return any(r.success for r in rounds.values())

    def _fire_hooks(self, snap: Snapshot) -> None:
        # Pushes run beside sampling; a slow receiver skips snapshots instead of queueing them.
        if self._hook_tasks:
            return
        for hook in self.hooks:
            task = asyncio.get_running_loop().create_task(self._guard(hook, snap))
            self._hook_tasks.add(task)
            task.add_done_callback(self._hook_tasks.discard)

    @staticmethod
    async def _guard(hook: SnapshotHook, snap: Snapshot) -> None:
        try:
            await hook(snap)
        except Exception:
            log.exception("snapshot hook failed")

    def ready(self) -> bool:
        """A good sample exists and is younger than ready_max_age_intervals intervals."""
        if self.last_good_monotonic is None:
            return False
        max_age = self.settings.ready_max_age_intervals * self.settings.sampling_interval_seconds
        return self.clock.monotonic() - self.last_good_monotonic <= max_age

    @property
    def fatal(self) -> str | None:
        """Why sampling stopped for good, if it did."""
        return self.gpu_status.fatal if self.gpu_status is not None else None

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every sampling interval until `stop` is set or a fatal condition; late ticks are skipped."""
        interval = self.settings.sampling_interval_seconds
        next_tick = time.monotonic()
        while not stop.is_set():
            try:
                await self.sample_once(precompress=True)
            except Exception:
                log.exception("sampling tick failed")
            if self.fatal is not None:
                log.error("stopping: %s", self.fatal)
                return
            next_tick += interval
            delay = next_tick - time.monotonic()
            if delay < 0:
                next_tick, delay = time.monotonic(), 0.0
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass

    async def close(self) -> None:
        """Close every collector and wait for running hooks."""
        for task in list(self._hook_tasks):
            task.cancel()
        for collector in self.collectors:
            try:
                await collector.close()
            except Exception:
                log.exception("closing collector %s", collector.name)


def merge_families(families: list[Metric]) -> list[Metric]:
    """One family per name, in first-seen order.

    Collectors may share a family (gpupulse_series_dropped_total is written by attribution and by
    engines); two HELP/TYPE blocks of one name are invalid exposition, so their samples are joined.
    """
    groups: dict[str, list[Metric]] = {}
    for family in families:
        groups.setdefault(family.name, []).append(family)
    out: list[Metric] = []
    for name, group in groups.items():
        first = group[0]
        if len(group) == 1:
            out.append(first)
            continue
        joined = Metric(first.name, first.documentation, first.type, first.unit)
        for family in group:
            if family.type != first.type:
                log.error(
                    "families named %s disagree on type (%s, %s); dropping the latter",
                    name,
                    first.type,
                    family.type,
                )
                continue
            joined.samples.extend(family.samples)
        out.append(joined)
    return out
