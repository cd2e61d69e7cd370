"""Scenario clocks: seconds since scenario start, manual (tests) or real (the --simulate exporter).

Both implement gpupulse.clock.Clock: `monotonic()` is scenario time (its origin is the scenario's
start), `time()` is the wall time the scenario started at plus scenario time, `sleep()` waits for
scenario time to pass.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from gpupulse.clock import Clock


class ManualClock(Clock):
    """A clock that only moves when told to; moving it wakes every blocked simulated call and sleeper."""

    def __init__(self, start: float = 0.0, start_unix: float | None = None) -> None:
        self._now = float(start)
        # wall time at scenario time `start` (default: when the clock was made)
        self._start_unix = time.time() if start_unix is None else float(start_unix)
        self._start = self._now
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def monotonic(self) -> float:
        """Seconds since scenario start."""
        return self._now

    def time(self) -> float:
        """Unix seconds: the wall time at `start` plus the scenario time passed since."""
        return self._start_unix + (self._now - self._start)

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has been moved `seconds` forward (at once for seconds <= 0)."""
        target = self._now + seconds
        loop = asyncio.get_running_loop()
        moved = asyncio.Event()

        def wake() -> None:  # advance() may run on any thread
            loop.call_soon_threadsafe(moved.set)

        self.add_listener(wake)
        try:
            while True:
                moved.clear()
                if self._now >= target:
                    break
                await moved.wait()
        finally:
            self.remove_listener(wake)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (must be >= 0) and wake waiters; returns the new time."""
        if seconds < 0:
            raise ValueError(f"ManualClock cannot go backwards (advance by {seconds})")
        with self._lock:
            self._now += seconds
            now = self._now
        self._notify()
        return now

    def set(self, t: float) -> None:
        """Jump to scenario time `t` (not before the current time) and wake waiters."""
        with self._lock:
            if t < self._now:
                raise ValueError(f"ManualClock cannot go backwards ({self._now} -> {t})")
            self._now = float(t)
        self._notify()

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback` (without arguments) after every move."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        """Stop calling `callback`; unknown callbacks are ignored."""
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            callback()


class RealClock(Clock):
    """Monotonic time since creation, multiplied by `speed` (2.0 plays a scenario twice as fast)."""

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"RealClock speed must be > 0, got {speed}")
        self.speed = float(speed)
        self._start = time.monotonic()
        self._start_unix = time.time()

    def monotonic(self) -> float:
        """Seconds since scenario start."""
        return (time.monotonic() - self._start) * self.speed

    def time(self) -> float:
        """Unix seconds: the wall time at creation plus the scenario time passed since."""
        return self._start_unix + self.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Wait until `seconds` of scenario time have passed (seconds / speed of real time)."""
        await asyncio.sleep(max(seconds, 0.0) / self.speed)
