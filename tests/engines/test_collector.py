"""The engines collector: isolation of failing endpoints, caps, removal, GPU mapping, rendering."""

from __future__ import annotations

import asyncio
import math
from asyncio.subprocess import PIPE, STDOUT

import pytest

from demo.neighbours import line as neighbour_line
from exporter.collectors.base import GpuProcess, GpuRef, NodeState, PodRef
from exporter.engines.collector import EnginesCollector
from exporter.engines.settings import EngineSettings
from exporter.engines.targets import Target
from exporter.exposition.parse import parse_exposition
from gpupulse.metrics.engines import ENGINE_METRICS

from .conftest import FakeClock, ListSource, free_port, render_text, samples, value

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
FAST = EngineSettings(scrape_timeout_seconds=0.5, max_response_bytes=256 * 1024)


def up_of(metrics: list, url: str) -> float:  # type: ignore[type-arg]
    return value(metrics, "inference_engine_up", endpoint=url)


async def test_failing_endpoints_mark_only_their_own_up(fake_engines: str, clock: FakeClock) -> None:
    good = Target(f"{fake_engines}/vllm-0.33.0", namespace="serving", pod="llama-0")
    bad = {
        "timeout": Target(f"{fake_engines}/slow"),
        "parse": Target(f"{fake_engines}/garbage"),
        "too_large": Target(f"{fake_engines}/huge"),
        "http_status": Target(f"{fake_engines}/error"),
        "refused": Target(f"http://127.0.0.1:{free_port()}/metrics"),
    }
    collector = EnginesCollector([ListSource([good, *bad.values()])], FAST, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert up_of(metrics, good.url) == 1.0
    assert value(metrics, "inference_kv_cache_hits_total", model=LLAMA, unit="tokens") == 1_212_416.0
    assert value(metrics, "inference_requests_running", model=LLAMA, pod="llama-0") == 24.0
    for reason, target in bad.items():
        assert up_of(metrics, target.url) == 0.0, reason
        assert (
            value(metrics, "inference_engine_scrape_failures_total", endpoint=target.url, reason=reason) == 1
        )
    assert not samples(metrics, "inference_engine_scrape_failures_total", endpoint=good.url)


async def test_all_families_are_catalog_names_and_render_valid(fake_engines: str, clock: FakeClock) -> None:
    urls = ["vllm-0.33.0", "tgi-3.3", "sglang-0.5.23", "trtllm-serve-2026", "triton-trtllm-2.73"]
    collector = EnginesCollector([ListSource([Target(f"{fake_engines}/{u}") for u in urls])], FAST, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    catalog = {s.name for s in ENGINE_METRICS} | {"gpupulse_series_dropped_total"}
    for fam in metrics:
        name = fam.name + ("_total" if fam.type == "counter" else "")
        assert name in catalog, name
    text = render_text(metrics)
    reparsed = parse_exposition(text)
    assert "inference_batch_latency_seconds" in reparsed.histograms
    kinds = {s.labels["engine"] for s in reparsed.gauge("inference_engine_up")}
    assert kinds == {"vllm", "tgi", "sglang", "trtllm", "triton"}
    sources = {
        (s.labels["engine"], s.labels["proxy"]) for s in reparsed.gauge("inference_batch_latency_source_info")
    }
    assert ("tgi", "false") in sources and ("vllm", "true") in sources


async def test_series_cap_drops_and_counts_but_keeps_up(fake_engines: str, clock: FakeClock) -> None:
    settings = EngineSettings(max_series_per_endpoint=10, scrape_timeout_seconds=2.0)
    target = Target(f"{fake_engines}/vllm-0.33.0")
    collector = EnginesCollector([ListSource([target])], settings, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
        assert up_of(metrics, target.url) == 1.0
        dropped_once = value(metrics, "gpupulse_series_dropped_total", collector="engines")
        assert dropped_once > 0
        assert not samples(metrics, "inference_request_latency_seconds_bucket")  # histograms did not fit
        total = sum(len(f.samples) for f in metrics) - 1  # minus the dropped counter itself
        assert total <= 10
        metrics = list(await collector.collect(NodeState()))
        assert value(metrics, "gpupulse_series_dropped_total", collector="engines") == 2 * dropped_once
    finally:
        await collector.close()


async def test_gone_endpoint_series_removed_next_round(fake_engines: str, clock: FakeClock) -> None:
    a, b = Target(f"{fake_engines}/vllm-0.33.0", pod="a"), Target(f"{fake_engines}/tgi-3.3", pod="b")
    source = ListSource([a, b])
    collector = EnginesCollector([source], FAST, clock)
    try:
        first = list(await collector.collect(NodeState()))
        assert samples(first, "inference_requests_running", pod="a")
        source.items = [b]
        second = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    for fam in second:
        assert all(s.labels.get("pod") != "a" for s in fam.samples), fam.name
    assert samples(second, "inference_requests_running", pod="b")


async def test_pod_allocations_give_sorted_gpu_lists_and_info_rows(
    fake_engines: str, clock: FakeClock
) -> None:
    pod = PodRef("serving", "llama-0", "vllm")
    state = NodeState(
        gpus=[GpuRef(f"GPU-{i}", str(i), "H100", f"0000:{i:02x}:00.0") for i in range(4)],
        allocations={"GPU-3": [pod], "GPU-1": [pod], "GPU-2": [PodRef("other", "x", "c")]},
    )
    target = Target(f"{fake_engines}/vllm-0.33.0", namespace="serving", pod="llama-0")
    collector = EnginesCollector([ListSource([target])], FAST, clock)
    try:
        metrics = list(await collector.collect(state))
    finally:
        await collector.close()
    labels, _ = samples(metrics, "inference_kv_cache_usage_ratio")[0]
    assert (labels["gpu"], labels["uuid"]) == ("1,3", "GPU-1,GPU-3")
    rows = sorted((lb["gpu"], lb["uuid"]) for lb, _ in samples(metrics, "inference_engine_gpu_info"))
    assert rows == [("1", "GPU-1"), ("3", "GPU-3")]


async def test_model_override_applies_to_engines_without_model_label(
    fake_engines: str, clock: FakeClock
) -> None:
    target = Target(f"{fake_engines}/tgi-3.3", model="mistral-7b")
    collector = EnginesCollector([ListSource([target])], FAST, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert value(metrics, "inference_requests_waiting", model="mistral-7b") == 3.0
    count = "inference_batch_latency_seconds_count"
    assert value(metrics, count, model="mistral-7b", phase="prefill") == 912
    assert value(metrics, count, model="mistral-7b", phase="decode") == 61804


async def test_trtllm_iteration_gauge_sampled_into_derived_histogram(
    fake_engines: str, clock: FakeClock
) -> None:
    target = Target(f"{fake_engines}/trtllm-serve-2026", model="llama")
    collector = EnginesCollector([ListSource([target])], FAST, clock)
    try:
        await collector.collect(NodeState())
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert value(metrics, "inference_batch_latency_seconds_count", model="llama") == 2.0
    assert math.isclose(value(metrics, "inference_batch_latency_seconds_sum", model="llama"), 2 * 0.02317)
    assert value(metrics, "inference_batch_latency_seconds_bucket", model="llama", le="0.025") == 2.0
    info = samples(metrics, "inference_batch_latency_source_info", engine="trtllm")
    assert info and info[0][0]["proxy"] == "true"
    assert value(metrics, "inference_kv_cache_queries_total", model="llama", unit="tokens") == 1_843_208.0


async def test_engine_gpus_from_pid_tree_in_procfs(fake_engines: str, clock: FakeClock) -> None:
    from .conftest import FIXTURES

    settings = EngineSettings(procfs_path=FIXTURES / "procfs", scrape_timeout_seconds=2.0)
    state = NodeState(
        gpus=[GpuRef("GPU-a", "0", "H100", "b0"), GpuRef("GPU-b", "1", "H100", "b1")],
        processes=[GpuProcess("GPU-b", "1", 4250), GpuProcess("GPU-a", "0", 4300)],
    )
    target = Target(f"{fake_engines}/vllm-0.33.0", pid=4242)  # EngineCore 4250 is its child
    collector = EnginesCollector([ListSource([target])], settings, clock)
    try:
        metrics = list(await collector.collect(state))
    finally:
        await collector.close()
    labels, _ = samples(metrics, "inference_requests_running")[0]
    assert (labels["gpu"], labels["uuid"]) == ("1", "GPU-b")


async def test_endpoints_with_identical_labels_do_not_emit_duplicate_series(
    fake_engines: str, clock: FakeClock
) -> None:
    # Same engine, model and (empty) pod/GPU labels twice: only the first keeps its model series.
    a = Target(f"{fake_engines}/vllm-0.33.0")
    b = Target(f"{fake_engines}/vllm-0.33.0?copy=1")
    collector = EnginesCollector([ListSource([a, b])], FAST, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert len(samples(metrics, "inference_requests_running")) == 1
    assert up_of(metrics, a.url) == 1.0 and up_of(metrics, b.url) == 1.0
    # running, waiting, usage, hits+queries, prompt+generated tokens, and
    # batch/ttft/itl/e2e/queue-time/step-tokens histograms
    expected = 3 + 2 + 2 + (19 + 3) * 2 + (22 + 3) + (21 + 3) + (21 + 3) + (13 + 3)
    assert value(metrics, "gpupulse_series_dropped_total", collector="engines") == expected


async def test_normalizer_crash_is_contained_to_its_endpoint(
    fake_engines: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.engines import detect

    def boom(_: object) -> list[object]:
        raise KeyError("surprise")

    monkeypatch.setitem(detect.NORMALIZERS, "tgi", boom)
    good, bad = Target(f"{fake_engines}/vllm-0.33.0"), Target(f"{fake_engines}/tgi-3.3")
    collector = EnginesCollector([ListSource([good, bad])], FAST, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert up_of(metrics, good.url) == 1.0
    assert up_of(metrics, bad.url) == 0.0
    assert value(metrics, "inference_engine_scrape_failures_total", endpoint=bad.url, reason="normalize") == 1


@pytest.mark.integration
async def test_promtool_accepts_the_exposition(fake_engines: str, clock: FakeClock) -> None:
    urls = ["vllm-0.33.0", "tgi-3.3", "sglang-0.5.23", "trtllm-serve-2026", "triton-trtllm-2.73", "garbage"]
    collector = EnginesCollector(
        [ListSource([Target(f"{fake_engines}/{u}", pod=u) for u in urls])], FAST, clock
    )
    try:
        await collector.collect(NodeState())
        text = render_text(list(await collector.collect(NodeState())))
    finally:
        await collector.close()
    proc = await asyncio.create_subprocess_exec(
        str(neighbour_line().promtool), "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    out, _ = await proc.communicate(text.encode())
    assert proc.returncode == 0, out.decode()
