"""Piecewise-linear curves over scenario time, held constant outside their points."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


class Curve:
    """A number, or [t, value] points linearly interpolated; O(log n) value and integral."""

    __slots__ = ("_cum", "_ts", "_vs", "const")

    def __init__(self, points: Sequence[tuple[float, float]]) -> None:
        if not points:
            raise ValueError("a curve needs at least one point")
        self._ts = [float(t) for t, _ in points]
        self._vs = [float(v) for _, v in points]
        # `const` is the fast path: most scenario curves are a single number
        self.const: float | None = self._vs[0] if len(self._vs) == 1 else None
        cum = [0.0]
        for i in range(1, len(self._ts)):
            cum.append(cum[-1] + (self._ts[i] - self._ts[i - 1]) * (self._vs[i] + self._vs[i - 1]) / 2.0)
        self._cum = cum

    @classmethod
    def constant(cls, value: float) -> Curve:
        """A curve that is `value` at every time."""
        return cls([(0.0, value)])

    @property
    def points(self) -> list[tuple[float, float]]:
        """The defining points."""
        return list(zip(self._ts, self._vs, strict=True))

    def at(self, t: float) -> float:
        """Value at scenario time `t`."""
        if self.const is not None:
            return self.const
        ts = self._ts
        i = bisect_right(ts, t)
        if i == 0:
            return self._vs[0]
        if i == len(ts):
            return self._vs[-1]
        t0, t1 = ts[i - 1], ts[i]
        v0, v1 = self._vs[i - 1], self._vs[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def _primitive(self, t: float) -> float:
        ts, vs = self._ts, self._vs
        if t <= ts[0]:
            return (t - ts[0]) * vs[0]
        if t >= ts[-1]:
            return self._cum[-1] + (t - ts[-1]) * vs[-1]
        i = bisect_right(ts, t)
        return self._cum[i - 1] + (t - ts[i - 1]) * (vs[i - 1] + self.at(t)) / 2.0

    def integral(self, t0: float, t1: float) -> float:
        """Integral of the curve over [t0, t1] (value x seconds)."""
        if self.const is not None:
            return self.const * (t1 - t0)
        return self._primitive(t1) - self._primitive(t0)

    def mean(self, t0: float, t1: float) -> float:
        """Average value over [t0, t1]; the value at t0 when the interval is empty."""
        if t1 <= t0:
            return self.at(t0)
        return self.integral(t0, t1) / (t1 - t0)

    def affine(self, offset: float, scale: float) -> Curve:
        """A new curve `offset + scale * self`, same breakpoints."""
        return Curve([(t, offset + scale * v) for t, v in zip(self._ts, self._vs, strict=True)])

    def clipped(self, low: float, high: float) -> Curve:
        """A new curve with every point clamped into [low, high]."""
        return Curve([(t, min(high, max(low, v))) for t, v in zip(self._ts, self._vs, strict=True)])

    def __repr__(self) -> str:
        if self.const is not None:
            return f"Curve({self.const})"
        return f"Curve({self.points})"
