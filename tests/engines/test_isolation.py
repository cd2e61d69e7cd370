"""One bad engine endpoint never hides another: hung, slow-drip, hostile and half-broken endpoints,
a hung /proc lookup and a slow target source each cost only themselves."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from exporter.collectors.base import NodeState
from exporter.config import ExporterSettings
from exporter.engines.collector import EnginesCollector
from exporter.engines.settings import EngineSettings
from exporter.engines.targets import Target
from exporter.host import procfs
from exporter.sampler import Sampler
from tests.exporter.clocks import StepClock

from .conftest import FakeClock, ListSource, load_fixture, samples, value

VLLM = load_fixture("vllm-0.33.0")
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


class Pages:
    """A local HTTP server with hostile endpoints; `release` ends every hang."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.hung_requests = 0
        self.base = ""
        self.flaky_fail = True

    async def hang(self, _: web.Request) -> web.StreamResponse:
        self.hung_requests += 1
        await self.release.wait()
        return web.Response(text=VLLM)

    async def drip(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"# TYPE vllm:num_requests_running gauge\n")
        while not self.release.is_set():  # a line now and then, never the end of the page
            await resp.write(b'vllm:num_requests_running{model_name="drip"} 1\n')
            try:
                await asyncio.wait_for(self.release.wait(), 0.05)
            except TimeoutError:
                pass
        return resp

    async def vllm(self, _: web.Request) -> web.StreamResponse:
        return web.Response(text=VLLM, content_type="text/plain")

    async def hostile(self, _: web.Request) -> web.StreamResponse:
        # vLLM's page, then 80,000 series of a family the exporter maps, all under the byte cap
        rows = "".join(f'vllm:num_requests_waiting{{model_name="m{i}"}} 1\n' for i in range(80_000))
        page = VLLM.replace("# HELP vllm:num_requests_waiting ", "# HELP vllm:num_requests_waitin ")
        return web.Response(text=page + "# TYPE vllm:num_requests_waiting gauge\n" + rows)

    async def sidecar(self, _: web.Request) -> web.StreamResponse:
        # a sidecar on the same port with a line prometheus_client refuses (and Prometheus too)
        return web.Response(text=VLLM + "# TYPE sidecar_up gauge\nsidecar_up{instance=oops} 1\n")

    async def broken(self, _: web.Request) -> web.StreamResponse:
        line = 'vllm:kv_cache_usage_perc{engine="0",model_name="' + LLAMA + '"} 0.6734'
        return web.Response(text=VLLM.replace(line, line + "\n" + line.replace("0.6734", "oops")))

    async def flaky(self, request: web.Request) -> web.StreamResponse:
        if self.flaky_fail:
            return web.Response(status=503, text="warming up")
        return web.Response(text=VLLM)


@pytest.fixture
async def pages() -> AsyncIterator[Pages]:
    p = Pages()
    app = web.Application()
    for name in ("hang", "drip", "vllm", "hostile", "sidecar", "broken", "flaky"):
        app.router.add_get(f"/{name}", getattr(p, name))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    p.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield p
    finally:
        p.release.set()
        await runner.cleanup()


def up(metrics: list, url: str) -> float:  # type: ignore[type-arg]
    return value(metrics, "inference_engine_up", endpoint=url)


async def test_a_hung_endpoint_marks_only_itself_within_its_deadline(pages: Pages, clock: FakeClock) -> None:
    hung, good = Target(f"{pages.base}/hang", pod="hung"), Target(f"{pages.base}/vllm", pod="good")
    settings = EngineSettings(scrape_timeout_seconds=0.5)
    collector = EnginesCollector([ListSource([hung, good])], settings, clock)
    try:
        round_ = collector.collect(NodeState())
        metrics = list(await asyncio.wait_for(round_, settings.round_deadline_seconds))
    finally:
        await collector.close()
    assert pages.hung_requests == 1 and not pages.release.is_set()  # it was still hanging
    assert up(metrics, good.url) == 1.0
    assert value(metrics, "inference_requests_running", pod="good") == 24.0
    assert up(metrics, hung.url) == 0.0
    assert value(metrics, "inference_engine_down_reason", endpoint=hung.url, reason="timeout") == 1.0
    failures = "inference_engine_scrape_failures_total"
    assert value(metrics, failures, endpoint=hung.url, reason="timeout") == 1.0
    assert not samples(metrics, "inference_engine_down_reason", endpoint=good.url)


async def test_a_slow_drip_endpoint_is_cut_at_its_timeout(pages: Pages, clock: FakeClock) -> None:
    drip, good = Target(f"{pages.base}/drip", pod="drip"), Target(f"{pages.base}/vllm", pod="good")
    settings = EngineSettings(scrape_timeout_seconds=0.4)
    collector = EnginesCollector([ListSource([drip, good])], settings, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert value(metrics, "inference_engine_down_reason", endpoint=drip.url, reason="timeout") == 1.0
    assert up(metrics, good.url) == 1.0


async def test_the_sampler_keeps_the_engines_deadline_above_its_endpoints(
    pages: Pages, clock: FakeClock
) -> None:
    # The sampler's collector deadline (here 0.2 s) is below an endpoint's scrape timeout (0.5 s):
    # the sampler must wait for the collector's own round deadline, or a hung endpoint would cancel
    # the whole round and hide the healthy engine with it.
    hung, good = Target(f"{pages.base}/hang", pod="hung"), Target(f"{pages.base}/vllm", pod="good")
    settings = EngineSettings(scrape_timeout_seconds=0.5)
    collector = EnginesCollector([ListSource([hung, good])], settings, clock)
    sampler = Sampler(
        [collector],
        ExporterSettings(collector_timeout_seconds=0.2, slow_collector_wait_seconds=30.0),
        StepClock(),
    )
    try:
        snap = await sampler.sample_once()
    finally:
        await sampler.close()
    lines = snap.body.decode().splitlines()
    assert 'gpupulse_collector_success{collector="engines"} 1.0' in lines
    running = [x for x in lines if x.startswith("inference_requests_running{")]
    assert len(running) == 1 and 'pod="good"' in running[0] and running[0].endswith(" 24.0")


async def test_a_hostile_page_is_capped_and_the_rest_of_the_page_kept(pages: Pages, clock: FakeClock) -> None:
    hostile, good = Target(f"{pages.base}/hostile", pod="hostile"), Target(f"{pages.base}/vllm", pod="good")
    settings = EngineSettings(scrape_timeout_seconds=5.0, max_samples_per_endpoint=2_000)
    collector = EnginesCollector([ListSource([hostile, good])], settings, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert up(metrics, hostile.url) == 1.0  # vLLM's own families came before the flood
    assert value(metrics, "inference_requests_running", pod="hostile") == 24.0
    assert not samples(metrics, "inference_requests_waiting", pod="hostile")  # the family it cut
    partial = "inference_engine_scrape_partial_total"
    assert value(metrics, partial, endpoint=hostile.url, reason="too_many_samples") == 1.0
    assert value(metrics, "inference_requests_running", pod="good") == 24.0
    assert len({lb["model"] for lb, _ in samples(metrics, "inference_engine_up")}) <= 2


async def test_a_malformed_line_costs_only_its_family(pages: Pages, clock: FakeClock) -> None:
    sidecar, broken = Target(f"{pages.base}/sidecar", pod="sidecar"), Target(f"{pages.base}/broken", pod="b")
    collector = EnginesCollector([ListSource([sidecar, broken])], EngineSettings(), clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    # A family nothing maps is never even checked: the sidecar's broken line costs nothing.
    assert up(metrics, sidecar.url) == 1.0
    assert value(metrics, "inference_kv_cache_usage_ratio", pod="sidecar") == 0.6734
    assert not samples(metrics, "inference_engine_scrape_partial_total", endpoint=sidecar.url)
    # A broken line in a mapped family costs that family, counted; the page's other families stay.
    assert up(metrics, broken.url) == 1.0
    assert not samples(metrics, "inference_kv_cache_usage_ratio", pod="b")
    assert value(metrics, "inference_kv_cache_hits_total", pod="b") == 1_212_416.0
    assert value(metrics, "inference_requests_running", pod="b") == 24.0
    partial = "inference_engine_scrape_partial_total"
    assert value(metrics, partial, endpoint=broken.url, reason="malformed") == 1


async def test_the_down_reason_goes_away_when_the_endpoint_recovers(pages: Pages, clock: FakeClock) -> None:
    target = Target(f"{pages.base}/flaky")
    collector = EnginesCollector([ListSource([target])], EngineSettings(), clock)
    try:
        first = list(await collector.collect(NodeState()))
        pages.flaky_fail = False
        second = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert value(first, "inference_engine_down_reason", endpoint=target.url, reason="http_status") == 1.0
    assert up(second, target.url) == 1.0
    assert not samples(second, "inference_engine_down_reason")
    # the counter keeps its history
    assert value(second, "inference_engine_scrape_failures_total", reason="http_status") == 1.0


async def test_a_hung_proc_lookup_costs_only_its_endpoint(
    pages: Pages, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Two engines on this host; the /proc lookup for one of them never returns (a D-state process,
    # a FUSE /proc). The other's PID is still found, both are scraped, and the hung lookup is not
    # started again while it is still out.
    released = threading.Event()
    calls: list[int] = []
    port = int(pages.base.rsplit(":", 1)[1])
    hung_port = port + 100_000  # not a real port: it only tells the two lookups apart

    def pid_for_port(root: Path, port: int, candidates: object = None) -> int | None:
        calls.append(port)
        if port == hung_port:
            released.wait()
            return None
        return 4242

    monkeypatch.setattr(procfs, "pid_for_port", pid_for_port)
    monkeypatch.setattr(procfs, "alive", lambda root, pid: True)
    monkeypatch.setattr(procfs, "process_start_seconds", lambda root, pid, *more: 1.0)
    monkeypatch.setattr(procfs, "parent_map", lambda root: {4242: 1})
    monkeypatch.setattr(Target, "port", property(lambda t: hung_port if "second" in t.url else port))
    good = Target(f"{pages.base}/vllm", pod="good")
    hung = Target(f"{pages.base}/vllm?second=1", pod="hung")
    settings = EngineSettings(procfs_path=tmp_path, procfs_timeout_seconds=0.3, pid_retry_seconds=0.0)
    collector = EnginesCollector([ListSource([hung, good])], settings, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
        assert up(metrics, good.url) == 1.0 and up(metrics, hung.url) == 1.0
        assert collector._endpoints[good.url].pid == 4242
        assert collector._endpoints[hung.url].pid is None
        assert calls.count(hung_port) == 1
        await collector.collect(NodeState())
        assert calls.count(hung_port) == 1  # set aside while its read is out
        assert calls.count(port) == 1  # the good one keeps its PID, no new lookup needed
        released.set()
        for _ in range(50):  # the returned read clears its mark on the loop
            if not collector._procfs.stuck:
                break
            await asyncio.sleep(0.01)
        await collector.collect(NodeState())
        assert calls.count(hung_port) == 2  # tried again once its read came back
    finally:
        released.set()
        await collector.close()


class _SlowSource:
    def __init__(self, targets: list[Target]) -> None:
        self.release = asyncio.Event()
        self.items = targets

    async def targets(self) -> list[Target]:
        await self.release.wait()
        return self.items

    async def close(self) -> None:
        self.release.set()


async def test_a_slow_target_source_never_holds_a_round(pages: Pages, clock: FakeClock) -> None:
    slow = _SlowSource([Target(f"{pages.base}/vllm?from=slow", pod="late")])
    fast = ListSource([Target(f"{pages.base}/vllm", pod="now")])
    settings = EngineSettings(source_timeout_seconds=0.2)
    collector = EnginesCollector([slow, fast], settings, clock)
    try:
        first = list(await collector.collect(NodeState()))  # returns although the slow one never answered
        assert samples(first, "inference_requests_running", pod="now")
        assert not samples(first, "inference_requests_running", pod="late")
        slow.release.set()
        second = list(await collector.collect(NodeState()))
        assert samples(second, "inference_requests_running", pod="late")
    finally:
        await collector.close()
