"""The `progress` collector: the step of each training rank pod on this node, from its container log
or from a counter it already serves, and when that step last changed.

Plug-in contract for the exporter CLI: add_arguments(parser) and from_args(args) -> Collector | None.
Logs are read on a worker thread under a per-file and a per-round deadline (steps.py); endpoints are
fetched concurrently with the engines collector's bounded, streaming fetch under one deadline each.
A source that fails counts its reason and keeps its last state while its pod runs: a hung job whose
metrics endpoint hangs too has still made no progress. Series of pods that are gone are dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.blocking import ItemReader
from exporter.collectors.flags import collector_enabled
from exporter.collectors.plugin import PluginContext
from exporter.collectors.series import family
from exporter.errors import ConfigError, ExpositionError, ScrapeError
from exporter.exposition.fetch import fetch_page
from exporter.exposition.parse import ExpositionParser
from exporter.kube import flags as kube_flags
from exporter.kube.pods import PodStore, PodView
from exporter.progress.pods import MetricSource, ProgressPod, progress_pods
from exporter.progress.steps import (
    DEFAULT_MAX_READ_BYTES,
    DEFAULT_PATTERNS,
    LogTail,
    StepState,
    TailRead,
    compile_patterns,
    observe,
)
from exporter.wire.http1 import HttpClient
from gpupulse.clock import Clock, SystemClock
from gpupulse.durations import duration_flag
from gpupulse.metrics import progress as specs

NAME = "progress"
log = logging.getLogger(__name__)

# (namespace, pod, container, source); container is "" for a metric
Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class ProgressSettings:
    """Where and how progress is read; one place for the defaults."""

    interval_seconds: float = 5.0
    pod_logs_dir: str = "/var/log/pods"  # kubelet's pod log root (a hostPath); "" turns logs off
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES  # of one container's log per round
    log_timeout_seconds: float = 1.0  # one round's log reads together
    log_item_timeout_seconds: float = 0.25  # one file's read; a hung one is set aside
    scrape_timeout_seconds: float = 2.0
    max_response_bytes: int = 4 * 1024 * 1024
    max_series: int = 256  # (pod, container, source) series; the rest are not read
    first_wait_seconds: float = 1.0  # the first round waits this long for the pod watch's LIST

    @property
    def round_deadline_seconds(self) -> float:
        """Above every deadline inside a round: the first LIST, then logs beside the scrapes."""
        return self.first_wait_seconds + max(self.log_timeout_seconds, self.scrape_timeout_seconds) + 1.0


@dataclass(frozen=True)
class _Source:
    key: Key
    pod: ProgressPod
    metric: MetricSource | None = None


class ProgressCollector:
    """One round: this node's rank pods, their logs' last step lines and their counters."""

    name = NAME

    def __init__(self, settings: ProgressSettings, pods: PodStore, clock: Clock | None = None) -> None:
        self.settings = settings
        self.interval_seconds: float | None = settings.interval_seconds
        self.deadline_seconds = settings.round_deadline_seconds
        self._patterns = compile_patterns(settings.patterns)
        # this plug-in's view of the node's pod store: the rank pods, nothing else of them
        self._pods: PodView[list[ProgressPod]] = pods.view("progress", progress_pods)
        self._waited = False
        self._clock = clock or SystemClock()
        self._states: dict[Key, StepState] = {}
        self._tails: dict[Key, LogTail] = {}
        self._errors: dict[tuple[str, str], float] = {}
        self._kept: set[Key] = set()
        self._reader: ItemReader[Key, TailRead] = ItemReader("progress-logs")
        self._http = HttpClient()
        self._logs_root = Path(settings.pod_logs_dir) if settings.pod_logs_dir else None
        self._warned_root = False

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Read every source of this round, update each one's step state, render."""
        await self._first_sync()
        sources = self._sources(self._pods.value)
        current = {s.key for s in sources}
        for table in (self._states, self._tails):
            for key in [k for k in table if k not in current]:
                del table[key]  # the pod is gone (or no longer a rank): its series go with it
        logs = [s for s in sources if s.metric is None]
        metrics = [s for s in sources if s.metric is not None]
        self._http.retain(s.metric.url for s in metrics if s.metric is not None)  # gone pods' connections
        await asyncio.gather(self._read_logs(logs), *(self._scrape(s) for s in metrics))
        return self._families(sources)

    async def _first_sync(self) -> None:
        source = self._pods
        source.start()  # the shared store: another plug-in may have started it already
        if self._waited:
            return
        self._waited = True
        with contextlib.suppress(TimeoutError):
            await source.wait_until(
                lambda: source.stats.lists > 0 or source.stats.failures > 0, self.settings.first_wait_seconds
            )

    def _sources(self, pods: Sequence[ProgressPod]) -> list[_Source]:
        """Every (pod, container, source) of this round, under max_series: the ones read last round
        keep their place, so a crowd of new pods cannot make existing series flap."""
        out: list[_Source] = []
        for pod in pods:
            if pod.metric is not None:
                out.append(_Source((pod.namespace, pod.name, "", "metric"), pod, pod.metric))
            elif self._logs_root is not None:
                out.extend(_Source((pod.namespace, pod.name, c, "log"), pod) for c in pod.containers)
        out.sort(key=lambda s: (s.key not in self._kept, s.key))
        kept = sorted(out[: max(self.settings.max_series, 0)], key=lambda s: s.key)
        self._kept = {s.key for s in kept}
        return kept

    def _count(self, source: str, reason: str) -> None:
        self._errors[(source, reason)] = self._errors.get((source, reason), 0.0) + 1.0

    async def _read_logs(self, sources: list[_Source]) -> None:
        root = self._logs_root
        if root is None or not sources:
            return
        by_key = {s.key: s for s in sources}
        for key, s in by_key.items():
            if key not in self._tails:
                self._tails[key] = LogTail(root / s.pod.log_dir_name / key[2], self.settings.max_read_bytes)
        tails = dict(self._tails)
        patterns = self._patterns
        st = self.settings
        got = await self._reader.read(
            sorted(by_key),
            lambda key: tails[key].read(patterns),
            st.log_timeout_seconds,
            st.log_item_timeout_seconds,
        )
        now = self._clock.time()
        for key, read in got.values.items():
            if read.oversized:
                self._count("log", "oversized")
            if read.step is not None:
                at = min(read.step.line_time, now) if read.step.line_time is not None else now
                self._states[key] = observe(self._states.get(key), float(read.step.step), at)
        for exc in got.errors.values():
            self._count("log", "missing" if isinstance(exc, FileNotFoundError) else "unreadable")
        missing = [e for e in got.errors.values() if isinstance(e, FileNotFoundError)]
        if missing and len(missing) == len(by_key) and not self._warned_root:
            # every rank's log missing at once: most likely the host's directory is not mounted
            log.warning("no pod logs under %s (is it mounted from the host?): %s", root, missing[0])
            self._warned_root = True
        for _ in got.unread:
            self._count("log", "timeout")

    async def _scrape(self, source: _Source) -> None:
        metric = source.metric
        assert metric is not None
        st = self.settings
        wanted = {metric.name, metric.name.removesuffix("_total")}
        try:
            expo = await fetch_page(
                self._http,
                metric.url,
                st.scrape_timeout_seconds,
                st.max_response_bytes,
                ExpositionParser(wanted, max_samples=1000),
            )
            samples = expo.counter(metric.name) or expo.gauge(metric.name)
            values = [s.value for s in samples if s.value == s.value and abs(s.value) < 1e15]
            if not values:
                raise ScrapeError("no_metric", f"{metric.name} not on the page")
        except ScrapeError as exc:
            self._count("metric", exc.reason)
            log.debug("progress endpoint %s: %s", metric.url, exc)
            return
        except ExpositionError as exc:
            self._count("metric", "parse")
            log.debug("progress endpoint %s: %s", metric.url, exc)
            return
        self._states[source.key] = observe(self._states.get(source.key), max(values), self._clock.time())

    def _families(self, sources: Sequence[_Source]) -> list[Metric]:
        steps = family(specs.GPU_TRAINING_PROGRESS_STEPS_TOTAL)
        last = family(specs.GPU_TRAINING_PROGRESS_LAST_STEP_TIMESTAMP_SECONDS)
        interval = family(specs.GPU_TRAINING_PROGRESS_UPDATE_INTERVAL_SECONDS)
        for s in sources:
            got = self._states.get(s.key)
            if got is None:
                continue
            p = s.pod
            labels = [p.namespace, p.name, s.key[2], p.training_job_kind, p.training_job, p.rank, s.key[3]]
            steps.add_metric(labels, got.step)
            last.add_metric(labels, got.changed_at)
            if got.interval_seconds is not None:
                interval.add_metric(labels, got.interval_seconds)
        errors = family(specs.PROGRESS_READ_ERRORS_TOTAL)
        for (source, reason), count in sorted(self._errors.items()):
            errors.add_metric([source, reason], count)
        return [f for f in (steps, last, interval, errors) if len(f)]

    async def close(self) -> None:
        """Close the HTTP connections and the log reader (the exporter closes the shared pod store)."""
        await self._http.close()
        self._reader.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the --progress.* flags."""
    d = ProgressSettings()
    g = parser.add_argument_group("training progress (step lines and step counters of rank pods)")
    g.add_argument(
        "--progress.interval",
        dest="progress_interval",
        type=duration_flag,
        default=d.interval_seconds,
        help="seconds between progress rounds",
    )
    g.add_argument(
        "--progress.pod-logs-dir",
        dest="progress_pod_logs_dir",
        default=d.pod_logs_dir,
        help="kubelet's pod log directory, mounted from the host; empty turns step lines off",
    )
    g.add_argument(
        "--progress.step-pattern",
        dest="progress_step_patterns",
        action="append",
        default=None,
        help="a regular expression with one capture group, the step, matched against each log line "
        "(repeat it; replaces the built-in patterns for Megatron-LM, NeMo, DeepSpeed, torchtitan, "
        "tqdm bars and Composer)",
    )
    g.add_argument(
        "--progress.max-read-bytes",
        dest="progress_max_read_bytes",
        type=int,
        default=d.max_read_bytes,
        help="most bytes read from one container's log per round (its end, when more was written)",
    )
    g.add_argument(
        "--progress.scrape-timeout",
        dest="progress_scrape_timeout",
        type=duration_flag,
        default=d.scrape_timeout_seconds,
        help="deadline of one gpupulse.io/progress-metric endpoint's answer",
    )
    g.add_argument(
        "--progress.max-series",
        dest="progress_max_series",
        type=int,
        default=d.max_series,
        help="most (pod, container) progress sources read",
    )
    # --progress.node-name, --progress.kube-api-url, --progress.kube-token-file: now --kube.*
    kube_flags.add_aliases(parser, "progress")


def from_args(args: argparse.Namespace, ctx: PluginContext) -> ProgressCollector | None:
    """The collector the flags describe, on the node's shared pod store; None when it is off or no
    node name is known."""
    if not collector_enabled(args, NAME) or kube_flags.turned_off(args, "--progress.node-name"):
        return None
    store = ctx.kube.pods()
    if store is None:
        return None
    settings = ProgressSettings(
        interval_seconds=args.progress_interval,
        pod_logs_dir=args.progress_pod_logs_dir,
        patterns=tuple(args.progress_step_patterns or DEFAULT_PATTERNS),
        max_read_bytes=args.progress_max_read_bytes,
        scrape_timeout_seconds=args.progress_scrape_timeout,
        max_series=args.progress_max_series,
    )
    try:
        compile_patterns(settings.patterns)
    except ConfigError as exc:
        raise SystemExit(f"--progress.step-pattern: {exc}") from exc
    return ProgressCollector(settings, store)
