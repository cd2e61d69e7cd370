"""Verification by PromQL (optional): a resolved alert only counts once the health query holds."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from remediation.errors import VerifyError
from remediation.signatures import SignatureLibrary, load_library, parse_document
from remediation.verify import PromQLVerifier, render_query
from tests.remediation.test_engine_support import LEAK, Rig, engine_settings, events

VERIFIED_LEAK = """
signatures:
  - name: leak-verified
    fault_class: memory_leak
    priority: 100
    match: {labels: {fault_class: memory_leak}}
    ladder: {rungs: [restart, migrate, page], verify_window_seconds: 300, cooldown_seconds: 600}
    restart_fixes: true
    reason: test
    verify_promql: 'max(gpu_memory_used_bytes{uuid="{uuid}"}) < bool 1e10'
"""


class FakePrometheus:
    def __init__(self) -> None:
        self.queries: list[str] = []
        self.value = "0"
        self.status = 200
        self.data: Any = None  # when set, the whole `data` object of the answer
        self.body: Any = None  # when set, the whole answer (with self.status), however odd
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _query(self, request: web.Request) -> web.Response:
        self.queries.append(request.query["query"])
        if self.body is not None:
            return web.json_response(self.body, status=self.status)
        if self.status != 200:
            return web.json_response({"status": "error", "error": "bad"}, status=self.status)
        data = self.data or {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, self.value]}]}
        body: dict[str, Any] = {"status": "success", "data": data}
        return web.json_response(body)


@pytest.fixture
async def prom() -> AsyncIterator[FakePrometheus]:
    p = FakePrometheus()
    await p.start()
    yield p
    await p.stop()


def test_render_query_escapes_label_values() -> None:
    q = render_query('up{pod="{pod}", uuid="{uuid}"}', {"pod": 'a"}) or vector(1) #', "uuid": "GPU-1"})
    assert q == 'up{pod="a\\"}) or vector(1) #", uuid="GPU-1"}'


async def test_verifier_reads_vector_results(prom: FakePrometheus) -> None:
    v = PromQLVerifier(prom.url)
    prom.value = "1"
    assert await v.healthy("x") is True
    prom.value = "0"
    assert await v.healthy("x") is False
    prom.status = 400
    with pytest.raises(VerifyError):
        await v.healthy("x")


async def test_resolved_alert_counts_only_when_promql_holds(tmp_path: Path, prom: FakePrometheus) -> None:
    rig = Rig(tmp_path, engine_settings(prometheus_url=prom.url, promql_recheck_seconds=15))
    rig.library = SignatureLibrary([*load_library(), *parse_document(VERIFIED_LEAK, "t.yaml", "user")])
    rig.build()
    try:
        ev = await rig.fire(LEAK)
        assert rig.backend.rungs == ["restart"]
        prom.value = "0"  # memory still high although the alert resolved (e.g. a `for:` gap)
        await rig.resolve(ev)
        assert prom.queries == ['max(gpu_memory_used_bytes{uuid="GPU-aaaa"}) < bool 1e10']
        assert rig.only_incident()["state"] == "verifying"
        prom.value = "1"
        await rig.advance(16)
        inc = rig.only_incident()
        assert inc["state"] == "cooldown"
        assert events(inc).count("promql") == 2
        await rig.advance(601)
        assert rig.only_incident()["resolution"] == "automated"
    finally:
        await rig.engine.aclose()


async def test_promql_never_healthy_escalates_after_window(tmp_path: Path, prom: FakePrometheus) -> None:
    rig = Rig(tmp_path, engine_settings(prometheus_url=prom.url))
    rig.library = SignatureLibrary([*load_library(), *parse_document(VERIFIED_LEAK, "t.yaml", "user")])
    rig.build()
    try:
        ev = await rig.fire(LEAK)
        await rig.resolve(ev)
        await rig.advance(301)
        assert rig.backend.rungs == ["restart", "migrate"]
    finally:
        await rig.engine.aclose()


@pytest.mark.parametrize(
    ("data", "healthy"),
    [
        ({"resultType": "vector", "result": []}, False),  # nothing found must never count as healthy
        ({"resultType": "scalar", "result": [1.0, "1"]}, True),
        ({"resultType": "scalar", "result": [1.0, "0"]}, False),
        ({"resultType": "scalar", "result": [1.0, "-1"]}, True),  # nonzero is healthy, as PromQL's bool
        ({"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "NaN"]}]}, False),
        (
            {
                "resultType": "vector",
                "result": [
                    {"metric": {"a": "1"}, "value": [1, "1"]},
                    {"metric": {"a": "2"}, "value": [1, "0"]},
                ],
            },
            False,  # every series must hold
        ),
    ],
    ids=["empty", "scalar-1", "scalar-0", "scalar-negative", "nan", "one-of-two"],
)
async def test_the_verdict_of_each_result_shape(prom: FakePrometheus, data: Any, healthy: bool) -> None:
    prom.data = data
    assert await PromQLVerifier(prom.url).healthy("q") is healthy


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"resultType": "matrix", "result": []}, "must give a vector or a scalar, not 'matrix'"),
        ({"resultType": "matrix", "result": [{"values": []}, {"values": []}]}, "not 'matrix'"),
        ({"resultType": "string", "result": [1.0, "1"]}, "not 'string'"),
        ({"resultType": "vector", "result": [{"metric": {}}]}, "malformed query result"),
        ({"resultType": "vector", "result": [{"metric": {}, "value": [1, "abc"]}]}, "non-numeric sample"),
        ("x", "malformed query result: no data object"),
    ],
    ids=["range", "range-two-series", "string", "no-value", "not-a-number", "not-an-object"],
)
async def test_results_that_say_nothing_are_errors_not_verdicts(
    prom: FakePrometheus, data: Any, why: str
) -> None:
    prom.data = data
    with pytest.raises(VerifyError, match=why):
        await PromQLVerifier(prom.url).healthy("q")


_HEALTHY_DATA = {"resultType": "scalar", "result": [1.0, "1"]}


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, {"status": "error", "errorType": "execution", "error": "x", "data": _HEALTHY_DATA}),
        (503, {"status": "success", "data": _HEALTHY_DATA}),  # e.g. a proxy in front of Prometheus
        (200, {"data": _HEALTHY_DATA}),  # no status at all
        (200, {"status": "unknown", "data": _HEALTHY_DATA}),
        (200, ["not", "an", "object"]),
    ],
    ids=["status-error", "http-503", "no-status", "odd-status", "array-body"],
)
async def test_only_a_successful_answer_gives_a_verdict(prom: FakePrometheus, status: int, body: Any) -> None:
    prom.status, prom.body = status, body
    with pytest.raises(VerifyError, match="prometheus answered"):
        await PromQLVerifier(prom.url).healthy("q")


async def test_an_unreachable_prometheus_is_an_error_and_the_incident_keeps_waiting(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(VerifyError, match="prometheus query failed"):
        await PromQLVerifier(dead, timeout_seconds=2).healthy("q")
    rig = Rig(tmp_path, engine_settings(prometheus_url=dead, prometheus_timeout_seconds=2))
    rig.library = SignatureLibrary([*load_library(), *parse_document(VERIFIED_LEAK, "t.yaml", "user")])
    rig.build()
    try:
        ev = await rig.fire(LEAK)
        await rig.resolve(ev)
        inc = rig.only_incident()
        assert inc["state"] == "verifying"  # not healthy while Prometheus cannot be asked
        assert any("prometheus query failed" in h["summary"] for h in inc["history"])
    finally:
        await rig.engine.aclose()
