"""Per-engine, per-generation normalization from the reference expositions, and the parser traps."""

from __future__ import annotations

import math

import pytest

from exporter.engines.detect import NORMALIZERS, PREFIXES, WANTED, detect_kind
from exporter.engines.reading import ModelReading
from exporter.errors import ExpositionError
from exporter.exposition.parse import parse_exposition

from .conftest import expo_of, load_fixture

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-8B"


def readings(name: str) -> tuple[str, list[ModelReading]]:
    expo = expo_of(name)
    kind = detect_kind(expo)
    assert kind is not None
    return kind, NORMALIZERS[kind](expo)


def only(name: str) -> ModelReading:
    _, rs = readings(name)
    assert len(rs) == 1
    return rs[0]


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("vllm-0.33.0", "vllm"),
        ("vllm-0.9.1", "vllm"),
        ("vllm-v0-0.7.3", "vllm"),
        ("vllm-ray-0.33.0", "vllm"),
        ("sglang-0.5.23", "sglang"),
        ("sglang-ray-0.5.23", "sglang"),
        ("tgi-3.3", "tgi"),
        ("triton-trtllm-2.73", "triton"),
        ("triton-vllm-backend", "triton"),
        ("triton-vllm-backend-pr92", "triton"),
        ("triton-trtllm-2024", "triton"),
        ("trtllm-serve-2026", "trtllm"),
        ("trtllm-serve-2025", "trtllm"),
        ("dynamo-frontend", "dynamo"),
    ],
)
def test_engine_kind_detected_from_prefixes_and_labels(fixture: str, kind: str) -> None:
    assert detect_kind(expo_of(fixture)) == kind


def test_vllm_current_generation_maps_every_signal() -> None:
    r = only("vllm-0.33.0")
    assert r.model == LLAMA
    assert (r.running, r.waiting, r.kv_usage_ratio) == (24.0, 3.0, 0.6734)
    assert (r.kv_hits, r.kv_queries, r.kv_unit) == (1_212_416.0, 1_843_208.0, "tokens")
    assert r.kv_hit_ratio is None
    assert r.ttft is not None and r.ttft.count == 1812.0 and r.ttft.buckets[3] == (0.02, 12.0)
    assert r.itl is not None and r.itl.count == 400_301.0
    assert r.e2e is not None and r.e2e.count == 1800.0 and r.e2e.buckets[-1] == (float("inf"), 1800.0)
    assert r.batch == {"decode": r.itl}
    assert r.batch_source is not None and r.batch_source.source == "vllm:inter_token_latency_seconds"
    assert r.batch_source.proxy is True
    assert r.queue_time is not None and r.queue_time.count == 1800.0
    # iteration_tokens_total: tokens per engine step, one observation per step
    assert r.batch_tokens is not None and r.batch_tokens.count == 8649.0


def test_counter_total_suffix_trap_counters_found_by_base_name() -> None:
    expo = expo_of("vllm-0.33.0")
    # The parser names the family `vllm:prefix_cache_hits`; the wire sample keeps `_total`.
    assert "vllm:prefix_cache_hits" in expo.counters
    assert expo.counter("vllm:prefix_cache_hits_total")[0].value == 1_212_416.0
    # TGI counters carry no `_total` on the wire; they are found by the same base name.
    tgi = parse_exposition(load_fixture("tgi-3.3"))
    assert tgi.counter("tgi_request_count")[0].value == 1806.0


def test_histogram_named_total_is_not_a_counter() -> None:
    expo = expo_of("vllm-0.33.0")
    assert "vllm:iteration_tokens_total" in expo.histograms
    assert "vllm:iteration_tokens" not in expo.counters


def test_created_series_are_ignored() -> None:
    expo = expo_of("vllm-0.33.0")
    assert not [n for n in expo.names() if n.endswith("_created")]


def test_multiprocess_pid_label_is_not_summed_into_usage() -> None:
    r = only("vllm-0.10.2-multiproc")
    assert r.kv_usage_ratio == pytest.approx(0.6734)  # two API servers report the same engine


def test_old_and_new_vllm_names_side_by_side_are_counted_once() -> None:
    r = only("vllm-0.10.2-multiproc")
    assert (r.kv_hits, r.kv_queries) == (1_212_416.0, 1_843_208.0)
    assert r.itl is not None and r.itl.count == 400_301.0


def test_vllm_091_renamed_families_in_tokens() -> None:
    r = only("vllm-0.9.1")
    assert (r.kv_hits, r.kv_queries, r.kv_unit) == (1_212_416.0, 1_843_208.0, "tokens")
    assert r.kv_usage_ratio == 0.6734
    assert r.batch_source is not None and r.batch_source.source == "vllm:time_per_output_token_seconds"


def test_vllm_085_prefix_cache_counted_in_blocks() -> None:
    r = only("vllm-0.8.5")
    assert (r.kv_hits, r.kv_queries, r.kv_unit) == (37_888.0, 57_600.0, "blocks")


def test_vllm_v0_passes_through_hit_ratio_only() -> None:
    r = only("vllm-v0-0.7.3")
    assert r.kv_hits is None and r.kv_queries is None
    assert r.kv_hit_ratio == 0.6577
    assert r.kv_usage_ratio == 0.6734


def test_ray_prefix_normalized_to_vllm_names() -> None:
    ray, plain = only("vllm-ray-0.33.0"), only("vllm-0.33.0")
    assert expo_of("vllm-ray-0.33.0").ray_prefixed
    assert (ray.kv_hits, ray.kv_queries, ray.running, ray.kv_usage_ratio) == (
        plain.kv_hits,
        plain.kv_queries,
        plain.running,
        plain.kv_usage_ratio,
    )
    assert ray.ttft == plain.ttft


def test_data_parallel_engines_summed_and_usage_averaged() -> None:
    r = only("vllm-0.33.0-dp2")
    assert (r.running, r.waiting) == (48.0, 6.0)
    assert r.kv_hits == 2 * 1_212_416.0
    assert r.kv_usage_ratio == pytest.approx(0.6734)
    assert r.itl is not None and r.itl.count == 2 * 400_301.0


def test_released_triton_vllm_backend_has_no_scheduler_gauges() -> None:
    kind, rs = readings("triton-vllm-backend")
    assert kind == "triton"
    (r,) = rs
    assert r.model == "vllm_model"
    assert r.kv_hits is None and r.kv_usage_ratio is None and r.running is None
    assert r.ttft is not None and r.ttft.buckets[0] == (0.001, 0.0) and len(r.ttft.buckets) == 17
    assert r.waiting == 2.0  # Triton's own pending count: the backend (up to r25.12) has no waiting gauge


def test_triton_vllm_backend_pr92_gauges_are_read_not_the_pending_count() -> None:
    kind, rs = readings("triton-vllm-backend-pr92")
    assert kind == "triton"
    (r,) = rs
    assert (r.running, r.waiting, r.kv_usage_ratio) == (24.0, 3.0, 0.6734)  # pending count says 2
    assert r.queue_time is not None and r.queue_time.count == 1800
    assert r.queue_time.buckets[0] == (0.3, 1710.0)
    assert r.batch_tokens is not None and r.batch_tokens.count == 62716
    assert r.batch == {"decode": r.itl} and r.batch_source is not None
    assert r.batch_source.source == "vllm:time_per_output_token_seconds"


@pytest.mark.parametrize("fixture", ["sglang-0.5.23", "sglang-0.5.14", "sglang-0.4.10", "sglang-ray-0.5.23"])
def test_sglang_generations_give_the_same_token_hit_counters(fixture: str) -> None:
    r = only(fixture)
    assert r.model == QWEN
    assert (r.kv_hits, r.kv_queries, r.kv_unit) == (3_910_112.0, 5_114_542.0, "tokens")
    assert r.kv_hit_ratio is None
    assert (r.running, r.waiting, r.kv_usage_ratio) == (37.0, 5.0, 0.41)


def test_sglang_device_timer_gives_a_real_step_time_per_phase() -> None:
    r = only("sglang-0.5.23")  # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1
    assert r.batch_source is not None and r.batch_source.proxy is False
    assert r.batch_source.source == "sglang:forward_execution_seconds_total/sglang:cuda_graph_passes_total"
    assert r.batch_counters["decode"] == pytest.approx((4120.902, 181203.0 + 12.0))
    assert r.batch_counters["prefill"] == pytest.approx((812.337, 19344.0))
    assert r.batch == {}  # the histograms are built by the collector from the counters' increases


def test_sglang_without_device_timer_falls_back_to_inter_token_latency() -> None:
    r = only("sglang-0.4.10")
    assert r.batch_counters == {}
    assert r.batch == {"decode": r.itl} and r.batch_source is not None and r.batch_source.proxy


def test_sglang_multiprocess_histogram_order_sum_first() -> None:
    r = only("sglang-0.5.23")
    assert r.ttft is not None and r.ttft.count == 1800.0
    assert r.ttft.sum == pytest.approx(588.6812346632702)


def test_tgi_batch_latency_is_a_real_histogram_kept_apart_per_phase() -> None:
    r = only("tgi-3.3")
    assert r.model == ""
    assert (r.running, r.waiting) == (24.0, 3.0)
    assert set(r.batch) == {"prefill", "decode"}
    assert (r.batch["prefill"].count, r.batch["decode"].count) == (912, 61804)
    assert r.batch["prefill"].sum == pytest.approx(117.1155152735879)
    assert r.batch["decode"].sum == pytest.approx(1410.139859809763)
    assert r.batch_source is not None and r.batch_source.proxy is False
    assert r.queue_time is not None and r.queue_time.count == 1800
    assert r.kv_usage_ratio is None and r.kv_hits is None
    assert r.e2e is not None and r.e2e.count == 1800


def test_triton_trtllm_backend_reads_labelled_gauges_and_ms_histogram() -> None:
    kind, rs = readings("triton-trtllm-2.73")
    assert kind == "triton"
    (r,) = rs  # the ensemble model carries no LLM families
    assert r.model == "tensorrt_llm"
    assert (r.running, r.waiting) == (24.0, 3.0)
    assert r.kv_usage_ratio == pytest.approx(0.6735493318689365)
    assert r.kv_hits is None  # only the `reused` numerator exists
    assert r.ttft is not None and r.ttft.buckets[0] == (0.1, 560.0) and r.ttft.sum == pytest.approx(366.076)
    assert r.batch_counters["mixed"] == pytest.approx((13187.664021, 1800.0))


def test_triton_trtllm_2024_generation_derives_usage_from_used_over_max() -> None:
    (r,) = readings("triton-trtllm-2024")[1]
    assert r.kv_usage_ratio == pytest.approx(18398 / 27315)  # no `fraction` block type yet
    assert r.running == 24.0
    assert r.waiting == 0.0  # no `waiting` request type: Triton's pending count
    assert r.kv_hits is None  # `reused` alone is a numerator without a denominator


def test_triton_trtllm_alloc_total_gives_a_block_hit_ratio() -> None:
    # The 2024 branch of tensorrtllm_backend (refs/pull/592) adds alloc_total and alloc_new.
    fam = "nv_trt_llm_kv_cache_block_metrics"
    row = fam + '{{kv_cache_block_type="{}",model="tensorrt_llm",version="1"}} {}'
    text = load_fixture("triton-trtllm-2024").replace(
        row.format("reused", 47711),
        "\n".join(
            (row.format("alloc_total", 81630), row.format("alloc_new", 62310), row.format("reused", 47711))
        ),
    )
    expo = parse_exposition(text, wanted=WANTED, note_prefixes=PREFIXES)
    (r,) = NORMALIZERS["triton"](expo)
    assert (r.kv_hits, r.kv_queries, r.kv_unit) == (47711.0, 47711.0 + 81630.0, "blocks")


@pytest.mark.parametrize("fixture", ["trtllm-serve-2026", "trtllm-serve-2025"])
def test_trtllm_serve_token_hits_and_iteration_gauge(fixture: str) -> None:
    r = only(fixture)
    assert r.model == ""  # "undefined" is not a model name
    # cached prompt tokens over prompt tokens win over the block counters
    assert (r.kv_hits, r.kv_queries, r.kv_unit) == (1_212_416.0, 1_843_208.0, "tokens")
    assert r.kv_hit_ratio is None
    assert (r.running, r.waiting, r.kv_usage_ratio) == (24.0, 3.0, 0.6735)
    assert r.batch_gauge_seconds == 0.02317
    assert r.ttft is not None and r.ttft.count == 1800.0


def test_dynamo_does_not_export_the_routers_predicted_hit_rate() -> None:
    r = only("dynamo-frontend")
    assert r.model == "qwen3-8b"
    assert r.kv_hit_ratio == 0.71  # worker kvstats gauge, not router_kv_hit_rate
    assert (r.running, r.waiting, r.kv_usage_ratio) == (31.0, 4.0, 0.52)
    assert r.ttft is not None and r.ttft.count == 1800.0


@pytest.mark.parametrize("payload", ["<html>not metrics</html>\n", 'vllm:x{a="1" 1\n', "\x00\x01garbage{{{"])
def test_garbage_payload_raises_exposition_error(payload: str) -> None:
    with pytest.raises(ExpositionError):
        parse_exposition(payload)


def test_openmetrics_style_values_and_label_orders_accepted() -> None:
    text = load_fixture("triton-trtllm-2.73")
    assert "13187664021" in text  # prometheus-cpp %.16g integers parse as floats
    assert expo_of("triton-trtllm-2.73").counter("nv_inference_compute_infer_duration_us")


def test_trtllm_serve_block_counters_when_no_token_counters() -> None:
    text = "\n".join(
        line for line in load_fixture("trtllm-serve-2026").splitlines() if "prompt_cached_tokens" not in line
    )
    (r,) = NORMALIZERS["trtllm"](parse_exposition(text, wanted=WANTED, note_prefixes=PREFIXES))
    assert (r.kv_hits, r.kv_queries, r.kv_unit) == (37_888.0, 57_600.0, "blocks")


@pytest.mark.parametrize("fixture", ["tgi-3.3", "trtllm-serve-2026", "sglang-0.5.23", "vllm-0.33.0"])
def test_request_queue_time_is_read_where_the_engine_has_it(fixture: str) -> None:
    r = only(fixture)
    assert r.queue_time is not None and r.queue_time.count > 0


def test_vllm_v0_without_step_histograms_falls_back_to_model_forward_time() -> None:
    # vLLM V0 with --collect-detailed-traces, and no TPOT/ITL family on the page
    lines = [
        line
        for line in load_fixture("vllm-v0-0.7.3").splitlines()
        if "time_per_output_token" not in line and "inter_token_latency" not in line
    ]
    forward = [
        "# HELP vllm:model_forward_time_milliseconds Histogram of time spent in the model forward pass.",
        "# TYPE vllm:model_forward_time_milliseconds histogram",
        'vllm:model_forward_time_milliseconds_bucket{le="10.0",model_name="m"} 3.0',
        'vllm:model_forward_time_milliseconds_bucket{le="25.0",model_name="m"} 9.0',
        'vllm:model_forward_time_milliseconds_bucket{le="+Inf",model_name="m"} 10.0',
        'vllm:model_forward_time_milliseconds_count{model_name="m"} 10.0',
        'vllm:model_forward_time_milliseconds_sum{model_name="m"} 180.0',
    ]
    expo = parse_exposition("\n".join(lines + forward) + "\n", wanted=WANTED, note_prefixes=PREFIXES)
    r = next(r for r in NORMALIZERS["vllm"](expo) if r.model == "m")
    assert r.itl is None
    assert set(r.batch) == {"mixed"}
    assert r.batch["mixed"].buckets == ((0.01, 3.0), (0.025, 9.0), (math.inf, 10.0))  # ms -> s
    assert r.batch["mixed"].sum == pytest.approx(0.18)
    assert r.batch_source is not None and r.batch_source.source == "vllm:model_forward_time_milliseconds"


@pytest.mark.parametrize(
    ("fixture", "prompt", "generated"),
    [
        ("vllm-0.33.0", 1_843_208.0, 402_113.0),
        ("vllm-v0-0.7.3", 1_843_208.0, 402_113.0),
        ("vllm-0.10.2-multiproc", 1_843_208.0, 402_113.0),
        ("vllm-ray-0.33.0", 1_843_208.0, 402_113.0),
        ("vllm-0.33.0-dp2", 2 * 1_843_208.0, 2 * 402_113.0),  # both data-parallel engines summed
        ("sglang-0.5.23", 5_114_542.0, 2_288_015.0),
        ("sglang-0.4.10", 5_114_542.0, 2_288_015.0),
        ("sglang-ray-0.5.23", 5_114_542.0, 2_288_015.0),
        ("triton-vllm-backend", 1_843_208.0, 402_113.0),
        ("trtllm-serve-2026", 1_843_208.0, 402_113.0),
        ("trtllm-serve-2025", 1_843_208.0, 402_113.0),
    ],
)
def test_prompt_and_generated_token_counters_normalized(
    fixture: str, prompt: float, generated: float
) -> None:
    r = only(fixture)
    assert (r.prompt_tokens, r.generation_tokens) == (prompt, generated)


def test_vllm_prompt_tokens_by_source_are_not_added_to_the_total() -> None:
    # vllm 0.33 has prompt_tokens_total and prompt_tokens_by_source_total (the same tokens split).
    expo = expo_of("vllm-0.33.0")
    assert "vllm:prompt_tokens_by_source" not in expo.counters  # not even kept by the parser
    assert only("vllm-0.33.0").prompt_tokens == 1_843_208.0


def _tgi_token_histograms(max_input_tokens: int, max_total_tokens: int) -> str:
    """TGI's token histograms as metrics-exporter-prometheus renders them (router/src/server.rs buckets)."""

    def render(name: str, help_text: str, bound: int, counts: list[int], total: int) -> str:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for i, c in enumerate(counts):
            le = bound / 100.0 * (i + 1)
            lines.append(f'{name}_bucket{{le="{int(le) if le.is_integer() else le!r}"}} {c}')
        lines += [
            f'{name}_bucket{{le="+Inf"}} {counts[-1]}',
            f"{name}_sum {total}",
            f"{name}_count {counts[-1]}",
        ]
        return "\n".join(lines) + "\n"

    # 1800 requests; cumulative counts rise linearly to 1800 at the 50th bucket.
    counts = [min(1800, 36 * (i + 1)) for i in range(100)]
    return (
        "\n"
        + render("tgi_request_input_length", "Input tokens per request", max_input_tokens, counts, 1843208)
        + "\n"
        + render(
            "tgi_request_generated_tokens", "Generated tokens per request", max_total_tokens, counts, 402113
        )
    )


def test_tgi_tokens_are_the_sums_of_its_token_histograms() -> None:
    text = load_fixture("tgi-3.3") + _tgi_token_histograms(8191, 8192)
    (r,) = NORMALIZERS["tgi"](parse_exposition(text, wanted=WANTED, note_prefixes=PREFIXES))
    assert (r.prompt_tokens, r.generation_tokens) == (1_843_208.0, 402_113.0)
    assert only("tgi-3.3").prompt_tokens is None  # no histogram, no token count (never a 0)


def test_triton_trtllm_tokens_from_the_per_response_histograms() -> None:
    # custom_metrics_reporter.cc creates nv_llm_input_token_len beside the output histogram (same buckets).
    head = "nv_llm_input_token_len"
    labels = 'model="tensorrt_llm",response_metric_type="total_input_tokens",version="1"'
    bounds = ("10", "50", "100", "500", "1000", "+Inf")
    extra = "\n".join(
        [f"# HELP {head} TRT LLM response metrics", f"# TYPE {head} histogram"]
        + [f"{head}_count{{{labels}}} 1800", f"{head}_sum{{{labels}}} 1843208"]
        + [
            f'{head}_bucket{{{labels},le="{b}"}} {n}'
            for b, n in zip(bounds, (0, 0, 12, 402, 1107, 1800), strict=True)
        ]
    )
    (r,) = NORMALIZERS["triton"](
        parse_exposition(
            load_fixture("triton-trtllm-2.73") + extra + "\n", wanted=WANTED, note_prefixes=PREFIXES
        )
    )
    assert (r.prompt_tokens, r.generation_tokens) == (1_843_208.0, 589_144.0)
    r24 = only_of_kind("triton-trtllm-2024")
    assert (r24.prompt_tokens, r24.generation_tokens) == (None, 589_144.0)  # released page: output only


def only_of_kind(name: str) -> ModelReading:
    (r,) = readings(name)[1]
    return r


def test_engines_without_token_counters_report_none() -> None:
    for name in ("vllm-0.9.1", "dynamo-frontend"):
        r = readings(name)[1][0]
        assert (r.prompt_tokens, r.generation_tokens) == (None, None)
