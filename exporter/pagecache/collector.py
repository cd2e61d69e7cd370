"""The `pagecache` collector: how much of each model's weights sits in the host page cache."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.blocking import ItemReader
from exporter.collectors.flags import add_procfs_argument, collector_enabled, csv_list
from exporter.collectors.plugin import PluginContext
from exporter.collectors.series import family
from exporter.host.procfs import DEFAULT_PROCFS, Procfs
from exporter.pagecache.discovery import ModelKey, PathSpec, configured_files, mapped_files
from exporter.pagecache.sampler import BudgetSettings, ModelResidency, ResidencySampler, RoundStats
from gpupulse.clock import Clock, SystemClock
from gpupulse.durations import duration_flag
from gpupulse.metrics import pagecache as specs

NAME = "pagecache"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PageCacheSettings:
    interval_seconds: float = 30.0
    paths: tuple[str, ...] = ()  # `glob` or `name=glob`
    scan_mapped: bool = True  # also weight files that GPU processes have mapped
    procfs_path: str = DEFAULT_PROCFS
    window_bytes: int = 1 << 30
    max_bytes_per_round: int = 256 << 30
    max_seconds_per_round: float = 1.0
    max_models: int = 64
    # Slack over the scan budget for discovery (globs, /proc/<pid>/maps) and stat calls.
    timeout_slack_seconds: float = 0.5
    # One glob, one process's maps or one file's stat; one taking longer is set aside until it returns.
    item_timeout_seconds: float = 0.25

    @property
    def round_deadline_seconds(self) -> float:
        """Above every deadline inside a round."""
        return self.max_seconds_per_round + self.timeout_slack_seconds + self.item_timeout_seconds + 0.5


def _stat(key: tuple[str, Any]) -> os.stat_result:
    return os.stat(key[1])


class PageCacheCollector:
    """Samples mincore off the event loop on its own slow interval."""

    name = NAME

    def __init__(
        self, settings: PageCacheSettings, clock: Clock | None = None, procfs: Procfs | None = None
    ) -> None:
        self.settings = settings
        self.interval_seconds: float | None = settings.interval_seconds
        self.deadline_seconds = settings.round_deadline_seconds
        self._procfs = procfs or Procfs(settings.procfs_path)
        self._paths = tuple(PathSpec.parse(p) for p in settings.paths)
        budget = BudgetSettings(
            window_bytes=settings.window_bytes,
            max_bytes_per_round=settings.max_bytes_per_round,
            max_seconds_per_round=settings.max_seconds_per_round,
        )
        self._sampler = ResidencySampler(budget, clock or SystemClock())
        self._reader: ItemReader[tuple[str, Any], Any] = ItemReader("pagecache")
        self.last_stats = RoundStats()

    @property
    def tracked_files(self) -> int:
        """Weight files whose scan progress is kept."""
        return self._sampler.tracked_files

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """One budgeted round: find the weight files, stat them, scan them, residency per model.

        Every blocking step is one item of an ItemReader: a glob, a process's maps, or a file's stat
        or scan that hangs (a dead network mount) is set aside and costs only its own models.
        """
        s = self.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.max_seconds_per_round + s.timeout_slack_seconds

        def left() -> float:
            return max(0.0, deadline - loop.time())

        wanted = await self._discover(state, left())
        stats = RoundStats()
        stat_keys = [("stat", path) for path in sorted(wanted)]
        statted = await self._reader.read(stat_keys, _stat, left(), s.item_timeout_seconds)
        found = {key[1]: st for key, st in statted.values.items()}
        hung = {key[1] for key in statted.unread}
        self._sampler.refresh(wanted, found, stats, hung)
        budget = self._sampler.new_budget()
        scan_keys = [("scan", file_id) for file_id in self._sampler.scan_order()]
        scanned = await self._reader.read(
            scan_keys,
            lambda key: self._sampler.scan_file(key[1], budget, stats),
            left(),
            s.max_seconds_per_round + s.item_timeout_seconds,
        )
        self._sampler.end_round({key[1]: bool(done) for key, done in scanned.values.items()})
        hung |= {self._sampler.path_of(key[1]) for key in self._reader.stuck if key[0] == "scan"}
        self.last_stats = stats
        return self._families(self._sampler.by_model(hung))

    async def _discover(self, state: NodeState, budget_seconds: float) -> dict[str, set[ModelKey]]:
        """Weight files to watch: the configured globs and the files GPU processes have mapped."""
        pids = sorted({p.pid for p in state.processes}) if self.settings.scan_mapped else []
        pid_pods = dict(state.pid_pods)

        def read(key: tuple[str, Any]) -> dict[str, set[ModelKey]]:
            if key[0] == "globs":
                return configured_files(self._paths)
            return mapped_files(self._procfs, [key[1]], pid_pods)

        keys: list[tuple[str, Any]] = [("globs", ""), *(("maps", pid) for pid in pids)]
        found = await self._reader.read(keys, read, budget_seconds, self.settings.item_timeout_seconds)
        wanted: dict[str, set[ModelKey]] = {}
        for files in found.values.values():
            for path, model_keys in files.items():
                wanted.setdefault(path, set()).update(model_keys)
        return wanted

    def _families(self, models: dict[ModelKey, ModelResidency]) -> list[Metric]:
        ratio = family(specs.MODEL_WEIGHTS_PAGE_CACHE_RESIDENT_RATIO)
        resident = family(specs.MODEL_WEIGHTS_RESIDENT_BYTES)
        size = family(specs.MODEL_WEIGHTS_SIZE_BYTES)
        keys = sorted(models, key=lambda k: (k.namespace, k.pod, k.model))
        if len(keys) > self.settings.max_models:
            log.warning("page cache: %d models, exporting the first %d", len(keys), self.settings.max_models)
            keys = keys[: self.settings.max_models]
        for key in keys:
            value = models[key]
            labels = [key.model, key.namespace, key.pod]
            ratio.add_metric(labels, value.resident_bytes / value.size_bytes if value.size_bytes else 0.0)
            resident.add_metric(labels, float(value.resident_bytes))
            size.add_metric(labels, float(value.size_bytes))
        return [f for f in (ratio, resident, size) if len(f)]

    async def close(self) -> None:
        """Stop the worker threads; files are opened and unmapped within each item."""
        self._reader.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the pagecache flags on exporter-core's parser."""
    d = PageCacheSettings()
    group = parser.add_argument_group("pagecache (model weights resident in the page cache)")
    group.add_argument(
        "--pagecache.interval",
        dest="pagecache_interval",
        type=duration_flag,
        default=d.interval_seconds,
        help="seconds between page-cache rounds (default: %(default)s)",
    )
    group.add_argument(
        "--pagecache.paths",
        dest="pagecache_paths",
        type=csv_list,
        action="extend",
        default=[],
        help="weight files, directories or globs to watch, `glob` or `model=glob`, "
        "comma-separated or repeated",
    )
    group.add_argument(
        "--pagecache.no-mapped",
        dest="pagecache_scan_mapped",
        action="store_false",
        help="do not watch weight files that GPU processes have mapped (/proc/<pid>/maps)",
    )
    group.add_argument(
        "--pagecache.window-bytes",
        dest="pagecache_window_bytes",
        type=int,
        default=d.window_bytes,
        help="bytes mapped per mincore call (default: %(default)s)",
    )
    group.add_argument(
        "--pagecache.max-bytes-per-round",
        dest="pagecache_max_bytes_per_round",
        type=int,
        default=d.max_bytes_per_round,
        help="file bytes examined per round; larger models finish over several rounds (default: %(default)s)",
    )
    group.add_argument(
        "--pagecache.max-seconds-per-round",
        dest="pagecache_max_seconds_per_round",
        type=duration_flag,
        default=d.max_seconds_per_round,
        help="time budget per round (default: %(default)s)",
    )
    group.add_argument(
        "--pagecache.max-models",
        dest="pagecache_max_models",
        type=int,
        default=d.max_models,
        help="cap on model series (default: %(default)s)",
    )
    add_procfs_argument(parser)


def from_args(args: argparse.Namespace, ctx: PluginContext) -> PageCacheCollector | None:
    """Build the collector from parsed flags; None when --no-collector.pagecache was given (it
    shares nothing of the context: it reads the host's files alone)."""
    if not collector_enabled(args, NAME):
        return None
    settings = PageCacheSettings(
        interval_seconds=args.pagecache_interval,
        paths=tuple(args.pagecache_paths),
        scan_mapped=args.pagecache_scan_mapped,
        procfs_path=args.path_procfs,
        window_bytes=args.pagecache_window_bytes,
        max_bytes_per_round=args.pagecache_max_bytes_per_round,
        max_seconds_per_round=args.pagecache_max_seconds_per_round,
        max_models=args.pagecache_max_models,
    )
    return PageCacheCollector(settings)
