"""The clock attribution reads, passed in so staleness rules are tested without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class SystemClock:
    """The real monotonic clock."""

    def monotonic(self) -> float:
        """Seconds since an arbitrary point, never going backwards."""
        return time.monotonic()
