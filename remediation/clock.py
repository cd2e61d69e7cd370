"""Time as an object passed in, so ladders, cooldowns and loop windows are tested without sleeping."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """Wall-clock time source; the engine never reads time any other way."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def utcnow(self) -> datetime:
        """The same instant as an aware UTC datetime."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def utcnow(self) -> datetime:
        """Aware UTC datetime of now()."""
        return datetime.fromtimestamp(self.now(), tz=UTC)
