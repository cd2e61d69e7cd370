"""Fake progress sources for a drain that waits for a training job's next step (remediation/drain.py)."""

from __future__ import annotations

from remediation.drain import ProgressUnavailable
from remediation.model import Target
from tests.fakes.clock import FakeClock


class LandsAt:
    """A job whose last step was long ago and whose next one lands at `at` (None: never)."""

    def __init__(self, clock: FakeClock, at: float | None, before: float) -> None:
        self.clock, self.at, self.before = clock, at, before
        self.reads = 0

    async def last_progress_at(self, target: Target) -> float | None:
        self.reads += 1
        if self.at is not None and self.clock.time() >= self.at:
            return self.at
        return self.before


class Unreachable:
    """A progress source that cannot be reached (Prometheus down)."""

    async def last_progress_at(self, target: Target) -> float | None:
        raise ProgressUnavailable("connection refused")
