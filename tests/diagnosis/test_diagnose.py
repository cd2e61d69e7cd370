"""The diagnosis step around Prometheus: no Prometheus, an unreachable, hung, failing or lying one,
missing signals, and how the incident's GPUs are found (the ranking itself is in test_rank.py; the
stories on a real Prometheus in test_replays.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from remediation.diagnosis.diagnose import Diagnoser, DiagnosisSettings
from remediation.diagnosis.prom import PrometheusError, PrometheusRangeClient, RangeSeries, parse_matrix
from remediation.diagnosis.types import NO_PROMETHEUS, PROMETHEUS_UNAVAILABLE, SIGNALS_MISSING
from tests.fakes.clock import FakeClock
from tests.fakes.prometheus_process import free_port

NOW = 1_780_000_000.0
LABELS = {
    "alertname": "InferenceLatencyP99Spike",
    "namespace": "team-a",
    "pod": "llm-0",
    "model": "llama",
    "node": "node-1",
    "fault_class": "serving_latency",
}


class FakeRange:
    """A RangeClient answering by the first key found in the query; records every query."""

    def __init__(self, answers: dict[str, Callable[[float, float, float], list[RangeSeries]]]) -> None:
        self.answers = answers
        self.queries: list[str] = []

    async def query_range(
        self, query: str, start: float, end: float, step_seconds: float
    ) -> list[RangeSeries]:
        self.queries.append(query)
        for key, fn in self.answers.items():
            if key in query:
                return fn(start, end, step_seconds)
        return []


def _diagnoser(client: Any, **settings: Any) -> Diagnoser:
    return Diagnoser(client, DiagnosisSettings(**settings), FakeClock(start=NOW))


async def test_without_prometheus_the_incident_says_no_diagnosis_and_why() -> None:
    d = await _diagnoser(None).diagnose(LABELS, NOW - 60)
    assert d.status == "no_diagnosis" and d.reason_code == NO_PROMETHEUS
    assert "no Prometheus is configured" in d.headline


async def test_an_unreachable_prometheus_is_no_diagnosis_with_the_error() -> None:
    client = PrometheusRangeClient(f"http://127.0.0.1:{free_port()}", timeout_seconds=2)
    d = await _diagnoser(client).diagnose(LABELS, NOW - 60)
    assert d.reason_code == PROMETHEUS_UNAVAILABLE and "could not be read" in d.reason


@pytest.fixture
async def server() -> AsyncIterator[Callable[[web.Application], Any]]:
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for r in runners:
        await r.cleanup()


async def test_a_hung_prometheus_is_cut_off_by_the_deadline(server: Any) -> None:
    never = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await never.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/api/v1/query_range", hang)
    url = await server(app)
    client = PrometheusRangeClient(url, timeout_seconds=30)
    d = await asyncio.wait_for(_diagnoser(client, deadline_seconds=0.5).diagnose(LABELS, NOW - 60), 10)
    never.set()  # let the server's handler finish so its shutdown does not wait
    assert d.reason_code == PROMETHEUS_UNAVAILABLE and "deadline of 0.5 s" in d.reason


@pytest.mark.parametrize(
    ("status", "body", "words"),
    [
        (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}, "parse error"),
        (503, {"status": "error", "errorType": "unavailable", "error": "shutting down"}, "503"),
        (200, "<html>not prometheus</html>", "without JSON (is this Prometheus?)"),
        (200, [1, 2], "non-object"),
        (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, "no matrix"),
    ],
)
async def test_failing_or_lying_prometheus_answers_are_no_diagnosis(
    server: Any, status: int, body: Any, words: str
) -> None:
    async def answer(request: web.Request) -> web.Response:
        if isinstance(body, str):
            return web.Response(text=body, status=status, content_type="text/html")
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/api/v1/query_range", answer)
    url = await server(app)
    d = await _diagnoser(PrometheusRangeClient(url, timeout_seconds=2)).diagnose(LABELS, NOW - 60)
    assert d.reason_code == PROMETHEUS_UNAVAILABLE and words in d.reason


def test_parse_matrix_drops_nan_and_rejects_malformed_results() -> None:
    data = {
        "resultType": "matrix",
        "result": [{"metric": {"a": "b"}, "values": [[1, "1"], [2, "NaN"], [3, "+Inf"]]}],
    }
    (s,) = parse_matrix(data)
    assert s.labels == {"a": "b"} and list(s.points) == [(1.0, 1.0)]
    with pytest.raises(PrometheusError):
        parse_matrix({"resultType": "matrix", "result": [{"values": [[1, "x"]]}]})
    with pytest.raises(PrometheusError):
        parse_matrix({"resultType": "matrix", "result": [{"values": 5}]})


async def test_a_prometheus_with_none_of_the_signals_is_signals_missing() -> None:
    client = FakeRange({})
    d = await _diagnoser(client).diagnose(LABELS, NOW - 60)
    assert d.status == "no_diagnosis" and d.reason_code == SIGNALS_MISSING
    assert any(m.startswith("page_cache_residency: no data") for m in d.missing)
    # without GPUs found for the pod, GPU signals are not even asked for, and that is said
    assert any(m.startswith("thermal_clock_event: no uuids known") for m in d.missing)
    assert not any("gpu_temperature_celsius" in q for q in client.queries)


def _const(
    value: float, labels: dict[str, str] | None = None
) -> Callable[[float, float, float], list[RangeSeries]]:
    def fn(start: float, end: float, step: float) -> list[RangeSeries]:
        n = int((end - start) / step) + 1
        return [RangeSeries(labels or {}, [(start + i * step, value) for i in range(n)])]

    return fn


async def test_the_pods_gpus_are_found_from_the_engine_info_and_label_values_are_escaped() -> None:
    hostile = {**LABELS, "pod": 'llm-0"} or vector(1) #', "node": ""}
    client = FakeRange(
        {
            "inference_engine_gpu_info": _const(1, {"uuid": "GPU-a.b", "node": "node-9"}),
            "gpu_temperature_celsius": _const(60.0),
        }
    )
    d = await _diagnoser(client).diagnose(hostile, NOW - 60)
    temps = [q for q in client.queries if "gpu_temperature_celsius" in q]
    assert temps == ['max(gpu_temperature_celsius{uuid=~"GPU-a\\\\.b"})']
    assert any('pod="llm-0\\"} or vector(1) #"' in q for q in client.queries)
    assert any('node="node-9"' in q for q in client.queries)  # the node came from the info series
    assert d.status == "no_diagnosis"  # a flat temperature explains nothing


async def test_a_gpu_alert_is_diagnosed_for_the_pod_running_there() -> None:
    labels = {"alertname": "GPUThermalThrottling", "uuid": "GPU-1", "gpu": "0", "node": "node-1"}
    client = FakeRange(
        {"gpu_allocation_info": _const(1, {"namespace": "team-b", "pod": "b-0", "node": "node-1"})}
    )
    await _diagnoser(client).diagnose(labels, NOW - 60)
    assert any('namespace="team-b",pod="b-0"' in q for q in client.queries)
