"""The reflector's wait after a failed, expired or short watch: client-go's exponential back-off manager
(k8s.io/apimachinery wait.NewExponentialBackoffManager as client-go's reflector makes it).

The first wait is initial_seconds, each next one twice the last up to max_seconds, and each is
stretched by a random share of up to jitter_ratio (client-go: 800 ms, 30 s, ratio 1.0, so a fleet that
lost its API server at one instant comes back spread over [d, 2d)). Only time resets the ladder: when
the last wait began more than reset_after_seconds ago (client-go: 2 min), as after a watch that ran
that long. A watch that ends at once without news never resets it, so a server that answers 200 and
closes every watch sees requests thin out to one per 30-60 s instead of thousands per second.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable


class Backoff:
    """Waits that double after every failure, jittered, until a quiet spell resets them."""

    def __init__(
        self,
        initial_seconds: float,
        max_seconds: float,
        reset_after_seconds: float,
        jitter_ratio: float,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self._initial, self._max = initial_seconds, max_seconds
        self._reset_after, self._jitter = reset_after_seconds, jitter_ratio
        self._random = random
        self._next = initial_seconds
        self._last_start: float | None = None

    def next_delay(self, now: float, at_least_seconds: float = 0.0) -> float:
        """The wait that starts at monotonic time `now`, at least `at_least_seconds` (a Retry-After,
        itself capped at max_seconds so one answer cannot park the reflector for an hour)."""
        if self._last_start is None or now - self._last_start > self._reset_after:
            self._next = self._initial
        self._last_start = now
        base = self._next
        self._next = min(base * 2, self._max)
        # the jitter goes on top of the capped base, as client-go's: at the cap the waits still spread
        delay = base * (1 + self._jitter * self._random())
        return max(delay, min(at_least_seconds, self._max))
