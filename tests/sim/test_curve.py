"""Curves: interpolation, holding and integrals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.sim.curve import Curve


def test_interpolates_and_holds() -> None:
    c = Curve([(10, 0.0), (20, 1.0)])
    assert c.at(0) == 0.0
    assert c.at(15) == pytest.approx(0.5)
    assert c.at(100) == 1.0


def test_equal_times_make_a_step() -> None:
    c = Curve([(0, 0.0), (5, 0.0), (5, 1.0)])
    assert c.at(4.999) == 0.0
    assert c.at(5) == 1.0


def test_integral_and_mean() -> None:
    c = Curve([(0, 0.0), (10, 10.0)])
    assert c.integral(0, 10) == pytest.approx(50.0)
    assert c.integral(10, 20) == pytest.approx(100.0)
    assert c.mean(0, 10) == pytest.approx(5.0)
    assert Curve.constant(3.0).integral(2, 4) == 6.0


@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 10)), min_size=1, max_size=8),
    st.floats(0, 120),
    st.floats(0, 120),
)
def test_integral_is_additive(points: list[tuple[float, float]], a: float, b: float) -> None:
    c = Curve(sorted(points, key=lambda p: p[0]))
    lo, hi = min(a, b), max(a, b)
    mid = (lo + hi) / 2
    assert c.integral(lo, hi) == pytest.approx(c.integral(lo, mid) + c.integral(mid, hi), abs=1e-6)
    assert c.integral(lo, hi) >= -1e-9
