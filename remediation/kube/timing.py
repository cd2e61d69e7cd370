"""Time as an object: the Kubernetes parts read clocks and sleep only through this."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for deadlines, wall time for Lease timestamps, and sleeping."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back."""
        return time.monotonic()

    def now(self) -> datetime:
        """Aware UTC wall time."""
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        """Sleep on the event loop."""
        await asyncio.sleep(seconds)


def micro_time(moment: datetime) -> str:
    """Format a Lease MicroTime (RFC 3339 with microseconds, UTC, 'Z')."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime | None:
    """Parse an RFC 3339 time as the API returns it; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
