"""Exporter-side batch latency histograms for engines that expose only a gauge or two counters."""

from __future__ import annotations

import math

from exporter.engines.reading import Histogram

# Seconds; covers decode steps (ms) to long prefill batches.
BOUNDS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class DerivedHistogram:
    """Observes (value, weight) pairs into fixed buckets; cumulative like any Prometheus histogram."""

    def __init__(self) -> None:
        self._counts = [0.0] * (len(BOUNDS) + 1)
        self._sum = 0.0
        self._last_counters: tuple[float, float] | None = None

    def observe(self, seconds: float, weight: float = 1.0) -> None:
        """Add weight observations of seconds."""
        if math.isnan(seconds) or weight <= 0:
            return
        i = next((k for k, b in enumerate(BOUNDS) if seconds <= b), len(BOUNDS))
        self._counts[i] += weight
        self._sum += seconds * weight

    def observe_counters(self, busy_seconds: float, batches: float) -> None:
        """Observe the mean of the increase since the last call; a decrease (restart) re-baselines."""
        last, self._last_counters = self._last_counters, (busy_seconds, batches)
        if last is None:
            return
        d_busy, d_batches = busy_seconds - last[0], batches - last[1]
        if d_busy < 0 or d_batches <= 0:
            return
        self.observe(d_busy / d_batches, d_batches)

    def snapshot(self) -> Histogram:
        """Cumulative buckets ending in +Inf."""
        cumulative: list[tuple[float, float]] = []
        running = 0.0
        for bound, count in zip((*BOUNDS, math.inf), self._counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return Histogram(tuple(cumulative), self._sum, running)
