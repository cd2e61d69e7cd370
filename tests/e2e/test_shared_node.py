"""Issue 3 end to end: the exporter on a shared 8-GPU node, every plug-in on, scraped over HTTP.

The shipped scenario `shared-node` drives everything: the simulated NVML (GPUs and processes), the fake
kubelet and the fake /proc (its `pods` section), a simulated vLLM engine served in-process on the same
manual clock (its `engines` section) and a real weight file whose pages are evicted at the scenario's
time (its `page_cache` section, played by exporter/sim/pagecache.py). The plug-ins are built from
the exporter's own command-line parser, so the flags are the ones an operator would type.
"""

from __future__ import annotations

import asyncio
from asyncio.subprocess import PIPE, STDOUT
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from demo.neighbours import line as neighbour_line
from exporter import registry
from exporter.cli import build_parser
from exporter.collectors.base import Collector
from exporter.collectors.plugin import PluginContext
from exporter.server import make_app
from exporter.sim.engine_spec import load_engines
from exporter.sim.engines import SimEngine
from exporter.sim.engines import serve as serve_engine
from exporter.sim.pagecache import PageCacheScenario, parse_section
from tests.attribution.helpers import ProcfsTree, procfs_from_scenario
from tests.exporter.harness import Harness, simulated_exporter
from tests.fakes.kubelet import FakeKubelet

pytestmark = pytest.mark.integration  # runs promtool

MIB = 1 << 20
MODEL = "llama-3-70b"
ENGINE_POD = ("serving", "llama-70b-0")
EVICT_AT_SECONDS = 30.0  # page_cache.evict_at in the scenario
WARM_AT_SECONDS, BEFORE_AT_SECONDS, AFTER_AT_SECONDS = 4.0, EVICT_AT_SECONDS - 1, EVICT_AT_SECONDS + 1
REQUESTS_PER_SECOND, PROMPT_TOKENS, HIT_RATE, KV_USAGE = 8, 1200, 0.7, 0.45  # the engine's curves
# Who owns each NVML process: (namespace, pod, container); the host tool belongs to no pod.
OWNERS = {
    41001: ("serving", "llama-70b-0", "vllm"),
    41002: ("serving", "llama-70b-0", "vllm"),
    42001: ("serving", "embed-0", "server"),
    42002: ("serving", "rerank-0", "server"),
    42003: ("batch", "ocr-0", "worker"),
    43001: ("research", "train-0", "trainer"),
    43002: ("research", "train-0", "trainer"),
    43003: ("research", "train-0", "trainer"),
    43004: ("research", "train-0", "trainer"),
    49001: ("", "", ""),
}
# GPU index -> {(namespace, pod, container, resource)} allocated by the kubelet.
ALLOCATIONS = {
    "0": {("serving", "llama-70b-0", "vllm", "nvidia.com/gpu")},
    "1": {("serving", "llama-70b-0", "vllm", "nvidia.com/gpu")},
    "2": {
        ("serving", "embed-0", "server", "nvidia.com/gpu.shared"),
        ("serving", "rerank-0", "server", "nvidia.com/gpu.shared"),
        ("batch", "ocr-0", "worker", "nvidia.com/gpu.shared"),
    },
    "3": {("ml", "eval-0", "evaluator", "nvidia.com/gpu")},
    **{str(i): {("research", "train-0", "trainer", "nvidia.com/gpu")} for i in range(4, 8)},
}
ALL_COLLECTORS = {
    "device",
    "gpm",
    "health",
    "nvlink",
    "processes",
    "mig",
    "attribution",
    "engines",
    "pagecache",
}


@dataclass(frozen=True)
class Scrape:
    """One parsed GET /metrics."""

    text: str
    samples: dict[str, list[Sample]]

    def of(self, name: str, **labels: str) -> list[Sample]:
        """Samples named `name` whose labels include `labels`."""
        return [s for s in self.samples.get(name, []) if labels.items() <= s.labels.items()]

    def one(self, name: str, **labels: str) -> float:
        """The value of the single sample matching; fails on none or several."""
        found = self.of(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
        value: float = found[0].value
        return value


def parse(text: str) -> Scrape:
    """Exposition text indexed by sample name."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_name[sample.name].append(sample)
    return Scrape(text, dict(by_name))


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve an aiohttp app on a free 127.0.0.1 port; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def plugin_collectors(
    kubelet: FakeKubelet, procfs: Path, pods_dir: Path, engines_config: Path, weights: PageCacheScenario
) -> list[Collector]:
    """attribution, engines and pagecache, built by the exporter's parser from operator flags."""
    plugins = registry.available_plugins()
    argv = [
        "--path.procfs", str(procfs),
        "--attribution.kubelet-socket", kubelet.socket_path,
        "--attribution.kubelet-pods-dir", str(pods_dir),
        "--attribution.interval", "1",
        "--attribution.kubelet-refresh-interval", "1",
        "--engines.config", str(engines_config),
        "--engines.interval", "1",
        "--pagecache.interval", "1",
        *(f"--pagecache.paths={flag}" for flag in weights.flags()),
    ]  # fmt: skip
    args = build_parser(plugins).parse_args(argv)
    collectors = registry.build_plugins(args, plugins, PluginContext())  # no API server here
    assert sorted(c.name for c in collectors) == ["attribution", "engines", "pagecache"]
    return collectors


async def test_shared_node_metrics_tie_processes_engines_and_weights_to_their_pods(
    scenario_path: Path, scenario_doc: dict[str, Any], kubelet: FakeKubelet, weights_dir: Path, tmp_path: Path
) -> None:
    doc = scenario_doc
    procfs = ProcfsTree(tmp_path / "proc")
    procfs_from_scenario(procfs, tmp_path / "pods", doc)
    weights = PageCacheScenario(parse_section(doc["page_cache"]), weights_dir)
    await asyncio.to_thread(weights.prepare)
    engines_config = tmp_path / "engines.yaml"
    plugins = plugin_collectors(kubelet, procfs.root, tmp_path / "pods", engines_config, weights)

    async with simulated_exporter(scenario_path, extra=plugins) as h:
        engine = SimEngine(load_engines(str(scenario_path))[0], h.clock)  # same clock as the GPUs
        engine_runner, engine_port = await serve_engine(engine, "127.0.0.1", 0)
        target = {"url": f"http://127.0.0.1:{engine_port}/metrics", "engine": "vllm"}
        target |= {"namespace": ENGINE_POD[0], "pod": ENGINE_POD[1]}
        engines_config.write_text(yaml.safe_dump({"engines": [target]}))
        try:
            async with serving(make_app(h.sampler)) as base, aiohttp.ClientSession() as http:
                step = stepper(h, weights, http, base)
                # Round 1 publishes GPUs and processes, 2 attributes them, 3 labels them.
                for t in range(1, int(WARM_AT_SECONDS)):
                    await step(t)
                warm = await step(WARM_AT_SECONDS)
                before = await step(BEFORE_AT_SECONDS)
                after = await step(AFTER_AT_SECONDS)
        finally:
            await h.sampler.close()
            await engine_runner.cleanup()

    uuid = {str(i): str(g["uuid"]) for i, g in enumerate(doc["gpus"])}
    for scrape in (warm, before, after):
        success = {s.labels["collector"]: s.value for s in scrape.of("gpupulse_collector_success")}
        assert success == dict.fromkeys(ALL_COLLECTORS, 1.0)
        check_processes(scrape, doc["processes"], uuid)
        check_allocations(scrape, uuid)
        check_inference(scrape, uuid)
    check_counters(warm, before, uuid)
    check_weights(warm, before, after)
    await check_promtool(after.text)


def engine_labels(uuid: dict[str, str]) -> dict[str, str]:
    """The labels every per-model inference series of the engine must carry (TP=2 on GPUs 0 and 1)."""
    namespace, pod = ENGINE_POD
    gpus = {"gpu": "0,1", "uuid": f"{uuid['0']},{uuid['1']}"}
    return {"engine": "vllm", "model": MODEL, "namespace": namespace, "pod": pod, **gpus}


def check_processes(scrape: Scrape, processes: list[dict[str, Any]], uuid: dict[str, str]) -> None:
    """Every NVML process has its memory and host CPU series, on its GPU, labelled with its pod."""
    assert len(scrape.of("gpu_process_memory_used_bytes")) == len(processes)
    for proc in processes:
        gpu = str(proc["gpu"])
        namespace, pod, container = OWNERS[proc["pid"]]
        labels = {"pid": str(proc["pid"]), "gpu": gpu, "uuid": uuid[gpu]}
        labels |= {"namespace": namespace, "pod": pod, "container": container}
        assert scrape.one("gpu_process_memory_used_bytes", **labels) > 0, proc
        assert len(scrape.of("gpu_process_host_cpu_seconds_total", **labels)) == 1, proc


def check_allocations(scrape: Scrape, uuid: dict[str, str]) -> None:
    """Every allocated GPU, idle or not, has a row per pod holding it: three on the time-sliced GPU 2."""
    rows: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for s in scrape.of("gpu_allocation_info"):
        assert s.value == 1.0 and s.labels["uuid"] == uuid[s.labels["gpu"]] and s.labels["mig_uuid"] == ""
        rows[s.labels["gpu"]].add(tuple(s.labels[k] for k in ("namespace", "pod", "container", "resource")))
    assert rows == ALLOCATIONS
    assert len(rows["2"]) == 3


def check_inference(scrape: Scrape, uuid: dict[str, str]) -> None:
    """inference_* series per model and GPU(s), with the engine's gauges and histograms."""
    engine = engine_labels(uuid)
    assert scrape.one("inference_engine_up", **engine) == 1.0
    model = {k: v for k, v in engine.items() if k not in ("gpu", "uuid")}
    gpu_rows = {(s.labels["gpu"], s.labels["uuid"]) for s in scrape.of("inference_engine_gpu_info", **model)}
    assert gpu_rows == {("0", uuid["0"]), ("1", uuid["1"])}
    for name, found in scrape.samples.items():
        if name.startswith("inference_") and name != "inference_engine_gpu_info":
            assert all(engine.items() <= s.labels.items() for s in found if "gpu" in s.labels), name
    assert scrape.one("inference_kv_cache_usage_ratio", **engine) == pytest.approx(KV_USAGE)
    for family in ("inference_batch_latency_seconds", "inference_time_to_first_token_seconds"):
        buckets = scrape.of(f"{family}_bucket", **engine)
        assert len(buckets) > 5 and buckets[-1].labels["le"] == "+Inf", family
        assert scrape.one(f"{family}_count", **engine) == buckets[-1].value > 0, family
    assert scrape.one("inference_batch_latency_source_info", engine="vllm", proxy="true") == 1.0


def check_counters(warm: Scrape, before: Scrape, uuid: dict[str, str]) -> None:
    """KV-cache hits and queries are token counters whose increase ratio is the engine's hit rate."""
    engine = engine_labels(uuid)

    def increase(name: str, **labels: str) -> float:
        return before.one(name, **engine, **labels) - warm.one(name, **engine, **labels)

    seconds = BEFORE_AT_SECONDS - WARM_AT_SECONDS
    queries = increase("inference_kv_cache_queries_total", unit="tokens")
    hits = increase("inference_kv_cache_hits_total", unit="tokens")
    assert queries == pytest.approx(REQUESTS_PER_SECOND * PROMPT_TOKENS * seconds, rel=0.01)
    assert hits / queries == pytest.approx(HIT_RATE, abs=0.005)
    ttft = increase("inference_time_to_first_token_seconds_count")
    assert ttft == pytest.approx(REQUESTS_PER_SECOND * seconds, rel=0.01)


def check_weights(warm: Scrape, before: Scrape, after: Scrape) -> None:
    """The engine's weights are resident until the scenario evicts them at t=30 s."""
    owner = {"model": MODEL, "namespace": ENGINE_POD[0], "pod": ENGINE_POD[1]}
    assert after.one("model_weights_size_bytes", **owner) == 32 * MIB
    assert warm.one("model_weights_page_cache_resident_ratio", **owner) > 0.9
    assert before.one("model_weights_page_cache_resident_ratio", **owner) > 0.9
    assert after.one("model_weights_page_cache_resident_ratio", **owner) < 0.2


async def check_promtool(text: str) -> None:
    """promtool's exposition lint (the current line's) accepts the scraped page."""
    proc = await asyncio.create_subprocess_exec(
        str(neighbour_line().promtool), "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    output, _ = await asyncio.wait_for(proc.communicate(text.encode()), 30)
    assert proc.returncode == 0, output.decode()


def stepper(
    h: Harness, weights: PageCacheScenario, http: aiohttp.ClientSession, base: str
) -> Callable[[float], Awaitable[Scrape]]:
    """Move the scenario to time t, play its page-cache actions, sample once and scrape over HTTP."""

    async def step(t: float) -> Scrape:
        h.clock.set(t)
        await asyncio.to_thread(weights.apply, t)
        await h.tick(0.0)
        async with http.get(f"{base}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return parse(await resp.text())

    return step
