"""A clock that moves only when a test says so: gpupulse.clock.Clock without the waiting."""

from __future__ import annotations

import asyncio

from gpupulse.clock import Clock


class FakeClock(Clock):
    """Wall and monotonic time move together, by advance() or by sleep(); sleep() returns at once."""

    def __init__(self, start: float = 1_780_000_000.0, monotonic_start: float = 1000.0) -> None:
        self._now = start
        self._monotonic = monotonic_start
        self.sleeps: list[float] = []  # every sleep asked for, in order

    def time(self) -> float:
        """Seconds since the epoch, as last set."""
        return self._now

    def monotonic(self) -> float:
        """Seconds from the fake's own origin; moves with time()."""
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        """Record the sleep, move time by it, and let other tasks run once."""
        self.sleeps.append(seconds)
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move time forward; never backward."""
        if seconds < 0:
            raise ValueError("a FakeClock never goes backward")
        self._now += seconds
        self._monotonic += seconds
