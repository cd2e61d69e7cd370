"""One OpenTelemetry trace per incident with one span per rung."""

from __future__ import annotations

from pathlib import Path

from tests.remediation.test_engine_support import LEAK, Rig, engine_settings


async def test_trace_has_one_span_per_rung(tmp_path: Path) -> None:
    rig = Rig(tmp_path, engine_settings())
    rig.build()
    try:
        ev = await rig.fire(LEAK)
        await rig.advance(301)  # restart not verified -> migrate
        await rig.advance(301)  # migrate not verified -> page
        rig.clock.advance(60)
        await rig.resolve(ev)  # a human fixed it: incident closes, root span ends
        spans = rig.finished_spans()
        rungs = [s for s in spans if s.name.startswith("rung ")]
        assert [s.name for s in rungs] == ["rung restart", "rung migrate", "rung page"]
        roots = [s for s in spans if s.name.startswith("incident ")]
        assert len(roots) == 1
        root = roots[0]
        assert root.context is not None
        trace_id = root.context.trace_id
        for span in rungs:
            assert span.context is not None and span.context.trace_id == trace_id
            assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert rungs[0].attributes is not None
        assert rungs[0].attributes["gpupulse.outcome"] == "failed"
        assert rungs[2].attributes is not None and rungs[2].attributes["gpupulse.outcome"] == "success"
        assert root.attributes is not None and root.attributes["gpupulse.resolution"] == "human"
        # rung spans carry the fake clock's times, so durations are the ladder's, not the test's
        assert rungs[0].start_time is not None and rungs[0].end_time is not None
        assert (rungs[0].end_time - rungs[0].start_time) == 301 * 10**9
    finally:
        await rig.engine.aclose()


async def test_separate_incidents_have_separate_traces(tmp_path: Path) -> None:
    rig = Rig(tmp_path, engine_settings())
    rig.build()
    try:
        for name in ("a", "b"):
            ev = await rig.fire({**LEAK, "pod": name})
            await rig.resolve(ev)
        await rig.advance(901)
        roots = [s for s in rig.finished_spans() if s.name.startswith("incident ")]
        assert len({s.context.trace_id for s in roots if s.context is not None}) == 2
    finally:
        await rig.engine.aclose()


async def test_spans_are_exported_over_otlp_http_when_configured(tmp_path: Path) -> None:
    from typing import cast

    from remediation.engine import RemediationEngine, build_engine
    from remediation.metrics import RemediationMetrics
    from tests.fakes.clock import FakeClock
    from tests.fakes.pager_sink import PagerSink, RecordingPager
    from tests.remediation.test_engine_support import CORRUPT_MODEL

    collector = PagerSink()  # any HTTP sink records the OTLP/HTTP protobuf POST
    await collector.start()
    settings = engine_settings(otlp_traces_endpoint=collector.url + "/v1/traces")
    clock = FakeClock()
    engine = cast(
        RemediationEngine,
        build_engine(settings, tmp_path / "db", RemediationMetrics(), clock, pager=RecordingPager()),
    )
    rig = Rig(tmp_path, settings, clock=clock)
    rig.engine = engine
    try:
        ev = await rig.fire(CORRUPT_MODEL)
        await rig.resolve(ev)
        await engine.aclose()  # shutting the engine down flushes the batch exporter
        (got,) = await collector.wait_for(1)
        assert got.path == "/v1/traces"
        assert got.headers["Content-Type"] == "application/x-protobuf"
        assert "incident model-artifact" in got.body and "rung page" in got.body
    finally:
        await collector.stop()
