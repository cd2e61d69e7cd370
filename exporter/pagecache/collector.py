"""The `pagecache` collector: how much of each model's weights sits in the host page cache."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from exporter.attribution.clock import Clock, SystemClock
from exporter.attribution.families import add_value, new_family
from exporter.attribution.flags import add_procfs_argument, collector_enabled, csv_list
from exporter.attribution.procfs import DEFAULT_PROCFS, Procfs
from exporter.collectors.base import CollectorError, NodeState
from exporter.config import duration_seconds
from exporter.pagecache import specs
from exporter.pagecache.discovery import ModelKey, PathSpec, configured_files, mapped_files
from exporter.pagecache.sampler import BudgetSettings, ModelResidency, ResidencySampler, RoundStats

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
    # Slack over the scan budget for discovery (globs, /proc/<pid>/maps) before the round is failed;
    # budget + slack stay below the sampler's --collector.timeout (2 s by default).
    timeout_slack_seconds: float = 0.5


class PageCacheCollector:
    """Samples mincore off the event loop on its own slow interval."""

    name = NAME

    def __init__(
        self, settings: PageCacheSettings, clock: Clock | None = None, procfs: Procfs | None = None
    ) -> None:
        self.settings = settings
        self.interval_seconds: float | None = settings.interval_seconds
        self._procfs = procfs or Procfs(settings.procfs_path)
        self._paths = tuple(PathSpec.parse(p) for p in settings.paths)
        budget = BudgetSettings(
            window_bytes=settings.window_bytes,
            max_bytes_per_round=settings.max_bytes_per_round,
            max_seconds_per_round=settings.max_seconds_per_round,
        )
        self._sampler = ResidencySampler(budget, clock or SystemClock())
        self._busy = False
        self.last_stats = RoundStats()

    @property
    def tracked_files(self) -> int:
        """Weight files whose scan progress is kept."""
        return self._sampler.tracked_files

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Run one budgeted round in a thread and return residency per model."""
        if self._busy:
            raise CollectorError("previous page-cache round still running")
        pids = sorted({p.pid for p in state.processes}) if self.settings.scan_mapped else []
        pid_pods = dict(state.pid_pods)

        def work() -> tuple[dict[ModelKey, ModelResidency], RoundStats]:
            try:
                wanted = configured_files(self._paths)
                for path, keys in mapped_files(self._procfs, pids, pid_pods).items():
                    wanted.setdefault(path, set()).update(keys)
                return self._sampler.run_round(wanted)
            finally:
                self._busy = False

        self._busy = True
        timeout = self.settings.max_seconds_per_round + self.settings.timeout_slack_seconds
        try:
            models, self.last_stats = await asyncio.wait_for(asyncio.to_thread(work), timeout)
        except TimeoutError as exc:
            raise CollectorError(f"page-cache round took over {timeout} s") from exc
        return self._families(models)

    def _families(self, models: dict[ModelKey, ModelResidency]) -> list[Metric]:
        ratio = new_family(specs.MODEL_WEIGHTS_PAGE_CACHE_RESIDENT_RATIO)
        resident = new_family(specs.MODEL_WEIGHTS_RESIDENT_BYTES)
        size = new_family(specs.MODEL_WEIGHTS_SIZE_BYTES)
        keys = sorted(models, key=lambda k: (k.namespace, k.pod, k.model))
        if len(keys) > self.settings.max_models:
            log.warning("page cache: %d models, exporting the first %d", len(keys), self.settings.max_models)
            keys = keys[: self.settings.max_models]
        for key in keys:
            value = models[key]
            labels = [key.model, key.namespace, key.pod]
            add_value(ratio, labels, value.resident_bytes / value.size_bytes if value.size_bytes else 0.0)
            add_value(resident, labels, float(value.resident_bytes))
            add_value(size, labels, float(value.size_bytes))
        return [f for f in (ratio, resident, size) if f.samples]

    async def close(self) -> None:
        """Nothing to release: files are opened and unmapped within each round."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the pagecache flags on exporter-core's parser."""
    d = PageCacheSettings()
    group = parser.add_argument_group("pagecache (model weights resident in the page cache)")
    group.add_argument(
        "--pagecache.interval",
        dest="pagecache_interval",
        type=duration_seconds,
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
        type=duration_seconds,
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


def from_args(args: argparse.Namespace) -> PageCacheCollector | None:
    """Build the collector from parsed flags; None when --no-collector.pagecache was given."""
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
