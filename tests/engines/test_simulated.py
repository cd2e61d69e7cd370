"""The simulated engine: curves become counters and buckets; served and scraped end to end."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.collectors.base import NodeState
from exporter.engines import sglang
from exporter.engines.collector import EnginesCollector
from exporter.engines.settings import EngineSettings
from exporter.engines.targets import Target
from exporter.engines.vllm import normalize
from exporter.errors import SimSpecError
from exporter.exposition.parse import parse_exposition
from exporter.sim.clock import ManualClock
from exporter.sim.engine_spec import load_engines, parse_engines
from exporter.sim.engines import SimEngine, serve

from .conftest import FakeClock, ListSource, value

SCENARIO = """\
name: engines-test
gpus:
  - model: H100-SXM5-80GB
engines:
  - name: llama
    kind: vllm
    model: llama-3-8b
    port: 0
    gpu: [0]
    namespace: serving
    pod: llama-0
    ready_after_seconds: 20
    curves:
      request_rate: 2
      prompt_tokens: 1000
      output_tokens: 101
      kv_cache_hit_rate: [[0, 0.8], [100, 0.2]]
      kv_cache_usage: 0.5
      ttft_p50: 0.1
      ttft_p99: 0.5
      itl_p50: 0.03
      itl_p99: 0.06
  - name: mistral
    kind: tgi
    model: mistral-7b
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "engines-test.yaml"
    path.write_text(SCENARIO)
    return path


def test_engines_section_loaded_through_the_scenario_loader(scenario: Path) -> None:
    specs = load_engines(str(scenario))
    assert [s.name for s in specs] == ["llama", "mistral"]
    assert specs[0].gpus == (0,) and specs[0].ready_after_seconds == 20
    assert specs[1].curves["request_rate"].at(0) == 2.0  # defaults fill missing curves


@pytest.mark.parametrize(
    "section",
    [
        [{"name": "x", "kind": "llamacpp"}],
        [{"name": "x", "curves": {"qps": 3}}],
        [{"name": "x", "curves": {"request_rate": "fast"}}],
        [{"kind": "vllm"}],
    ],
)
def test_malformed_engines_section_rejected(section: list[dict[str, object]]) -> None:
    with pytest.raises(SimSpecError):
        parse_engines(section)


def test_curves_integrate_into_counters_and_buckets(scenario: Path) -> None:
    spec = load_engines(str(scenario))[0]
    clock = ManualClock()
    engine = SimEngine(spec, clock, wall_start=0.0)
    clock.set(100.0)
    engine.advance()
    reading = normalize(parse_exposition(_render(engine)))[0]
    assert reading.kv_queries == pytest.approx(200 * 1000)  # 2 req/s x 100 s x 1000 tokens
    # hit rate falls linearly 0.8 -> 0.2: the token-weighted mean over the window is 0.5
    assert reading.kv_hits is not None and reading.kv_queries is not None
    assert reading.kv_hits / reading.kv_queries == pytest.approx(0.5, rel=1e-3)
    assert reading.ttft is not None and reading.ttft.count == pytest.approx(200)
    median_bucket = dict(reading.ttft.buckets)[0.1]
    assert median_bucket == pytest.approx(100, rel=0.01)  # half the requests are under the p50
    assert reading.itl is not None and reading.itl.count == pytest.approx(200 * 100)
    assert reading.itl.sum / reading.itl.count == pytest.approx(0.03, rel=0.1)
    assert (reading.prompt_tokens, reading.generation_tokens) == (
        pytest.approx(200_000),
        pytest.approx(200 * 101),
    )


def test_simulated_sglang_serves_its_token_counters(scenario: Path) -> None:
    spec = replace(load_engines(str(scenario))[0], kind="sglang")
    clock = ManualClock()
    engine = SimEngine(spec, clock, wall_start=0.0)
    clock.set(100.0)
    engine.advance()
    reading = sglang.normalize(parse_exposition(_render(engine)))[0]
    assert (reading.prompt_tokens, reading.generation_tokens) == (
        pytest.approx(200_000),
        pytest.approx(200 * 101),
    )


def _render(engine: SimEngine) -> str:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from exporter.sim.engines import _Registry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Registry(engine))
    return generate_latest(registry).decode()


async def test_simulated_engine_scraped_end_to_end_with_cold_start(scenario: Path, tmp_path: Path) -> None:
    spec = load_engines(str(scenario))[0]
    sim_clock = ManualClock()
    wall = FakeClock(1_800_000_000.0)
    engine = SimEngine(spec, sim_clock, wall_start=wall.now + 1.0)
    runner, port = await serve(engine, "127.0.0.1", 0)
    target = Target(f"http://127.0.0.1:{port}/metrics", namespace="serving", pod="llama-0")
    # An empty procfs: no PID found, so the cold start comes from process_start_time_seconds.
    settings = EngineSettings(scrape_timeout_seconds=2, procfs_path=tmp_path)
    collector = EnginesCollector([ListSource([target])], settings, wall)
    try:
        metrics = list(await collector.collect(NodeState()))
        assert value(metrics, "inference_engine_up", pod="llama-0") == 0.0  # still loading: 503
        assert value(metrics, "inference_engine_scrape_failures_total", reason="http_status") == 1
        sim_clock.set(60.0)
        wall.now += 61.0
        metrics = list(await collector.collect(NodeState()))
        assert value(metrics, "inference_engine_up", pod="llama-0", model="llama-3-8b") == 1.0
        queries = value(metrics, "inference_kv_cache_queries_total", model="llama-3-8b", unit="tokens")
        assert queries == pytest.approx(120 * 1000)
        assert value(metrics, "inference_kv_cache_usage_ratio", model="llama-3-8b") == 0.5
        # the token counters the cost rules and `gpupulse report` divide by
        assert value(metrics, "inference_prompt_tokens_total", pod="llama-0") == pytest.approx(120 * 1000)
        assert value(metrics, "inference_generation_tokens_total", pod="llama-0") == pytest.approx(120 * 101)
        assert value(metrics, "inference_cold_start_seconds", pod="llama-0") == pytest.approx(60.0)
        count = value(metrics, "inference_batch_latency_seconds_count", model="llama-3-8b")
        assert count == pytest.approx(120 * 100)
    finally:
        await collector.close()
        await runner.cleanup()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux procfs")
async def test_real_procfs_finds_the_process_serving_a_port(scenario: Path) -> None:
    from exporter.host import procfs

    runner, port = await serve(SimEngine(load_engines(str(scenario))[0], ManualClock()), "127.0.0.1", 0)
    try:
        pid = await asyncio.to_thread(procfs.pid_for_port, Path("/proc"), port)
    finally:
        await runner.cleanup()
    assert pid == os.getpid()


@pytest.mark.integration
async def test_console_script_prints_its_port_and_serves(scenario: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from exporter.sim.engines import main; main()",
        "--scenario", str(scenario), "--engine", "mistral", "--listen", "127.0.0.1:0", "--speed", "10",
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.split()[-1]
        collector = EnginesCollector(
            [ListSource([Target(url, model="mistral-7b")])], EngineSettings(), FakeClock()
        )
        try:
            metrics = list(await collector.collect(NodeState()))
        finally:
            await collector.close()
        assert value(metrics, "inference_engine_up", engine="tgi") == 1.0
        assert not math.isnan(value(metrics, "inference_batch_latency_seconds_sum", model="mistral-7b"))
    finally:
        proc.terminate()
        await proc.wait()
