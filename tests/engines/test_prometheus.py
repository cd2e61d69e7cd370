"""Real Prometheus computes the KV-cache hit ratio and batch-latency quantiles from our series."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.error import URLError
from urllib.parse import quote
from urllib.request import urlopen

import pytest
from aiohttp import web
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from demo.neighbours import line as neighbour_line
from exporter.collectors.base import NodeState
from exporter.engines.collector import EnginesCollector
from exporter.engines.settings import EngineSettings
from exporter.engines.targets import Target
from exporter.sim.clock import RealClock
from exporter.sim.engine_spec import parse_engines
from exporter.sim.engines import SimEngine, serve

from .conftest import ListSource, free_port

pytestmark = pytest.mark.integration

ENGINES = [
    {
        "name": "llama",
        "kind": "vllm",
        "model": "llama",
        "curves": {"request_rate": 20, "kv_cache_hit_rate": 0.75, "itl_p50": 0.03, "itl_p99": 0.05},
    },
    {
        "name": "mistral",
        "kind": "tgi",
        "model": "mistral",
        "curves": {"batch_latency_p50": 0.025, "batch_latency_p99": 0.04},
    },
]


class _Snapshot:
    def __init__(self) -> None:
        self.metrics: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics


def _query(base: str, expr: str) -> list[dict[str, object]]:
    try:
        with urlopen(f"{base}/api/v1/query?query={quote(expr)}", timeout=5) as resp:
            body = json.load(resp)
    except URLError:
        return []  # Prometheus still starting
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


async def _poll(base: str, expr: str, deadline_seconds: float = 30.0) -> float:
    """First non-NaN scalar the expression yields, polling until the deadline."""
    end = time.monotonic() + deadline_seconds
    while True:
        result = await asyncio.to_thread(_query, base, expr)
        if result:
            v = float(result[0]["value"][1])  # type: ignore[index]
            if v == v:
                return v
        if time.monotonic() > end:
            raise AssertionError(f"{expr} gave no value within {deadline_seconds}s: {result}")
        await asyncio.sleep(0.5)


async def test_prometheus_computes_hit_ratio_and_batch_quantiles(tmp_path: Path) -> None:
    specs = parse_engines(ENGINES)
    runners, targets = [], []
    for spec in specs:
        runner, port = await serve(SimEngine(spec, RealClock()), "127.0.0.1", 0)
        runners.append(runner)
        targets.append(Target(f"http://127.0.0.1:{port}/metrics", model=spec.model, pod=spec.name))
    collector = EnginesCollector([ListSource(targets)], EngineSettings(procfs_path=tmp_path))
    snapshot = _Snapshot()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(snapshot)

    async def metrics(_: web.Request) -> web.Response:
        snapshot.metrics = list(await collector.collect(NodeState()))
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    exporter = web.AppRunner(app, access_log=None)
    await exporter.setup()
    site = web.TCPSite(exporter, "127.0.0.1", 0)
    await site.start()
    exporter_port = exporter.addresses[0][1]

    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpupulse\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    prom = await asyncio.create_subprocess_exec(
        neighbour_line().prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{prom_port}"
    try:
        hits, queries = "inference_kv_cache_hits_total", "inference_kv_cache_queries_total"
        ratio = await _poll(base, f"sum(rate({hits}[10s])) / sum(rate({queries}[10s]))")
        assert ratio == pytest.approx(0.75, abs=0.01)
        buckets = "inference_batch_latency_seconds_bucket"
        p50 = await _poll(
            base, f'histogram_quantile(0.5, sum by (le) (rate({buckets}{{engine="tgi"}}[10s])))'
        )
        # TGI's buckets grow by x1.5: the 25 ms median lies in the 19.5-29.2 ms bucket.
        assert 0.0194 <= p50 <= 0.0292
        p99 = await _poll(
            base, f'histogram_quantile(0.99, sum by (le) (rate({buckets}{{engine="vllm"}}[10s])))'
        )
        assert 0.025 <= p99 <= 0.075  # vLLM ITL proxy, p99 50 ms, bucket edges 25/50/75 ms
        info = await _poll(base, 'inference_batch_latency_source_info{engine="tgi",proxy="false"}')
        assert info == 1.0
    finally:
        prom.terminate()
        await asyncio.wait_for(prom.wait(), 10)
        await exporter.cleanup()
        await collector.close()
        for r in runners:
            await r.cleanup()
