"""XID error counts per (GPU, code), fed by the NVML event thread on the event loop."""

from __future__ import annotations

from collections import Counter


class XidCounter:
    """Counts XID events; add() runs on the event loop (the watcher hands events over thread-safely)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, int]] = Counter()

    def add(self, uuid: str, xid: int) -> None:
        """Count one event."""
        self._counts[(uuid, xid)] += 1

    def counts(self) -> dict[tuple[str, int], int]:
        """A copy of the counts by (uuid, xid)."""
        return dict(self._counts)
