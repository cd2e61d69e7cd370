"""Prometheus range queries for the diagnosis, each under its own deadline (the approach of
remediation/verify.py: aiohttp, one clear error type for every way Prometheus cannot answer)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp

# Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS = 11_000


class PrometheusError(Exception):
    """Prometheus could not answer: unreachable, too slow, an error status, or not its API's JSON."""


@dataclass(frozen=True)
class RangeSeries:
    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]]  # time order; NaN and infinite samples left out


class RangeClient(Protocol):
    """What the diagnosis needs from Prometheus (tests pass a fake with the same semantics)."""

    async def query_range(
        self, query: str, start: float, end: float, step_seconds: float
    ) -> list[RangeSeries]: ...


class PrometheusRangeClient:
    """GET <prometheus>/api/v1/query_range with a total deadline per query."""

    def __init__(self, base_url: str, timeout_seconds: float = 5.0, bearer_token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.headers = {"Accept": "application/json"}
        if bearer_token:
            self.headers["Authorization"] = f"Bearer {bearer_token}"

    async def query_range(
        self, query: str, start: float, end: float, step_seconds: float
    ) -> list[RangeSeries]:
        """Every series of `query` over [start, end] at `step_seconds`."""
        if step_seconds <= 0 or end < start:
            raise ValueError(f"bad range: start {start}, end {end}, step {step_seconds}")
        if (end - start) / step_seconds + 1 > MAX_POINTS:
            raise ValueError(f"{(end - start) / step_seconds:.0f} points exceed Prometheus' {MAX_POINTS}")
        params = {"query": query, "start": _ts(start), "end": _ts(end), "step": _ts(step_seconds)}
        try:
            async with (
                aiohttp.ClientSession(timeout=self.timeout, headers=self.headers) as session,
                session.get(f"{self.base_url}/api/v1/query_range", params=params) as resp,
            ):
                status = resp.status
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    raise PrometheusError(
                        f"{self.base_url} answered {status} without JSON (is this Prometheus?)"
                    ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PrometheusError(f"prometheus query failed: {exc or type(exc).__name__}") from exc
        if not isinstance(body, dict):
            raise PrometheusError(f"prometheus answered {status} with a non-object body")
        if status != 200 or body.get("status") != "success":
            raise PrometheusError(f"prometheus answered {status}: {body.get('error', '')}")
        return parse_matrix(body.get("data"))


def parse_matrix(data: object) -> list[RangeSeries]:
    """The series of a range query's `data`; PrometheusError when it is not a matrix."""
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise PrometheusError("a range query answered no matrix")
    out: list[RangeSeries] = []
    try:
        for item in data.get("result") or []:
            labels = {str(k): str(v) for k, v in dict(item.get("metric") or {}).items()}
            points = []
            for ts, raw in item.get("values") or []:
                value = float(raw)
                if math.isfinite(value):
                    points.append((float(ts), value))
            out.append(RangeSeries(labels, points))
    except (AttributeError, TypeError, ValueError) as exc:
        raise PrometheusError(f"malformed range result: {exc!r}") from exc
    return out


def _ts(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".")
