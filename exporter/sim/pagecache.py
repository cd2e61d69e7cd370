"""Drives real page-cache state from a scenario's `page_cache` section (demo and integration tests).

Each entry gets a weight file under a work directory on a disk-backed filesystem; at the listed
scenario times the file is evicted (fsync + posix_fadvise DONTNEED) or read back in, so the real
`pagecache` collector sees the ratio fall and recover. `flags()` gives the matching
`--pagecache.paths` values (with the entry's namespace/pod as labels).

    page_cache:
      - model: llama-8b
        namespace: serving
        pod: llama-8b-0
        file: model-00001-of-00001.safetensors   # default model.safetensors
        size_bytes: 64MiB
        evict_at: [600, 1200]
        warm_at: [0, 900]
        keep_warm: true   # read it again every tick while warm, as an engine reading its weights does

(The kernel may drop a few MiB of a freshly written file within a second; `keep_warm` holds it at
100 % until the eviction, so a "was >= 95 %" condition sees it.)

Run: python -m exporter.sim.pagecache SCENARIO --work-dir .work/pagecache [--speed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.errors import PageCacheScenarioError

_MIB = 1 << 20
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB)\s*$")


@dataclass(frozen=True)
class WeightEntry:
    model: str
    namespace: str
    pod: str
    size_bytes: int
    evict_at: tuple[float, ...]
    warm_at: tuple[float, ...]
    file: str = "model.safetensors"
    keep_warm: bool = False

    def path(self, work_dir: Path) -> Path:
        """Where this entry's weight file lives."""
        owner = f"{self.namespace}_{self.pod}" if self.pod else "_"
        return work_dir / owner / self.model / self.file


def _size(value: Any) -> int:
    if isinstance(value, int) and value > 0:
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise PageCacheScenarioError(f"size_bytes: expected bytes or like '64MiB', got {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


_FIELDS = ("model", "namespace", "pod", "file", "size_bytes", "evict_at", "warm_at", "keep_warm")
_WEIGHT_FILE = re.compile(r"^[A-Za-z0-9._-]+$")


def _times(raw: Any, where: str) -> tuple[float, ...]:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = [raw]
    ok = isinstance(raw, list | tuple) and all(
        isinstance(t, int | float) and not isinstance(t, bool) and t >= 0 for t in raw
    )
    if not ok:
        raise PageCacheScenarioError(f"{where}: expected scenario times in seconds (>= 0), got {raw!r}")
    return tuple(sorted(float(t) for t in raw))


def parse_section(section: Sequence[Mapping[str, Any]]) -> tuple[WeightEntry, ...]:
    """Validate the raw `page_cache` list."""
    out = []
    for i, raw in enumerate(section):
        where = f"page_cache[{i}]"
        if not isinstance(raw, Mapping) or "model" not in raw:
            raise PageCacheScenarioError(f"{where}: model is required")
        unknown = sorted(set(raw) - set(_FIELDS))
        if unknown:
            raise PageCacheScenarioError(f"{where}: unknown fields {unknown} (allowed: {', '.join(_FIELDS)})")
        name = str(raw.get("file", "model.safetensors"))
        if not _WEIGHT_FILE.match(name) or name in (".", ".."):
            raise PageCacheScenarioError(f"{where}.file: a file name without directories, got {name!r}")
        keep_warm = raw.get("keep_warm", False)
        if not isinstance(keep_warm, bool):
            raise PageCacheScenarioError(f"{where}.keep_warm: expected true or false, got {keep_warm!r}")
        out.append(
            WeightEntry(
                model=str(raw["model"]),
                namespace=str(raw.get("namespace", "")),
                pod=str(raw.get("pod", "")),
                size_bytes=_size(raw.get("size_bytes", 64 * _MIB)),
                evict_at=_times(raw.get("evict_at", ()), f"{where}.evict_at"),
                warm_at=_times(raw.get("warm_at", (0,)), f"{where}.warm_at"),
                file=name,
                keep_warm=keep_warm,
            )
        )
    return tuple(out)


class PageCacheScenario:
    """Creates the files and applies evict/warm actions as scenario time passes (blocking I/O)."""

    def __init__(self, entries: Sequence[WeightEntry], work_dir: Path) -> None:
        self.entries = tuple(entries)
        self.work_dir = work_dir
        self._done: set[tuple[int, str, float]] = set()
        self._warm: set[int] = set()  # entries whose last action was a warm-up

    def prepare(self) -> None:
        """Write every weight file that is missing or has the wrong size."""
        for entry in self.entries:
            path = entry.path(self.work_dir)
            if path.exists() and path.stat().st_size == entry.size_bytes:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            block = os.urandom(_MIB)
            with open(path, "wb") as f:
                for _ in range(entry.size_bytes // _MIB):
                    f.write(block)
                f.write(block[: entry.size_bytes % _MIB])
                f.flush()
                os.fsync(f.fileno())  # DONTNEED drops clean pages only

    def flags(self) -> list[str]:
        """`--pagecache.paths` values that watch these files with the entries' labels."""
        out = []
        for entry in self.entries:
            owner = f"@{entry.namespace}/{entry.pod}" if entry.namespace and entry.pod else ""
            out.append(f"{entry.model}{owner}={entry.path(self.work_dir)}")
        return out

    def apply(self, elapsed_seconds: float) -> list[str]:
        """Run every action due by `elapsed_seconds` that has not run yet, in time order."""
        due = []
        for i, entry in enumerate(self.entries):
            due += [(t, i, "evict") for t in entry.evict_at if t <= elapsed_seconds]
            due += [(t, i, "warm") for t in entry.warm_at if t <= elapsed_seconds]
        done = []
        for t, i, action in sorted(due):
            if (i, action, t) in self._done:
                continue
            self._done.add((i, action, t))
            path = self.entries[i].path(self.work_dir)
            if action == "evict":
                evict(path)
                self._warm.discard(i)
            else:
                warm(path)
                self._warm.add(i)
            done.append(f"t={t:g}s {action} {self.entries[i].model}")
        for i in sorted(self._warm):
            if self.entries[i].keep_warm:
                warm(self.entries[i].path(self.work_dir))  # an engine keeps reading its weights
        return done


def evict(path: Path) -> None:
    """Drop a file's clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    """Read a file so its pages are resident."""
    with open(path, "rb") as f:
        while f.read(8 * _MIB):
            pass


async def _run(scenario: PageCacheScenario, speed: float, duration_seconds: float) -> None:
    start = time.monotonic()
    while True:
        elapsed = (time.monotonic() - start) * speed
        for line in await asyncio.to_thread(scenario.apply, elapsed):
            print(line, flush=True)
        if elapsed >= duration_seconds:
            return
        await asyncio.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> None:
    """Prepare the files, print the --pagecache.paths flags, then play the schedule."""
    import yaml

    parser = argparse.ArgumentParser(description="play a scenario's page_cache section")
    parser.add_argument("scenario", help="scenario YAML path")
    parser.add_argument("--work-dir", default=".work/pagecache", help="on a disk-backed filesystem")
    parser.add_argument("--speed", type=float, default=1.0, help="scenario seconds per real second")
    args = parser.parse_args(argv)
    with open(args.scenario, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    scenario = PageCacheScenario(parse_section(doc.get("page_cache") or ()), Path(args.work_dir))
    scenario.prepare()
    for flag in scenario.flags():
        print(f"--pagecache.paths={flag}", flush=True)
    asyncio.run(_run(scenario, args.speed, float(doc.get("duration_seconds", 600))))


if __name__ == "__main__":
    main()
