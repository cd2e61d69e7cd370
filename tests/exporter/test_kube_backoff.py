"""The reflector's back-off ladder (exporter/kube/backoff.py) on its own: doubling, cap, jitter on top
of the cap, reset only by time, Retry-After within the cap."""

from __future__ import annotations

import itertools

from exporter.kube.backoff import Backoff


def ladder(jitter: float = 0.0, draws: float = 0.0) -> Backoff:
    return Backoff(0.8, 30.0, 120.0, jitter, random=lambda: draws)


def test_waits_double_from_800_ms_to_the_cap_and_stay_there() -> None:
    b = ladder()
    delays = [b.next_delay(now) for now in range(8)]  # one second apart: no reset
    assert delays == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]


def test_the_jitter_stretches_each_wait_even_at_the_cap() -> None:
    b = ladder(jitter=1.0, draws=0.999)
    delays = [b.next_delay(now) for now in range(8)]
    assert delays[0] == 0.8 * 1.999 and 30.0 < delays[-1] < 60.0  # spread over [cap, 2 x cap)


def test_only_a_wait_that_began_long_enough_ago_resets_the_ladder() -> None:
    b = ladder()
    clock = itertools.count(0.0, 10.0)  # failures 10 s apart never reset it
    assert [b.next_delay(next(clock)) for _ in range(4)] == [0.8, 1.6, 3.2, 6.4]
    assert b.next_delay(30.0 + 120.0) == 12.8  # exactly the reset time since the last wait: not yet
    assert b.next_delay(150.0 + 120.5) == 0.8  # past it (a watch that ran over 2 minutes)


def test_a_retry_after_is_honoured_up_to_the_cap_and_does_not_skip_a_rung() -> None:
    b = ladder()
    assert b.next_delay(0.0, at_least_seconds=7.0) == 7.0
    assert b.next_delay(1.0, at_least_seconds=3600.0) == 30.0  # an hour's Retry-After, capped
    assert b.next_delay(2.0) == 3.2  # the ladder went on underneath
