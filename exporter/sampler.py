"""The sampling loop: runs the collectors each tick and publishes one immutable Snapshot.

Scrapes only ever read `Sampler.snapshot`; nothing on the serving path calls a collector.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from prometheus_client.core import Metric

from exporter.collectors.base import Collector, GpuRef, NodeState
from exporter.collectors.gpus import Answers, FleetCollector, Read
from exporter.collectors.self import CollectorRound, self_families
from exporter.config import ExporterSettings
from exporter.errors import CollectorError
from exporter.kube.requests import RequestCounts
from exporter.snapshot import Snapshot
from gpupulse.clock import Clock

log = logging.getLogger(__name__)

SnapshotHook = Callable[[Snapshot], Awaitable[None]]
_Round = tuple[list[Metric], CollectorRound]


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
        kube_requests: RequestCounts | None = None,
    ) -> None:
        self.collectors = list(collectors)
        self.kube_requests = kube_requests  # rendered as gpupulse_kube_requests_total; None: not at all
        self.settings, self.clock, self.gpu_status = settings, clock, gpu_status
        self.state = state if state is not None else NodeState()
        self.hooks = list(hooks)
        self.snapshot: Snapshot | None = None
        self.last_good_unix: float | None = None
        self.last_good_monotonic: float | None = None
        self.ticks = 0
        self._cached: dict[str, tuple[float, list[Metric], CollectorRound]] = {}
        # name -> (when its next round is due, the running round)
        self._slow: dict[str, tuple[float, asyncio.Task[_Round]]] = {}
        self._hook_tasks: set[asyncio.Task[None]] = set()
        self._merger = FamilyMerger()

    def _timeout(self, collector: Collector) -> float:
        # A collector with deadlines inside its round declares one above them (the engines collector:
        # per-endpoint scrape timeouts); the sampler's own deadline must not cut under it.
        own = getattr(collector, "deadline_seconds", None)
        return float(own) if own else self.settings.collector_timeout_seconds

    async def _run_collector(self, collector: Collector) -> tuple[list[Metric], CollectorRound]:
        start = time.perf_counter()
        timeout = self._timeout(collector)
        try:
            # asyncio.timeout, unlike wait_for, does not wrap the round in one more task
            async with asyncio.timeout(timeout):
                families = list(await collector.collect(self.state))
            ok = True
        except CollectorError as exc:
            log.warning("collector %s failed: %s", collector.name, exc)
            families, ok = list(exc.families), False
        except TimeoutError:
            log.warning("collector %s took longer than %.1f s", collector.name, timeout)
            families, ok = [], False
        except Exception:
            log.exception("collector %s crashed", collector.name)
            families, ok = [], False
        return families, CollectorRound(ok, time.perf_counter() - start)

    async def _run_fleet(self, collectors: Sequence[FleetCollector]) -> list[_Round]:
        """The NVML collectors as one round: each plans its reads, every read of the tick goes to the
        GPUs in one batch per GPU, then each publishes from its answers. A collector that fails to plan
        or publish fails alone; its duration is the round's wall time plus its own planning and
        publishing. The fleet's own deadline ends the round (GpuFleet._start)."""
        start = time.perf_counter()
        plans: list[Sequence[Read] | None] = []
        own: list[float] = []
        for collector in collectors:
            t0 = time.perf_counter()
            try:
                plans.append(collector.plan(self.state))
            except Exception:
                log.exception("collector %s crashed", collector.name)
                plans.append(None)
            own.append(time.perf_counter() - t0)
        reads = [read for plan in plans if plan for read in plan]
        answers: list[Answers] = await collectors[0].fleet.answer(reads) if reads else []
        waited = time.perf_counter() - start - sum(own)
        out: list[_Round] = []
        at = 0
        for collector, plan, planned in zip(collectors, plans, own, strict=True):
            t0 = time.perf_counter()
            if plan is None:
                out.append(([], CollectorRound(False, waited + planned)))
                continue
            mine, at = answers[at : at + len(plan)], at + len(plan)
            try:
                families, ok = list(collector.publish(mine, self.state)), True
            except CollectorError as exc:
                log.warning("collector %s failed: %s", collector.name, exc)
                families, ok = list(exc.families), False
            except Exception:
                log.exception("collector %s crashed", collector.name)
                families, ok = [], False
            out.append((families, CollectorRound(ok, waited + planned + time.perf_counter() - t0)))
        return out

    def _slow_round(self, collector: Collector, now: float) -> asyncio.Task[_Round] | None:
        """The running round of a collector on its own interval, started when due; None when not due.

        The tick waits for it at most `slow_collector_wait_seconds`: a round that outlasts that goes
        on beside the ticks, and its last families are served until it ends.
        """
        running = self._slow.get(collector.name)
        if running is not None:
            return running[1]
        cached = self._cached.get(collector.name)
        if cached is not None and now < cached[0]:
            return None
        task = asyncio.ensure_future(self._run_collector(collector))
        self._slow[collector.name] = (now + (collector.interval_seconds or 0.0), task)
        return task

    def _harvest(self, collector: Collector) -> tuple[list[Metric], CollectorRound] | None:
        running = self._slow.get(collector.name)
        if running is not None and running[1].done():
            del self._slow[collector.name]
            families, round_ = running[1].result()
            self._cached[collector.name] = (running[0], families, round_)
        cached = self._cached.get(collector.name)
        return None if cached is None else (cached[1], cached[2])

    async def sample_once(self, precompress: bool = False) -> Snapshot:
        """Run one tick and publish its snapshot. With `precompress`, the text and its gzip are made
        on a thread before publishing (zlib runs without the GIL) while the previous snapshot keeps
        being served; without, the snapshot is rendered when first asked for."""
        now = self.clock.monotonic()
        slow = [c for c in self.collectors if c.interval_seconds is not None]
        fast = [c for c in self.collectors if c.interval_seconds is None]
        # The GPU round first, then the plug-in rounds due: run side by side, the plug-ins' Python
        # competed for the GIL with the 16 GPU workers' hand-overs (measured: a round tick cost about
        # twice the sum of its parts); one after the other, each runs without that contention.
        fast_results = await self._run_fast(fast)
        slow_rounds = [t for c in slow if (t := self._slow_round(c, now)) is not None]
        pending = [t for t in slow_rounds if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.slow_collector_wait_seconds)
        by_name: dict[str, tuple[list[Metric], CollectorRound]] = {
            c.name: r for c, r in zip(fast, fast_results, strict=True)
        }
        for c in slow:
            got = self._harvest(c)
            if got is not None:  # None until its first round ends
                by_name[c.name] = got
        results = [by_name[c.name] for c in self.collectors if c.name in by_name]
        rounds = {name: r for name, (_, r) in by_name.items()}
        good = self._is_good(rounds)
        taken_unix, taken_mono = self.clock.time(), self.clock.monotonic()
        if good:
            self.last_good_unix, self.last_good_monotonic = taken_unix, taken_mono
        families = self._merger.merge([f for fams, _ in results for f in fams])
        stale = self.gpu_status.stale_gpus() if self.gpu_status is not None else ()
        families += self_families(rounds, self.last_good_unix, stale, self.kube_requests)
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

    async def _run_fast(self, fast: Sequence[Collector]) -> list[_Round]:
        """The collectors of every tick, in their order: the NVML ones as one round (see _run_fleet),
        any other beside it."""
        nvml = [c for c in fast if isinstance(c, FleetCollector)]
        group = [c for c in nvml if c.fleet is nvml[0].fleet]
        grouped = set(map(id, group))
        others = [c for c in fast if id(c) not in grouped]  # another fleet's run alone (tests)
        if not others:
            return await self._run_fleet(group) if group else []
        beside = asyncio.gather(*(self._run_collector(c) for c in others))
        rounds = dict(zip(map(id, group), await self._run_fleet(group) if group else [], strict=True))
        rounds.update(zip(map(id, others), await beside, strict=True))
        return [rounds[id(c)] for c in fast]

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
                # render ahead only while someone scrapes: an unscraped snapshot is never rendered
                prev = self.snapshot
                await self.sample_once(precompress=prev is not None and prev.requested)
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
        for _, round_task in list(self._slow.values()):
            round_task.cancel()
        for collector in self.collectors:
            try:
                await collector.close()
            except Exception:
                log.exception("closing collector %s", collector.name)


class FamilyMerger:
    """One family per name, in first-seen order, with the joined families kept between ticks.

    Collectors may share a family (gpupulse_series_dropped_total is written by attribution and by
    engines); two HELP/TYPE blocks of one name are invalid exposition, so their samples are joined.
    The sharing collectors run on intervals and serve the same family objects until their next
    round, so a joined family is kept while its parts are the same objects: a tick between rounds
    joins nothing anew, and the kept family's text is rendered once (snapshot._RENDERED).
    """

    def __init__(self) -> None:
        # name -> (the parts it was joined from, the joined family); names shared in the last merge only
        self._joined: dict[str, tuple[list[Metric], Metric]] = {}

    def merge(self, families: list[Metric]) -> list[Metric]:
        """The families with each shared name joined into one, at its first place."""
        if len({f.name for f in families}) == len(families):  # the usual tick: nothing shared
            self._joined.clear()
            return families
        first: dict[str, Metric] = {}
        shared: dict[str, list[Metric]] = {}
        for f in families:
            seen = first.setdefault(f.name, f)
            if seen is not f:
                shared.setdefault(f.name, [seen]).append(f)
        joined: dict[str, tuple[list[Metric], Metric]] = {}
        for name, parts in shared.items():
            kept = self._joined.get(name)
            if kept is None or len(kept[0]) != len(parts) or not all(map(operator.is_, kept[0], parts)):
                kept = (parts, _join(parts))
            joined[name] = kept
        self._joined = joined
        out: list[Metric] = []
        for f in families:
            if f.name not in joined:
                out.append(f)
            elif first.get(f.name) is f:  # the joined family takes the place of the name's first
                out.append(joined[f.name][1])
        return out


def _join(group: list[Metric]) -> Metric:
    first = group[0]
    joined = Metric(first.name, first.documentation, first.type, first.unit)
    for family in group:
        if family.type != first.type:
            log.error(
                "families named %s disagree on type (%s, %s); dropping the latter",
                first.name,
                first.type,
                family.type,
            )
            continue
        joined.samples.extend(family.samples)
    return joined
