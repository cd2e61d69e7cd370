"""Residency of many weight files under a per-round byte and time budget, resumed across rounds."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from exporter.attribution.clock import Clock
from exporter.pagecache.discovery import ModelKey
from exporter.pagecache.mincore import MincoreError, mincore_allowed, scan

log = logging.getLogger(__name__)

FileId = tuple[int, int]  # (st_dev, st_ino): one file seen through several paths is scanned once


@dataclass(frozen=True)
class BudgetSettings:
    window_bytes: int = 1 << 30  # mapped at a time; bounds address space and the mincore vector
    max_bytes_per_round: int = 256 << 30  # file range covered per round; the rest resumes next round
    max_seconds_per_round: float = 1.0


@dataclass
class _FileState:
    path: str
    keys: frozenset[ModelKey]
    version: tuple[int, int]  # (size, mtime_ns): a rewritten file starts over
    offset: int = 0
    partial_resident_bytes: int = 0
    last: tuple[int, int] | None = None  # (resident_bytes, size_bytes) of the last complete pass


@dataclass(frozen=True)
class ModelResidency:
    resident_bytes: int
    size_bytes: int


@dataclass
class RoundStats:
    bytes_scanned: int = 0
    files_completed: int = 0
    files_denied: list[str] = field(default_factory=list)
    files_failed: list[str] = field(default_factory=list)


class ResidencySampler:
    """Keeps per-file progress; a model is reported once every one of its files has a full pass."""

    def __init__(self, settings: BudgetSettings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._files: dict[FileId, _FileState] = {}
        self._cursor: FileId | None = None
        self._denied_logged: set[str] = set()

    @property
    def tracked_files(self) -> int:
        """Files with progress kept (pruned when they are no longer wanted)."""
        return len(self._files)

    def run_round(
        self, wanted: Mapping[str, Set[ModelKey]]
    ) -> tuple[dict[ModelKey, ModelResidency], RoundStats]:
        """Advance scans within the budget; return per-model residency of completed files (blocking)."""
        stats = RoundStats()
        self._refresh(wanted, stats)
        deadline = self._clock.monotonic() + self._settings.max_seconds_per_round
        budget = self._settings.max_bytes_per_round
        order = sorted(self._files)
        # Start after the file the last round stopped at, so a huge model cannot starve the others.
        if self._cursor in self._files:
            start = order.index(self._cursor)
            order = order[start:] + order[:start]
        for file_id in order:
            state = self._files[file_id]
            self._cursor = file_id
            while budget > 0 and self._clock.monotonic() < deadline:
                step = min(self._settings.window_bytes, budget)
                try:
                    result = scan(state.path, state.offset, step, self._settings.window_bytes)
                except (OSError, MincoreError) as exc:
                    stats.files_failed.append(state.path)
                    log.debug("page-cache scan of %s failed: %s", state.path, exc)
                    break
                budget -= result.scanned_to - state.offset
                stats.bytes_scanned += result.scanned_to - state.offset
                state.partial_resident_bytes += result.resident_bytes
                state.offset = result.scanned_to
                if state.offset >= result.size_bytes:
                    state.last = (min(state.partial_resident_bytes, result.size_bytes), result.size_bytes)
                    state.offset, state.partial_resident_bytes = 0, 0
                    stats.files_completed += 1
                    break
            else:
                break  # budget spent: this file resumes first next round
        else:
            self._cursor = None
        return self._by_model(), stats

    def _refresh(self, wanted: Mapping[str, Set[ModelKey]], stats: RoundStats) -> None:
        fresh: dict[FileId, _FileState] = {}
        for path, keys in wanted.items():
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not mincore_allowed(path, st):
                stats.files_denied.append(path)
                if path not in self._denied_logged:
                    self._denied_logged.add(path)
                    log.warning(
                        "cannot read page-cache state of %s: needs file owner, write access or CAP_FOWNER",
                        path,
                    )
                continue
            file_id = (st.st_dev, st.st_ino)
            version = (st.st_size, st.st_mtime_ns)
            merged = fresh.get(file_id)
            if merged is not None:
                merged.keys = merged.keys | frozenset(keys)
                continue
            old = self._files.get(file_id)
            if old is not None and old.version == version:
                old.path, old.keys = path, frozenset(keys)
                fresh[file_id] = old
            else:
                fresh[file_id] = _FileState(path=path, keys=frozenset(keys), version=version)
        self._files = fresh
        self._denied_logged &= set(wanted)

    def _by_model(self) -> dict[ModelKey, ModelResidency]:
        totals: dict[ModelKey, list[int]] = {}
        incomplete: set[ModelKey] = set()
        for state in self._files.values():
            for key in state.keys:
                if state.last is None:
                    incomplete.add(key)
                    continue
                acc = totals.setdefault(key, [0, 0])
                acc[0] += state.last[0]
                acc[1] += state.last[1]
        return {k: ModelResidency(v[0], v[1]) for k, v in totals.items() if k not in incomplete}
