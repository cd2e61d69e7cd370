"""A small Prometheus HTTP API client for the report: range queries, split to stay under the server's
point limit, and the scrape interval of the targets behind a metric, with every failure turned into one
`PrometheusUnavailable` that says what went wrong."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import yaml

from gpupulse.durations import DurationError, parse_duration

# Prometheus refuses a range query of more than 11,000 points per series; stay well below it.
MAX_POINTS_PER_QUERY = 10_000


class PrometheusUnavailable(Exception):
    """Prometheus could not be reached, answered with an error, or answered something that is not
    its API's JSON."""


class PrometheusAPIMissing(PrometheusUnavailable):
    """The server has no such API path (HTTP 404): a query frontend (Thanos, Mimir) rather than a
    Prometheus, which has its targets and configuration."""


@dataclass(frozen=True)
class ScrapeInterval:
    seconds: float
    # where it was read, for the message that quotes it
    source: str


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    # (Unix seconds, value) in time order; NaN and infinite samples are left out
    points: list[tuple[float, float]]


class PrometheusClient:
    def __init__(self, base_url: str, timeout_seconds: float = 30.0, bearer_token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.bearer_token = bearer_token

    def _get(self, path: str, params: dict[str, str]) -> object:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.bearer_token:
            request.add_header("Authorization", f"Bearer {self.bearer_token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            # Prometheus answers 400/422/503 with a JSON error body: show its words, not just the code
            detail = _error_text(exc.read())
            if exc.code == 404:
                raise PrometheusAPIMissing(f"{self.base_url}{path} answered HTTP 404: {detail}") from None
            raise PrometheusUnavailable(f"{self.base_url} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusUnavailable(f"cannot reach Prometheus at {self.base_url}: {reason}") from None
        try:
            answer = json.loads(body)
        except ValueError:
            raise PrometheusUnavailable(
                f"{self.base_url}{path} did not answer JSON (is this Prometheus?)"
            ) from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise PrometheusUnavailable(f"{self.base_url}{path}: {_error_text(body)}")
        return answer.get("data")

    def query_range(self, promql: str, start: float, end: float, step_seconds: float) -> list[Series]:
        """Every series of `promql` evaluated at start, start+step, ... end, merged across the chunks
        the range is split into."""
        merged: dict[tuple[tuple[str, str], ...], Series] = {}
        for chunk_start, chunk_end in _chunks(start, end, step_seconds):
            data = self._get(
                "/api/v1/query_range",
                {
                    "query": promql,
                    "start": _ts(chunk_start),
                    "end": _ts(chunk_end),
                    "step": _ts(step_seconds),
                },
            )
            if not isinstance(data, dict) or data.get("resultType") != "matrix":
                raise PrometheusUnavailable(f"a range query answered no matrix for {promql!r}")
            for item in data.get("result", []):
                labels = {str(k): str(v) for k, v in dict(item.get("metric", {})).items()}
                key = tuple(sorted(labels.items()))
                series = merged.setdefault(key, Series(labels=labels, points=[]))
                for ts, raw in item.get("values", []):
                    value = float(raw)
                    if math.isfinite(value):
                        series.points.append((float(ts), value))
        return list(merged.values())

    def scrape_interval(self, metric: str) -> ScrapeInterval | None:
        """The longest scrape interval of the active targets whose job exports `metric` now (of every
        active target when none does), else Prometheus' global `scrape_interval`; None where the server
        has neither API (a query frontend)."""
        try:
            found = self._get("/api/v1/query", {"query": f"group by (job) ({metric})"})
            result = found.get("result", []) if isinstance(found, dict) else []
            jobs = {str(item.get("metric", {}).get("job", "")) for item in result if isinstance(item, dict)}
            targets = self._get("/api/v1/targets", {"state": "active"})
            active = targets.get("activeTargets", []) if isinstance(targets, dict) else []
            intervals: dict[str, float] = {}
            for target in active:
                # a Prometheus older than 2.37 lists no scrapeInterval: such a target says nothing
                seconds = _duration(target.get("scrapeInterval")) if isinstance(target, dict) else None
                if seconds is not None:
                    job = str(target.get("labels", {}).get("job", ""))
                    intervals[job] = max(seconds, intervals.get(job, 0.0))
            chosen = {job: s for job, s in intervals.items() if job in jobs} or intervals
            if chosen:
                job = max(chosen, key=lambda j: (chosen[j], j))
                return ScrapeInterval(chosen[job], f"the scrape interval of job {job!r} on {self.base_url}")
            config = self._get("/api/v1/status/config", {})
        except PrometheusAPIMissing:
            return None
        text = config.get("yaml") if isinstance(config, dict) else None
        try:
            parsed = yaml.safe_load(text) if isinstance(text, str) else None
        except yaml.YAMLError:
            parsed = None
        section = parsed.get("global") if isinstance(parsed, dict) else None
        # Prometheus' own default where its configuration names none
        seconds = _duration(section.get("scrape_interval", "1m") if isinstance(section, dict) else "1m")
        if seconds is None:
            raise PrometheusUnavailable(f"{self.base_url}/api/v1/status/config: no readable scrape_interval")
        return ScrapeInterval(seconds, f"the global scrape_interval of {self.base_url}")


def _duration(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        seconds = parse_duration(text)
    except DurationError:
        return None
    return seconds if seconds > 0 else None


def _chunks(start: float, end: float, step_seconds: float) -> Iterator[tuple[float, float]]:
    span = step_seconds * (MAX_POINTS_PER_QUERY - 1)
    chunk_start = start
    while chunk_start <= end:
        chunk_end = min(end, chunk_start + span)
        yield chunk_start, chunk_end
        chunk_start = chunk_end + step_seconds


def _ts(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def _error_text(body: bytes) -> str:
    try:
        answer = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "no body"
    if isinstance(answer, dict):
        return f"{answer.get('errorType', 'error')}: {answer.get('error', answer)}"
    return str(answer)[:200]
