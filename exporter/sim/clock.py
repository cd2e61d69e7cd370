"""Scenario clocks: seconds since scenario start, manual (tests) or real (the --simulate exporter)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything that says how many scenario seconds have passed."""

    def now(self) -> float:
        """Seconds since scenario start."""
        ...


class ManualClock:
    """A clock that only moves when told to; moving it wakes every blocked simulated call."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> float:
        """Seconds since scenario start."""
        return self._now

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


class RealClock:
    """Monotonic time since creation, multiplied by `speed` (2.0 plays a scenario twice as fast)."""

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"RealClock speed must be > 0, got {speed}")
        self.speed = float(speed)
        self._start = time.monotonic()

    def now(self) -> float:
        """Seconds since scenario start."""
        return (time.monotonic() - self._start) * self.speed
