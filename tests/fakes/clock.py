"""A clock that moves only when a test says so."""

from __future__ import annotations

from datetime import UTC, datetime


class FakeClock:
    """Clock protocol implementation driven by advance()."""

    def __init__(self, start: float = 1_780_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        """Seconds since the epoch, as last set."""
        return self._now

    def utcnow(self) -> datetime:
        """The same instant as an aware UTC datetime."""
        return datetime.fromtimestamp(self._now, tz=UTC)

    def advance(self, seconds: float) -> None:
        """Move time forward; never backward."""
        if seconds < 0:
            raise ValueError("a FakeClock never goes backward")
        self._now += seconds
