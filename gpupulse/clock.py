"""The one clock protocol: time is passed in, so windows, deadlines and ladders are tested without sleeping.

Every part of gpupulse that reads time or waits goes through a `Clock`: the exporter's sampler,
collectors and OTLP pusher, the simulator's scenario clocks, the controller's engine, inbox worker and
Kubernetes parts. The method names mirror the standard library (`time.time`, `time.monotonic`,
`asyncio.sleep`) so a reader knows what each one holds without looking it up.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """Wall time for timestamps, monotonic time for intervals and deadlines, and waiting.

    An implementation that subclasses `Clock` inherits `utcnow()` from `time()`.
    """

    def time(self) -> float:
        """Wall time: seconds since the Unix epoch (may jump when the system clock is set)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never go backwards: use for intervals and deadlines."""
        ...

    def utcnow(self) -> datetime:
        """The instant of `time()` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.time(), tz=UTC)

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time without blocking the event loop."""
        ...


class SystemClock(Clock):
    """The real clock of the machine."""

    def time(self) -> float:
        """time.time()."""
        return time.time()

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def utcnow(self) -> datetime:
        """datetime.now(UTC)."""
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        """asyncio.sleep(seconds)."""
        await asyncio.sleep(seconds)
