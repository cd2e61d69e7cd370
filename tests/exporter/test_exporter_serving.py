"""Sampling apart from serving: snapshots, /metrics, /readyz, /healthz and the landing page."""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.config import ExporterSettings
from exporter.sampler import Sampler
from exporter.server import make_app
from exporter.snapshot import Snapshot
from tests.exporter.clocks import StepClock
from tests.fakes.exporter_core import FakeCollector

SETTINGS = ExporterSettings(sampling_interval_seconds=1.0, collector_timeout_seconds=0.2)


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


@pytest.fixture
def collector() -> FakeCollector:
    return FakeCollector()


@pytest.fixture
def sampler(collector: FakeCollector, clock: StepClock) -> Sampler:
    return Sampler([collector], SETTINGS, clock)


@pytest.fixture
async def client(sampler: Sampler) -> AsyncIterator[TestClient[object, object]]:
    async with TestClient(TestServer(make_app(sampler))) as c:
        yield c


async def test_metrics_is_503_before_the_first_sample(client: TestClient[object, object]) -> None:
    resp = await client.get("/metrics")
    assert resp.status == 503


async def test_scrape_serves_the_snapshot_without_collecting(
    client: TestClient[object, object], sampler: Sampler, collector: FakeCollector
) -> None:
    await sampler.sample_once()
    for _ in range(5):
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = await resp.text()
        assert 'fake_value{k="v"} 1.0' in text
        assert 'gpupulse_collector_success{collector="fake"} 1.0' in text
    assert collector.calls == 1  # five scrapes, one collection


async def test_snapshot_is_rendered_once_and_reused(sampler: Sampler) -> None:
    snap = await sampler.sample_once()
    assert sampler.snapshot is snap
    assert snap.body is sampler.snapshot.body
    assert gzip.decompress(snap.gzipped()) == snap.body
    assert snap.gzipped() is snap.gzipped()


async def test_gzip_when_the_client_accepts_it(client: TestClient[object, object], sampler: Sampler) -> None:
    await sampler.sample_once()
    resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert resp.headers["Content-Encoding"] == "gzip"
    assert b"fake_value" in gzip.decompress(await resp.read())


async def test_the_sampling_loop_renders_ahead_only_while_someone_scrapes(
    collector: FakeCollector, clock: StepClock
) -> None:
    # The loop's interval is real time; the one scrape below takes milliseconds of its 0.5 s.
    sampler = Sampler([collector], replace(SETTINGS, sampling_interval_seconds=0.5), clock)
    published: list[tuple[bool, bool]] = []
    stop = asyncio.Event()
    async with TestClient(TestServer(make_app(sampler))) as client:

        async def hook(snap: Snapshot) -> None:
            published.append((snap.rendered, snap.compressed))
            if len(published) == 1:  # a scraper asks for the first snapshot only
                resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
                assert resp.status == 200 and snap.requested
            if len(published) == 3:
                stop.set()

        sampler.hooks.append(hook)
        await asyncio.wait_for(sampler.run(stop), 10)
        await sampler.close()
    # nobody had asked yet: not rendered; the previous one was scraped: published already compressed,
    # so no scrape of it compresses on the event loop; the previous one was not scraped: not rendered
    assert published == [(False, False), (True, True), (False, False)]
    snap = sampler.snapshot
    assert snap is not None and gzip.decompress(snap.gzipped()) == snap.body


async def test_the_first_scrape_of_an_unrendered_snapshot_gets_its_text(
    client: TestClient[object, object], sampler: Sampler
) -> None:
    snap = await sampler.sample_once()
    assert not snap.rendered and not snap.requested
    resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert gzip.decompress(await resp.read()) == snap.body
    assert snap.requested and snap.compressed
    plain = await (await client.get("/metrics")).read()
    assert plain == snap.body and b'fake_value{k="v"} 1.0' in plain


async def test_a_snapshot_from_sample_once_compresses_on_first_use(sampler: Sampler) -> None:
    snap = await sampler.sample_once()
    assert not snap.compressed
    snap.gzipped()
    assert snap.compressed


async def test_failing_collector_reports_itself_and_others_keep_serving(clock: StepClock) -> None:
    good, bad = FakeCollector("good"), FakeCollector("bad")
    bad.fail = True
    sampler = Sampler([good, bad], SETTINGS, clock)
    text = (await sampler.sample_once()).body.decode()
    assert 'gpupulse_collector_success{collector="bad"} 0.0' in text
    assert 'gpupulse_collector_success{collector="good"} 1.0' in text
    assert "good_value" in text and "bad_value" not in text


async def test_collector_past_its_timeout_is_cancelled_and_reported(clock: StepClock) -> None:
    slow = FakeCollector("slow")
    slow.block = asyncio.Event()
    sampler = Sampler([slow, FakeCollector("quick")], SETTINGS, clock)
    started = time.monotonic()
    text = (await sampler.sample_once()).body.decode()
    assert time.monotonic() - started < 1.0
    assert 'gpupulse_collector_success{collector="slow"} 0.0' in text
    assert "quick_value" in text


async def test_readyz_before_first_sample_then_ready_then_stale(
    client: TestClient[object, object], sampler: Sampler, collector: FakeCollector, clock: StepClock
) -> None:
    assert (await client.get("/readyz")).status == 503
    await sampler.sample_once()
    assert (await client.get("/readyz")).status == 200
    clock.advance(2.9)
    assert (await client.get("/readyz")).status == 200
    collector.fail = True  # sampling goes on but produces nothing good
    await sampler.sample_once()
    clock.advance(0.2)
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert "3.1 s old" in await resp.text()
    assert (await client.get("/healthz")).status == 200


async def test_landing_page_lists_collectors(client: TestClient[object, object], sampler: Sampler) -> None:
    await sampler.sample_once()
    resp = await client.get("/")
    assert resp.status == 200
    body = await resp.text()
    assert "<td>fake</td><td>ok</td>" in body
    assert 'href="/metrics"' in body


async def test_slower_collector_keeps_its_families_between_rounds(clock: StepClock) -> None:
    slow = FakeCollector("slow")
    slow.interval_seconds = 5.0
    sampler = Sampler([slow], SETTINGS, clock)
    await sampler.sample_once()
    clock.advance(1.0)
    text = (await sampler.sample_once()).body.decode()
    assert slow.calls == 1 and "slow_value" in text
    clock.advance(4.0)
    await sampler.sample_once()
    assert slow.calls == 2


async def test_snapshot_hook_runs_off_the_sampling_path(clock: StepClock) -> None:
    seen: list[bytes] = []
    release = asyncio.Event()

    async def hook(snap: object) -> None:
        await release.wait()
        seen.append(snap.body)  # type: ignore[attr-defined]

    sampler = Sampler([FakeCollector()], SETTINGS, clock, hooks=[hook])
    await sampler.sample_once()  # returns although the hook is blocked
    await sampler.sample_once()  # the hook is busy: this snapshot is skipped, not queued
    release.set()
    await asyncio.sleep(0)
    await sampler.close()
    assert len(seen) == 1


async def test_sampler_closes_collectors(sampler: Sampler, collector: FakeCollector) -> None:
    await sampler.close()
    assert collector.closed


def test_render_matches_prometheus_client_byte_for_byte() -> None:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from exporter.snapshot import render

    g = GaugeMetricFamily("g_ratio", 'Help with \\ and\nnewline "quoted".', labels=["b", "a"])
    for value in (
        0.0,
        -0.0,
        1.0,
        0.62,
        1e10,
        8.5520809984e10,
        float("inf"),
        float("-inf"),
        float("nan"),
        -3.5,
    ):
        g.add_metric(["x", str(value)], value)
    g.add_metric(['q"uo\\te\nd', "y"], 2.0)
    c = CounterMetricFamily("c_total", "A counter.", labels=["k"])
    c.add_metric(["v"], 3.0)
    c.add_metric(["w"], 4.0, created=1.0)  # an OpenMetrics-only sample: the slow path
    plain = GaugeMetricFamily("plain", "No labels.", value=7.0)
    h = HistogramMetricFamily("h_seconds", "A histogram.", labels=["k"])
    h.add_metric(["v"], buckets=[("0.1", 1.0), ("+Inf", 3.0)], sum_value=0.5)
    families = [g, c, plain, h]
    registry = CollectorRegistry()

    class Collect:
        def collect(self):  # type: ignore[no-untyped-def]
            return families

    registry.register(Collect())  # type: ignore[arg-type]
    for _ in range(2):  # the second round goes through the series-prefix cache
        assert render(families) == generate_latest(registry)


class _Unwritable(Metric):
    """A plug-in family whose samples cannot be read (a bug in a collector), found only at render time."""

    def __init__(self) -> None:
        super().__init__("plugin_thing", "A plug-in gauge.", "gauge")

    @property  # type: ignore[override]
    def samples(self) -> list[object]:
        raise RuntimeError("broken samples")

    @samples.setter
    def samples(self, value: list[object]) -> None:
        pass


class _UnwritableCollector(FakeCollector):
    async def collect(self, state: NodeState) -> Sequence[Metric]:
        return [_Unwritable()]


async def test_a_family_that_cannot_be_rendered_is_left_out_and_the_rest_is_served(
    clock: StepClock, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = Sampler([_UnwritableCollector("broken")], SETTINGS, clock)
    await sampler.sample_once()
    async with TestClient(TestServer(make_app(sampler))) as client:
        for headers in ({"Accept-Encoding": "gzip"}, {"Accept-Encoding": "identity"}):
            resp = await client.get("/metrics", headers=headers)
            assert resp.status == 200
            text = await resp.text()
            assert "plugin_thing" not in text  # not half a family either
            assert 'gpupulse_collector_success{collector="broken"}' in text  # the rest of the scrape
        assert (await client.get("/healthz")).status == 200
    assert "plugin_thing could not be rendered" in caplog.text and "broken samples" in caplog.text
