"""Residency of many weight files under a per-round byte and time budget, resumed across rounds."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from exporter.errors import MincoreError
from exporter.pagecache.discovery import ModelKey
from exporter.pagecache.mincore import mincore_allowed, scan
from gpupulse.clock import Clock

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


@dataclass
class RoundBudget:
    """What one round may still spend; touched only by the round's worker thread."""

    bytes_left: int
    deadline: float


class ResidencySampler:
    """Keeps per-file progress; a model is reported once every one of its files has a full pass.

    A round is `refresh` (with the files' stat results), then `scan_file` for each file of
    `scan_order()` on a worker thread, then `end_round`. The collector runs the blocking steps (stat,
    scan) one item at a time, so a file whose read hangs (a dead network mount) costs only itself.
    """

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
        """A whole round in this thread (blocking): stat, scan within the budget, residency per model."""
        stats = RoundStats()
        found: dict[str, os.stat_result] = {}
        for path in wanted:
            with contextlib.suppress(OSError):
                found[path] = os.stat(path)
        self.refresh(wanted, found, stats)
        budget = self.new_budget()
        done: dict[FileId, bool] = {}
        for file_id in self.scan_order():
            done[file_id] = self.scan_file(file_id, budget, stats)
            if not done[file_id]:
                break
        self.end_round(done)
        return self.by_model(), stats

    def new_budget(self) -> RoundBudget:
        """The byte and time budget of a round that starts now."""
        return RoundBudget(
            self._settings.max_bytes_per_round, self._clock.monotonic() + self._settings.max_seconds_per_round
        )

    def scan_order(self) -> list[FileId]:
        """Files in the order to scan: after the one the last round stopped at, so a huge model
        cannot starve the others."""
        order = sorted(self._files)
        if self._cursor in self._files:
            start = order.index(self._cursor)
            order = order[start:] + order[:start]
        return order

    def scan_file(self, file_id: FileId, budget: RoundBudget, stats: RoundStats) -> bool:
        """Advance one file's scan (blocking); False when the budget ran out inside it."""
        state = self._files.get(file_id)
        if state is None:
            return True
        while budget.bytes_left > 0 and self._clock.monotonic() < budget.deadline:
            step = min(self._settings.window_bytes, budget.bytes_left)
            try:
                result = scan(state.path, state.offset, step, self._settings.window_bytes)
            except (OSError, MincoreError) as exc:
                stats.files_failed.append(state.path)
                log.debug("page-cache scan of %s failed: %s", state.path, exc)
                return True
            budget.bytes_left -= result.scanned_to - state.offset
            stats.bytes_scanned += result.scanned_to - state.offset
            state.partial_resident_bytes += result.resident_bytes
            state.offset = result.scanned_to
            if state.offset >= result.size_bytes:
                state.last = (min(state.partial_resident_bytes, result.size_bytes), result.size_bytes)
                state.offset, state.partial_resident_bytes = 0, 0
                stats.files_completed += 1
                return True
        return False

    def path_of(self, file_id: FileId) -> str:
        """The path a tracked file was last seen under ("" when it is no longer tracked)."""
        state = self._files.get(file_id)
        return state.path if state is not None else ""

    def end_round(self, done: Mapping[FileId, bool]) -> None:
        """Where the next round starts: the first file this round did not finish."""
        order = self.scan_order()
        self._cursor = next((f for f in order if not done.get(f, False)), None)

    def refresh(
        self,
        wanted: Mapping[str, Set[ModelKey]],
        found: Mapping[str, os.stat_result],
        stats: RoundStats,
        unread: Set[str] = frozenset(),
    ) -> None:
        """Track the wanted files that exist (`found`: their stat results), by inode. Files whose stat
        did not return in time (`unread`) keep their progress; their models wait for them."""
        fresh: dict[FileId, _FileState] = {
            file_id: state for file_id, state in self._files.items() if state.path in unread
        }
        for path, keys in wanted.items():
            st = found.get(path)
            if st is None:
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

    def by_model(self, unreadable: Set[str] = frozenset()) -> dict[ModelKey, ModelResidency]:
        """Residency of every model whose files all have a full pass; `unreadable` paths (a read that
        hangs) make their models incomplete, so no stale ratio is served for them."""
        totals: dict[ModelKey, list[int]] = {}
        incomplete: set[ModelKey] = set()
        for state in self._files.values():
            for key in state.keys:
                if state.last is None or state.path in unreadable:
                    incomplete.add(key)
                    continue
                acc = totals.setdefault(key, [0, 0])
                acc[0] += state.last[0]
                acc[1] += state.last[1]
        return {k: ModelResidency(v[0], v[1]) for k, v in totals.items() if k not in incomplete}
