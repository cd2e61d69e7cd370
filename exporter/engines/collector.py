"""The `engines` collector: discover inference engines, scrape them concurrently, normalize, render.

Plug-in contract for the exporter CLI: add_arguments(parser) and from_args(args) -> Collector | None.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.core import Metric

from exporter.collectors.base import CollectorError, NodeState
from exporter.config import duration_seconds as parse_duration
from exporter.engines import procfs
from exporter.engines.derived import DerivedHistogram
from exporter.engines.detect import NORMALIZERS, detect_kind
from exporter.engines.exposition import ExpositionError, parse_exposition
from exporter.engines.gpumap import engine_gpus
from exporter.engines.kube_pods import KubePodSource
from exporter.engines.reading import ModelReading
from exporter.engines.render import Budget, EndpointView, Families
from exporter.engines.scrape import ScrapeError, fetch
from exporter.engines.settings import Clock, EngineSettings, KubeSettings, SystemClock
from exporter.engines.targets import AUTO, StaticSource, Target

log = logging.getLogger(__name__)

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
_PROCFS_TIMEOUT_SECONDS = 2.0


class TargetSource(Protocol):
    """Something that lists engine targets (static file, Kubernetes pods)."""

    async def targets(self) -> list[Target]: ...

    async def close(self) -> None: ...


@dataclass
class Endpoint:
    """What the collector remembers about one endpoint between rounds."""

    target: Target
    kind: str | None = None
    up: bool = False
    models: str = ""
    failures: dict[str, float] = field(default_factory=dict)
    duration_seconds: float | None = None
    readings: list[ModelReading] = field(default_factory=list)
    derived: dict[str, DerivedHistogram] = field(default_factory=dict)
    pid: int | None = None
    pid_tried_at: float | None = None
    process_start: float | None = None  # epoch seconds, from procfs or the engine's own metric
    first_success_at: float | None = None
    cold_start_seconds: float | None = None
    tree: set[int] = field(default_factory=set)


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
        self._sources = list(sources)
        self._clock = clock or SystemClock()
        self._started_at = self._clock.time()
        self._endpoints: dict[str, Endpoint] = {}
        self._session: aiohttp.ClientSession | None = None
        self._dropped_total = 0.0
        self._warned_duplicates: set[str] = set()

    async def _targets(self) -> list[Target]:
        seen: dict[str, Target] = {}
        failures = 0
        for source in self._sources:
            try:
                for t in await source.targets():
                    seen.setdefault(t.url, t)  # the first source (static config) wins
            except Exception as exc:
                failures += 1
                log.warning("engine target source failed: %s", exc)
        if self._sources and failures == len(self._sources):
            raise CollectorError("every engine target source failed")
        return list(seen.values())

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """One round: refresh targets, resolve processes, scrape concurrently, render."""
        targets = await self._targets()
        current = {t.url for t in targets}
        for url in list(self._endpoints):
            if url not in current:
                del self._endpoints[url]  # its series disappear from this round on
        for t in targets:
            ep = self._endpoints.get(t.url)
            if ep is None or ep.target != t:
                self._endpoints[t.url] = Endpoint(target=t, pid=t.pid)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        endpoints = list(self._endpoints.values())
        await self._resolve_processes(endpoints, state)
        await asyncio.gather(*(self._scrape(ep) for ep in endpoints))
        budget = Budget(total=self.settings.max_series, per_endpoint=self.settings.max_series_per_endpoint)
        fams = Families(budget)
        for ep in sorted(endpoints, key=lambda e: e.target.url):
            fams.add(self._view(ep, state))
        self._dropped_total += budget.dropped
        for url in sorted(set(fams.duplicates) - self._warned_duplicates):
            log.warning("engine endpoint %s has the same labels as another; give it a pod or pid", url)
        self._warned_duplicates |= set(fams.duplicates)
        return fams.collect(self._dropped_total)

    async def _resolve_processes(self, endpoints: list[Endpoint], state: NodeState) -> None:
        """PIDs behind ports, process trees and start times, off the event loop."""
        try:
            await asyncio.wait_for(
                asyncio.to_thread(self._resolve_blocking, endpoints, state), _PROCFS_TIMEOUT_SECONDS
            )
        except TimeoutError:
            log.warning(
                "procfs lookups for engines took over %ss; skipped this round", _PROCFS_TIMEOUT_SECONDS
            )

    def _resolve_blocking(self, endpoints: list[Endpoint], state: NodeState) -> None:
        root = self.settings.procfs_path
        now = self._clock.time()
        for ep in endpoints:
            if ep.pid is not None and not procfs.alive(root, ep.pid):
                ep.pid, ep.pid_tried_at = ep.target.pid, None
                if ep.pid is not None and not procfs.alive(root, ep.pid):
                    ep.pid = None
            if ep.pid is None and self._may_find_pid(ep, now):
                ep.pid_tried_at = now
                ep.pid = self._find_pid(ep.target, state)
        parents = procfs.parent_map(root) if any(ep.pid is not None for ep in endpoints) else {}
        for ep in endpoints:
            if ep.pid is None:
                ep.tree = set()
                continue
            ep.tree = procfs.descendants(ep.pid, parents)
            start = procfs.process_start_seconds(root, ep.pid, self.settings.clock_ticks_per_second)
            self._note_process_start(ep, start)

    def _may_find_pid(self, ep: Endpoint, now: float) -> bool:
        t = ep.target
        if t.port is None:
            return False
        host = urlsplit(t.url).hostname or ""
        if host not in _LOCAL_HOSTS and not t.pod:
            return False  # a remote host's processes are not in our procfs
        return ep.pid_tried_at is None or now - ep.pid_tried_at >= self.settings.pid_retry_seconds

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

    def _note_process_start(self, ep: Endpoint, start: float | None) -> None:
        if start is None:
            return
        if ep.process_start is not None and abs(start - ep.process_start) > 1.0:
            # A new process: measure its cold start afresh.
            ep.first_success_at = None
            ep.cold_start_seconds = None
        ep.process_start = start

    async def _scrape(self, ep: Endpoint) -> None:
        t = ep.target
        began = time.perf_counter()
        try:
            assert self._session is not None
            text = await fetch(
                self._session, t.url, self.settings.scrape_timeout_seconds, self.settings.max_response_bytes
            )
            expo = await asyncio.to_thread(parse_exposition, text)
            kind = t.kind if t.kind != AUTO else detect_kind(expo)
            if kind is None:
                raise ScrapeError("unknown_engine", "no known engine metric prefix")
            readings = NORMALIZERS[kind](expo)
            if not readings:
                raise ScrapeError("no_metrics", f"no {kind} model series")
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
            ep.up = False
            ep.failures[reason] = ep.failures.get(reason, 0.0) + 1.0
            ep.readings = []
            ep.duration_seconds = time.perf_counter() - began
            return
        ep.kind = kind
        ep.up = True
        if t.model and len(readings) == 1:
            readings[0].model = t.model
        for r in readings:
            self._derive_batch(ep, r)
        ep.readings = readings
        ep.models = ",".join(sorted({r.model for r in readings}))
        ep.duration_seconds = time.perf_counter() - began
        if ep.pid is None:
            own = [s.value for s in expo.gauge("process_start_time_seconds")]
            self._note_process_start(ep, max(own) if own else None)
        self._note_success(ep)

    def _derive_batch(self, ep: Endpoint, r: ModelReading) -> None:
        if r.batch is not None or (r.batch_gauge_seconds is None and r.batch_counters is None):
            return
        hist = ep.derived.setdefault(r.model, DerivedHistogram())
        if r.batch_gauge_seconds is not None:
            hist.observe(r.batch_gauge_seconds)
        elif r.batch_counters is not None:
            hist.observe_counters(*r.batch_counters)
        r.batch = hist.snapshot()

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

    def _view(self, ep: Endpoint, state: NodeState) -> EndpointView:
        t = ep.target
        kind = ep.kind or (t.kind if t.kind != AUTO else "unknown")
        return EndpointView(
            endpoint=t.url,
            kind=kind,
            namespace=t.namespace,
            pod=t.pod,
            models=t.model or ep.models,
            gpus=engine_gpus(t, ep.tree, state),
            up=ep.up,
            duration_seconds=ep.duration_seconds,
            failures=dict(ep.failures),
            readings=ep.readings,
            cold_start_seconds=ep.cold_start_seconds,
        )

    async def close(self) -> None:
        """Close the HTTP session and the target sources."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        for source in self._sources:
            await source.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the --engines.* flags (and the shared --path.procfs, once)."""
    try:
        from exporter.attribution.flags import add_procfs_argument
    except ImportError:  # pragma: no cover - attribution ships in the same package
        pass
    else:
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
        help="scrape pods of this node annotated gpupulse.io/engine (needs NODE_NAME)",
    )
    g.add_argument(
        "--engines.node-name",
        dest="engines_node_name",
        default=os.environ.get("NODE_NAME", ""),
        help="node whose pods are discovered (default: $NODE_NAME)",
    )
    g.add_argument(
        "--engines.kube-api-url",
        dest="engines_kube_api_url",
        default=_default_api_url(),
        help="Kubernetes API base URL (default: in-cluster service)",
    )
    g.add_argument(
        "--engines.interval",
        dest="engines_interval",
        type=parse_duration,
        default=d.interval_seconds,
        help="seconds between engine scrape rounds",
    )
    g.add_argument(
        "--engines.scrape-timeout",
        dest="engines_scrape_timeout",
        type=parse_duration,
        default=d.scrape_timeout_seconds,
        help="per-endpoint scrape timeout in seconds",
    )
    g.add_argument(
        "--engines.max-response-bytes",
        dest="engines_max_response_bytes",
        type=int,
        default=d.max_response_bytes,
        help="abort reading an endpoint's body past this size",
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


def _default_api_url() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return "https://kubernetes.default.svc"
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def from_args(args: argparse.Namespace) -> EnginesCollector | None:
    """The collector the flags describe, or None when no engine source is configured."""
    procfs_root = args.engines_procfs or Path(getattr(args, "path_procfs", None) or "/proc")
    settings = EngineSettings(
        interval_seconds=args.engines_interval,
        scrape_timeout_seconds=args.engines_scrape_timeout,
        max_response_bytes=args.engines_max_response_bytes,
        max_series=args.engines_max_series,
        max_series_per_endpoint=args.engines_max_series_per_endpoint,
        procfs_path=procfs_root,
    )
    clock = SystemClock()
    sources: list[TargetSource] = []
    if args.engines_config is not None:
        sources.append(StaticSource(args.engines_config))
    if args.engines_discover_pods:
        if not args.engines_node_name:
            raise SystemExit("--engines.discover-pods needs --engines.node-name or $NODE_NAME")
        sources.append(KubePodSource(KubeSettings(args.engines_node_name, args.engines_kube_api_url), clock))
    if not sources:
        return None
    return EnginesCollector(sources, settings, clock)
