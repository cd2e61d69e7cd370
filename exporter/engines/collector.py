"""The `engines` collector: discover inference engines, scrape them concurrently, normalize, render.

Plug-in contract for the exporter CLI: add_arguments(parser) and from_args(args) -> Collector | None.
At about 500 lines it holds the round (discover, scrape, normalize, render) and its flags; the parts
that stand alone already live beside it (exposition, scrape, targets, kube_pods, render, detect).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.blocking import ItemReader
from exporter.collectors.flags import add_procfs_argument
from exporter.collectors.plugin import PluginContext
from exporter.engines.derived import DerivedHistogram
from exporter.engines.detect import NORMALIZERS, PREFIXES, WANTED, detect_kind
from exporter.engines.gpumap import NodeIndex, NodeIndexMemo, engine_gpus
from exporter.engines.reading import MIXED, ModelReading
from exporter.engines.render import Budget, EndpointView, Families
from exporter.engines.settings import EngineSettings
from exporter.engines.targets import AUTO, StaticSource, Target
from exporter.errors import CollectorError, ExpositionError, ScrapeError
from exporter.exposition.fetch import fetch_page
from exporter.exposition.parse import LABEL_CACHE_MAX, Exposition, ExpositionParser
from exporter.host import procfs
from exporter.host.exits import ExitWatch
from exporter.host.kept import KeptFiles
from exporter.kube import flags as kube_flags
from exporter.wire.http1 import HttpClient
from gpupulse.clock import Clock, SystemClock
from gpupulse.durations import duration_flag

log = logging.getLogger(__name__)

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


class TargetSource(Protocol):
    """Something that lists engine targets (static file, Kubernetes pods)."""

    async def targets(self) -> list[Target]: ...

    async def close(self) -> None: ...


@dataclass
class _SourceState:
    """A target source refreshed beside the rounds: a slow one never holds a round up."""

    source: TargetSource
    task: asyncio.Task[list[Target]] | None = None
    last: list[Target] | None = None  # the last list it gave
    failing: bool = False  # its last finished attempt raised


@dataclass
class Endpoint:
    """What the collector remembers about one endpoint between rounds."""

    target: Target
    kind: str | None = None
    up: bool = False
    down_reason: str | None = None
    models: str = ""
    failures: dict[str, float] = field(default_factory=dict)
    partial: dict[str, float] = field(default_factory=dict)
    duration_seconds: float | None = None
    readings: list[ModelReading] = field(default_factory=list)
    derived: dict[tuple[str, str], DerivedHistogram] = field(default_factory=dict)  # (model, phase)
    pid: int | None = None
    pid_tried_at: float | None = None
    process_start: float | None = None  # epoch seconds, from procfs or the engine's own metric
    start_source: str | None = None  # "procfs" or "engine": where process_start came from
    own_start: float | None = None  # the engine's process_start_time_seconds, last scrape
    first_success_at: float | None = None
    cold_start_seconds: float | None = None
    tree: set[int] = field(default_factory=set)
    warned_malformed: frozenset[str] = frozenset()
    label_cache: dict[str, Any] = field(default_factory=dict)  # label blocks repeat every scrape


@dataclass(frozen=True, eq=False)
class _Settled:
    """The last reads that later rounds may keep: for these endpoints (the same objects) and GPU
    processes, while no followed process exits, until a GPU process missing from /proc is due."""

    endpoints: tuple[Endpoint, ...]
    listed: frozenset[int]
    until: float


@dataclass(frozen=True)
class _Resolved:
    pid: int | None
    tried_at: float | None
    start: float | None


_PARENTS = "<parent map>"  # the ItemReader key of the /proc-wide parent scan


class EnginesCollector:
    """Scrapes every discovered engine endpoint each round; one bad endpoint only sets its own up=0."""

    name = "engines"

    def __init__(
        self,
        sources: Sequence[TargetSource],
        settings: EngineSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings or EngineSettings()
        self.interval_seconds: float | None = self.settings.interval_seconds
        # The sampler's deadline for a round, above every deadline inside it, so that a slow
        # endpoint costs only its own series and the sampler never cancels the whole round.
        self.deadline_seconds = self.settings.round_deadline_seconds
        self._sources = [_SourceState(s) for s in sources]
        self._clock = clock or SystemClock()
        self._started_at = self._clock.time()
        self._endpoints: dict[str, Endpoint] = {}
        self._http = HttpClient()
        self._dropped_total = 0.0
        self._warned_duplicates: set[str] = set()
        self._procfs: ItemReader[str, object] = ItemReader("engines-procfs")
        # /proc/<pid>/stat of the engines and GPU processes is read every round: through kept
        # descriptors (one pread each instead of open, read and close), used on the procfs worker only
        self._stat_files = KeptFiles()
        self._exits = ExitWatch(self.settings.procfs_path)  # the followed processes' exits
        self._settled: _Settled | None = None
        self._ancestors: dict[int, int] = {}  # GPU processes' ancestry, reused for the ancestors
        self._index = NodeIndexMemo()  # the node's lookups, kept while NodeState is the same
        self._unseen: dict[int, float] = {}  # GPU PIDs without a /proc entry -> when last looked for
        self._boot_seconds: float | None = None  # btime of /proc/stat, read once (set on the worker)

    async def _targets(self) -> list[Target]:
        for st in self._sources:
            if st.task is None:
                st.task = asyncio.ensure_future(st.source.targets())
        running = [st.task for st in self._sources if st.task is not None and not st.task.done()]
        if running:
            await asyncio.wait(running, timeout=self.settings.source_timeout_seconds)
        seen: dict[str, Target] = {}
        failing = 0
        for st in self._sources:
            task = st.task
            if task is not None and task.done():
                st.task = None
                try:
                    st.last, st.failing = task.result(), False
                except Exception as exc:
                    st.failing = True
                    log.warning("engine target source failed: %s", exc)
            elif task is not None and st.last is None:
                log.debug("engine target source still answering; no list from it yet")
            failing += st.failing and st.last is None
            for t in st.last or ():
                seen.setdefault(t.url, t)  # the first source (static config) wins
        if self._sources and failing == len(self._sources):
            raise CollectorError("every engine target source failed")
        return list(seen.values())

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """One round: refresh targets, resolve processes and scrape concurrently, render."""
        targets = await self._targets()
        current = {t.url for t in targets}
        for url in list(self._endpoints):
            if url not in current:
                del self._endpoints[url]  # its series disappear from this round on
        self._http.retain(current)  # and its idle connection is closed
        for t in targets:
            ep = self._endpoints.get(t.url)
            if ep is None or ep.target != t:
                self._endpoints[t.url] = Endpoint(target=t, pid=t.pid)
        endpoints = list(self._endpoints.values())
        succeeded = await asyncio.gather(
            *(self._scrape(ep) for ep in endpoints), self._resolve_processes(endpoints, state)
        )
        for ep, ok in zip(endpoints, succeeded, strict=False):
            if ep.pid is None and ep.own_start is not None:
                self._note_process_start(ep, ep.own_start, "engine")
            if ok:
                self._note_success(ep)
        budget = Budget(total=self.settings.max_series, per_endpoint=self.settings.max_series_per_endpoint)
        fams = Families(budget)
        index = self._index.index(state)
        for ep in sorted(endpoints, key=lambda e: e.target.url):
            fams.add(self._view(ep, state, index))
        self._dropped_total += budget.dropped
        for url in sorted(set(fams.duplicates) - self._warned_duplicates):
            log.warning("engine endpoint %s has the same labels as another; give it a pod or pid", url)
        self._warned_duplicates |= set(fams.duplicates)
        return fams.collect(self._dropped_total)

    async def _resolve_processes(self, endpoints: list[Endpoint], state: NodeState) -> bool:
        """PIDs behind ports, process trees and start times, on a thread; a hung /proc read costs only
        its endpoint (or, for the /proc-wide parent scan, only the process trees).

        No read at all while what the last reads said still holds: the same endpoints and GPU
        processes, and none of the processes they named has exited since (pidfds opened before those
        reads, `ExitWatch`); a thread hop is most of a round's /proc cost on a quiet node."""
        now = self._clock.time()
        listed = frozenset([p.pid for p in state.processes])
        settled = self._settled
        if (
            settled is not None
            and not self._exits.fired
            and now < settled.until
            and settled.listed == listed
            and len(settled.endpoints) == len(endpoints)
            and all(map(operator.is_, settled.endpoints, endpoints))
        ):
            return True
        self._settled = None
        by_url = {ep.target.url: ep for ep in endpoints}
        keys = [*by_url, _PARENTS] if by_url else []
        found: list[int] = []

        # A GPU process our procfs has no entry for (NVML sees another PID namespace) is not looked for
        # again while it stays listed, until pid_retry_seconds pass: each round's failed opens cost.
        self._unseen = unseen = {pid: at for pid, at in self._unseen.items() if pid in listed}
        retry = self.settings.pid_retry_seconds
        gpu_pids = sorted(pid for pid in listed if pid not in unseen or now - unseen[pid] >= retry)
        # watched before the reads: a process that exits from now on is told of, whatever its PID
        # names later (see _settle)
        self._exits.fired = False
        parents_before = [self._ancestors[pid] for pid in gpu_pids if pid in self._ancestors]
        before = self._exits.watch(
            [*(ep.pid for ep in endpoints if ep.pid is not None), *gpu_pids, *parents_before]
        )
        missing: list[int] = []  # of gpu_pids, those without a readable stat (set on the worker)
        known = dict(self._ancestors)
        # A PID search (a scan of every process's fds) counts as tried when it starts, here on the
        # loop: one that outlasts its deadline is set aside and its answer lost, and recording the
        # try only from that answer started the scan afresh every round on a busy node.
        scanning = set()
        for url, ep in by_url.items():
            if ep.pid is None and self._may_find_pid(ep.target, ep.pid_tried_at, now):
                ep.pid_tried_at = now
                scanning.add(url)

        def read(key: str) -> object:
            if key == _PARENTS:  # the last key: after the endpoints' reads, on their thread
                root = self.settings.procfs_path
                # descriptors of processes no longer followed are closed (their PIDs may be reused)
                self._stat_files.retain(procfs.stat_paths(root, [*found, *gpu_pids] if found else ()))
                # the GPU processes' ancestry, only when some endpoint has a process to look under
                if not found:
                    return {}
                parents = procfs.parents_of(root, gpu_pids, known, self._stat_files)
                missing.extend(pid for pid in gpu_pids if pid not in parents)
                return parents
            resolved = self._resolve_one(by_url[key], state, now, key in scanning)
            if resolved.pid is not None:
                found.append(resolved.pid)
            return resolved

        s = self.settings
        result = await self._procfs.read(keys, read, s.procfs_timeout_seconds, s.procfs_item_timeout_seconds)
        for key, exc in result.errors.items():
            log.debug("procfs lookup %s failed: %s", key, exc)
        parents = result.values.get(_PARENTS)
        if isinstance(parents, dict) and parents:
            self._ancestors = parents
        if isinstance(parents, dict):  # the scan returned: `missing` is whole
            for pid in missing:
                unseen[pid] = now
        for url, ep in by_url.items():
            got = result.values.get(url)
            if isinstance(got, _Resolved):
                ep.pid, ep.pid_tried_at = got.pid, got.tried_at
                self._note_process_start(ep, got.start, "procfs")
            if ep.pid is None:
                ep.tree = set()
            elif isinstance(parents, dict):
                ep.tree = procfs.descendants(ep.pid, parents)
            # else: keep the last known tree while the parent scan is late
        if isinstance(parents, dict) and not result.errors and not result.unread:  # every read returned
            self._settle(endpoints, listed, gpu_pids, parents, before)
        return True

    def _settle(
        self,
        endpoints: list[Endpoint],
        listed: frozenset[int],
        gpu_pids: list[int],
        parents: dict[int, int],
        before: frozenset[int],
    ) -> None:
        """After reads that all returned: what later rounds may keep without reading.

        What a read said of a process stays true until that process exits: an engine's start time,
        and a GPU process's parent (it changes only when that parent exits). Every process named so
        is watched; those watched only from now on (found by these reads) are read once more next
        round, with their pidfd open before the read, so that none is a later process under a reused
        PID. Rounds keep the result only while every endpoint has its process and no GPU process
        waits for a retry."""
        followed = {ep.pid for ep in endpoints if ep.pid is not None}
        for pid in gpu_pids:
            if pid in parents:
                followed.add(pid)
                if parents[pid] > 1:
                    followed.add(parents[pid])
        self._exits.watch(followed)
        self._exits.retain(followed)
        if self._exits.fired or not followed <= before or any(ep.pid is None for ep in endpoints):
            return
        retry = self.settings.pid_retry_seconds
        until = min([at + retry for at in self._unseen.values()], default=math.inf)
        self._settled = _Settled(tuple(endpoints), listed, until)

    def _resolve_one(self, ep: Endpoint, state: NodeState, now: float, scan: bool) -> _Resolved:
        """Blocking, on the procfs thread: reads ep, never writes it (the loop applies the result).
        `scan`: the loop has recorded this round's PID search (ep has no PID)."""
        root = self.settings.procfs_path
        pid, tried_at = ep.pid, ep.pid_tried_at
        # the start time read first: a stat that reads (through its kept descriptor) is a live process
        start = self._start_of(pid) if pid is not None else None
        if pid is not None and start is None and not procfs.alive(root, pid):
            pid, tried_at = ep.target.pid, None
            if pid is not None and not procfs.alive(root, pid):
                pid = None
            start = self._start_of(pid) if pid is not None else None
        if pid is None and (scan or self._may_find_pid(ep.target, tried_at, now)):
            tried_at = now
            pid = self._find_pid(ep.target, state)
            start = self._start_of(pid) if pid is not None else None
        return _Resolved(pid, tried_at, start)

    def _start_of(self, pid: int) -> float | None:
        """Blocking: the process's start time (epoch seconds), None when its stat cannot be read."""
        root = self.settings.procfs_path
        if self._boot_seconds is None:
            self._boot_seconds = procfs.boot_time_seconds(root)
        return procfs.process_start_seconds(
            root, pid, self.settings.clock_ticks_per_second, self._boot_seconds, self._stat_files
        )

    def _may_find_pid(self, t: Target, tried_at: float | None, now: float) -> bool:
        if t.port is None:
            return False
        host = urlsplit(t.url).hostname or ""
        if host not in _LOCAL_HOSTS and not t.pod:
            return False  # a remote host's processes are not in our procfs
        return tried_at is None or now - tried_at >= self.settings.pid_retry_seconds

    def _find_pid(self, t: Target, state: NodeState) -> int | None:
        assert t.port is not None
        pod_pids = [pid for pid, p in state.pid_pods.items() if p.namespace == t.namespace and p.pod == t.pod]
        if pod_pids:
            return procfs.pid_for_port(self.settings.procfs_path, t.port, pod_pids)
        if (urlsplit(t.url).hostname or "") in _LOCAL_HOSTS:
            return procfs.pid_for_port(self.settings.procfs_path, t.port)
        # A pod IP without known pod processes: the root namespace's listener on that port could be
        # anyone else's, so guessing would attribute the wrong process.
        return None

    def _note_process_start(self, ep: Endpoint, start: float | None, source: str) -> None:
        if start is None:
            return
        # The same process seen through another source (its PID found later, its own metric before)
        # is not a restart: /proc's start time is rounded to btime's whole seconds.
        same_source = ep.start_source in (None, source)
        if same_source and ep.process_start is not None and abs(start - ep.process_start) > 1.0:
            # A new process: measure its cold start afresh.
            ep.first_success_at = None
            ep.cold_start_seconds = None
        ep.process_start, ep.start_source = start, source

    async def _scrape(self, ep: Endpoint) -> bool:
        """Fetch, parse and normalize one endpoint under its own deadline; True when it succeeded."""
        t = ep.target
        s = self.settings
        began = time.perf_counter()
        if len(ep.label_cache) >= LABEL_CACHE_MAX:
            ep.label_cache.clear()  # a page whose label sets keep changing: start over
        parser = ExpositionParser(WANTED, s.max_samples_per_endpoint, PREFIXES, ep.label_cache)
        try:
            expo = await fetch_page(self._http, t.url, s.scrape_timeout_seconds, s.max_response_bytes, parser)
            kind = t.kind if t.kind != AUTO else detect_kind(expo)
            if kind is None:
                raise ScrapeError(expo.truncated or "unknown_engine", "no known engine metric prefix")
            readings = NORMALIZERS[kind](expo)
            if not readings:
                raise ScrapeError(expo.truncated or "no_metrics", f"no {kind} model series")
        except Exception as exc:  # one endpoint's failure, whatever it is, stays its own
            if isinstance(exc, ScrapeError):
                reason = exc.reason
            elif isinstance(exc, ExpositionError):
                reason = "parse"
            else:
                reason = "normalize"
                log.exception("normalizing %s failed", t.url)
            if ep.up or not ep.failures:
                log.warning("engine endpoint %s failed: %s", t.url, exc)
            ep.up, ep.down_reason = False, reason
            ep.failures[reason] = ep.failures.get(reason, 0.0) + 1.0
            ep.readings = []
            ep.own_start = None
            ep.duration_seconds = time.perf_counter() - began
            return False
        self._note_partial(ep, expo)
        ep.kind = kind
        ep.up, ep.down_reason = True, None
        if t.model and len(readings) == 1:
            readings[0].model = t.model
        for r in readings:
            self._derive_batch(ep, r)
        ep.readings = readings
        ep.models = ",".join(sorted({r.model for r in readings}))
        ep.duration_seconds = time.perf_counter() - began
        own = [smp.value for smp in expo.gauge("process_start_time_seconds")]
        ep.own_start = max(own) if own else None
        return True

    def _note_partial(self, ep: Endpoint, expo: Exposition) -> None:
        if expo.truncated is not None:
            ep.partial[expo.truncated] = ep.partial.get(expo.truncated, 0.0) + 1.0
        if expo.malformed_families:
            ep.partial["malformed"] = ep.partial.get("malformed", 0.0) + 1.0
            names = frozenset(expo.malformed_families)
            if names != ep.warned_malformed:
                log.warning(
                    "engine endpoint %s: malformed lines; dropped families %s",
                    ep.target.url,
                    ", ".join(sorted(names)),
                )
                ep.warned_malformed = names

    def _derive_batch(self, ep: Endpoint, r: ModelReading) -> None:
        """Exporter-side histograms for engines that give only a last-step gauge or busy/step counters."""
        if r.batch:
            return
        if r.batch_gauge_seconds is not None:
            hist = ep.derived.setdefault((r.model, MIXED), DerivedHistogram())
            hist.observe(r.batch_gauge_seconds)
            r.batch[MIXED] = hist.snapshot()
        for phase, (busy_seconds, steps) in sorted(r.batch_counters.items()):
            hist = ep.derived.setdefault((r.model, phase), DerivedHistogram())
            hist.observe_counters(busy_seconds, steps)
            r.batch[phase] = hist.snapshot()

    def _note_success(self, ep: Endpoint) -> None:
        now = self._clock.time()
        if ep.first_success_at is None:
            ep.first_success_at = now
        # Only processes that started while we were watching have a meaningful cold start.
        if (
            ep.cold_start_seconds is None
            and ep.process_start is not None
            and ep.process_start >= self._started_at
        ):
            ep.cold_start_seconds = max(0.0, ep.first_success_at - ep.process_start)

    def _view(self, ep: Endpoint, state: NodeState, index: NodeIndex) -> EndpointView:
        t = ep.target
        kind = ep.kind or (t.kind if t.kind != AUTO else "unknown")
        return EndpointView(
            endpoint=t.url,
            kind=kind,
            namespace=t.namespace,
            pod=t.pod,
            models=t.model or ep.models,
            gpus=engine_gpus(t, ep.tree, state, index),
            up=ep.up,
            duration_seconds=ep.duration_seconds,
            failures=dict(ep.failures),
            readings=ep.readings,
            cold_start_seconds=ep.cold_start_seconds,
            down_reason=ep.down_reason,
            partial=dict(ep.partial),
        )

    async def close(self) -> None:
        """Close the HTTP connections, the target sources and the procfs worker."""
        await self._http.close()
        for st in self._sources:
            if st.task is not None:
                st.task.cancel()
            await st.source.close()
        self._procfs.close()
        self._stat_files.close()
        self._exits.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the --engines.* flags (and the shared --path.procfs, once)."""
    add_procfs_argument(parser)
    d = EngineSettings()
    g = parser.add_argument_group("inference engines")
    g.add_argument(
        "--engines.config",
        dest="engines_config",
        type=Path,
        default=None,
        help="YAML file listing engine endpoints (url, engine, model, namespace, pod, pid)",
    )
    g.add_argument(
        "--engines.discover-pods",
        dest="engines_discover_pods",
        action="store_true",
        help="scrape pods of this node annotated gpupulse.io/engine (needs --kube.node-name or $NODE_NAME)",
    )
    kube_flags.add_aliases(parser, "engines")  # --engines.node-name, --engines.kube-api-url: now --kube.*
    g.add_argument(
        "--engines.interval",
        dest="engines_interval",
        type=duration_flag,
        default=d.interval_seconds,
        help="seconds between engine scrape rounds",
    )
    g.add_argument(
        "--engines.scrape-timeout",
        dest="engines_scrape_timeout",
        type=duration_flag,
        default=d.scrape_timeout_seconds,
        help="per-endpoint scrape timeout in seconds",
    )
    g.add_argument(
        "--engines.max-response-bytes",
        dest="engines_max_response_bytes",
        type=int,
        default=d.max_response_bytes,
        help="stop reading an endpoint's page past this many bytes; complete families before the cut "
        'are kept (counted as inference_engine_scrape_partial_total{reason="too_large"})',
    )
    g.add_argument(
        "--engines.max-samples-per-endpoint",
        dest="engines_max_samples_per_endpoint",
        type=int,
        default=d.max_samples_per_endpoint,
        help="stop parsing a page past this many samples of mapped families "
        '(inference_engine_scrape_partial_total{reason="too_many_samples"})',
    )
    g.add_argument(
        "--engines.max-series",
        dest="engines_max_series",
        type=int,
        default=d.max_series,
        help="cap on engine series across all endpoints",
    )
    g.add_argument(
        "--engines.max-series-per-endpoint",
        dest="engines_max_series_per_endpoint",
        type=int,
        default=d.max_series_per_endpoint,
        help="cap on series of one endpoint",
    )
    g.add_argument(
        "--engines.procfs",
        dest="engines_procfs",
        type=Path,
        default=None,
        help="procfs root for engine PIDs (default: --path.procfs if defined, else /proc)",
    )


def from_args(args: argparse.Namespace, ctx: PluginContext) -> EnginesCollector | None:
    """The collector the flags describe, or None when no engine source is configured; discovered pods
    are a view of the node's shared pod store."""
    procfs_root = args.engines_procfs or Path(getattr(args, "path_procfs", None) or "/proc")
    settings = EngineSettings(
        interval_seconds=args.engines_interval,
        scrape_timeout_seconds=args.engines_scrape_timeout,
        max_response_bytes=args.engines_max_response_bytes,
        max_series=args.engines_max_series,
        max_series_per_endpoint=args.engines_max_series_per_endpoint,
        max_samples_per_endpoint=args.engines_max_samples_per_endpoint,
        procfs_path=procfs_root,
    )
    clock = SystemClock()
    sources: list[TargetSource] = []
    if args.engines_config is not None:
        sources.append(StaticSource(args.engines_config))
    if args.engines_discover_pods:
        store = None if kube_flags.turned_off(args, "--engines.node-name") else ctx.kube.pods()
        if store is None:
            raise SystemExit("--engines.discover-pods needs --kube.node-name or $NODE_NAME")
        # imported here: a static --engines.config never needs the pod view
        from exporter.engines.kube_pods import KubePodSource

        sources.append(KubePodSource(store))
    if not sources:
        return None
    return EnginesCollector(sources, settings, clock)
