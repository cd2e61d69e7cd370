"""Exporter-side batch latency histograms: fixed bounds, inclusive edges, weights, counter increases."""

from __future__ import annotations

import math

import pytest

from exporter.engines.derived import BOUNDS, DerivedHistogram


def counts(h: DerivedHistogram) -> dict[float, float]:
    """Non-cumulative count per upper bound."""
    snap = h.snapshot()
    out, before = {}, 0.0
    for bound, cumulative in snap.buckets:
        out[bound] = cumulative - before
        before = cumulative
    return out


def test_bucket_bounds_are_pinned() -> None:
    # Dashboards and recorded quantiles are read against these: changing them is a breaking change.
    assert BOUNDS == (
        0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
        0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    )  # fmt: skip
    assert DerivedHistogram().snapshot().buckets[-1] == (math.inf, 0.0)


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    h = DerivedHistogram()
    h.observe(0.025)  # le="0.025" is inclusive, as in Prometheus
    h.observe(0.0250001)
    c = counts(h)
    assert c[0.025] == 1.0 and c[0.03] == 1.0
    h.observe(10.0)
    h.observe(10.5)
    assert counts(h)[10.0] == 1.0 and counts(h)[math.inf] == 1.0


def test_weights_count_and_sum_as_that_many_observations() -> None:
    h = DerivedHistogram()
    h.observe(0.02, weight=3.0)
    h.observe(0.2)
    snap = h.snapshot()
    assert snap.count == 4.0
    assert snap.sum == pytest.approx(3 * 0.02 + 0.2)
    assert counts(h)[0.02] == 3.0


# a zero weight matters with an infinite mean (a busy time over no steps): inf x 0 would make the sum NaN
@pytest.mark.parametrize(("seconds", "weight"), [(math.nan, 1.0), (math.inf, 0.0), (0.02, -1.0)])
def test_nan_and_non_positive_weights_are_ignored(seconds: float, weight: float) -> None:
    h = DerivedHistogram()
    h.observe(seconds, weight)
    assert h.snapshot().count == 0.0 and h.snapshot().sum == 0.0


def test_counter_pairs_observe_the_mean_of_each_increase_weighted_by_steps() -> None:
    h = DerivedHistogram()
    h.observe_counters(100.0, 4000.0)  # the first pair is only a baseline
    assert h.snapshot().count == 0.0
    h.observe_counters(100.0 + 20 * 0.025, 4000.0 + 20)  # 20 steps of 25 ms
    snap = h.snapshot()
    assert snap.count == 20.0
    assert snap.sum == pytest.approx(0.5)
    assert counts(h)[0.025] == 20.0
    h.observe_counters(100.5, 4020.0)  # no new step: nothing observed
    assert h.snapshot().count == 20.0


def test_a_counter_reset_rebaselines_instead_of_observing_a_negative_mean() -> None:
    h = DerivedHistogram()
    h.observe_counters(100.0, 4000.0)
    h.observe_counters(1.0, 10.0)  # the engine restarted
    assert h.snapshot().count == 0.0
    h.observe_counters(1.0 + 10 * 0.1, 20.0)
    assert h.snapshot().count == 10.0 and counts(h)[0.1] == 10.0
    h.observe_counters(0.5, 30.0)  # busy seconds went back while steps went on: not a mean to trust
    assert h.snapshot().count == 10.0


def test_the_edges_of_an_increase_one_step_zero_busy_time_and_a_small_busy_decrease() -> None:
    h = DerivedHistogram()
    h.observe_counters(10.0, 100.0)
    h.observe_counters(10.02, 101.0)  # exactly one step of 20 ms is one observation
    assert h.snapshot().count == 1.0 and counts(h)[0.02] == 1.0
    # steps with no busy time measured (a coarse busy counter): observed as that many fast steps
    h.observe_counters(10.02, 104.0)
    assert h.snapshot().count == 4.0 and counts(h)[0.001] == 3.0
    # busy seconds went back by less than a second (a restart caught early): re-baselined, not observed
    h.observe_counters(9.52, 110.0)
    assert h.snapshot().count == 4.0
