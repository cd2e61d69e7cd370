"""NVIDIA Triton (core, TensorRT-LLM backend, vLLM backend) -> ModelReading, one per Triton model.

The vLLM backend reuses `vllm:` names with `model`/`version` labels and other buckets, which is why
detection looks at labels, not only prefixes. Its released versions (main up to r25.12) export only
counters and histograms; the gauges `vllm:num_requests_running`, `_waiting` and
`vllm:gpu_cache_usage_perc` (and the queue-time and iteration-token histograms) come with
vllm_backend PR #92, read when present.

The TensorRT-LLM backend's `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}` gauges: 2025+
releases have `fraction` and a `waiting` request type; the 2024 ones have only max/free/used/
tokens_per/reused, so usage is used/max and waiting falls back to Triton's pending count. Where
`alloc_total` exists (a 2024 branch of the backend), blocks served from the cache (`reused`) and
blocks taken from the free pool (`alloc_total`) are both cumulative, so reused / (reused +
alloc_total) is a block hit ratio: of all blocks a request needed, the share the cache supplied
(decode-time allocations count as misses, so it is a lower bound of the prompt hit ratio).
"""

from __future__ import annotations

from exporter.engines.reading import (
    DECODE,
    MIXED,
    BatchSource,
    ModelReading,
    ModelView,
    counter_value,
    gauge_value,
    histogram_sum,
    merge_histograms,
    models,
)
from exporter.exposition.parse import Exposition, Sample

KIND = "triton"
MODEL_LABEL = "model"
DERIVED_SOURCE = "nv_inference_compute_infer_duration_us/nv_inference_request_success"
FAMILIES = frozenset(
    {
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
        "nv_inference_pending_request_count",
        "nv_inference_first_response_histogram_ms",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_request_success",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:iteration_tokens_total",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "nv_llm_input_token_len",
        "nv_llm_output_token_len",
    }
)

# Families that only an LLM model has; when present, plain helper models (tokenizers, ensembles) are
# left out so they do not show up as idle inference engines.
_LLM_PREFIXES = ("nv_trt_llm_", "nv_llm_", "vllm:", "nv_inference_first_response_histogram_ms")


def _llm_models(expo: Exposition) -> list[str]:
    found: set[str] = set()
    for prefix in _LLM_PREFIXES:
        found.update(m for m in models(expo, prefix, MODEL_LABEL) if m)
    return sorted(found) or [m for m in models(expo, "nv_inference_", MODEL_LABEL) if m]


def _labelled(samples: list[Sample], key: str, value: str) -> list[Sample]:
    return [s for s in samples if s.labels.get(key) == value]


def _kv_blocks(v: ModelView, r: ModelReading) -> None:
    blocks = v.gauge("nv_trt_llm_kv_cache_block_metrics")
    if not blocks:
        return
    r.kv_usage_ratio = gauge_value(_labelled(blocks, "kv_cache_block_type", "fraction"), "mean")
    if r.kv_usage_ratio is None:
        used = gauge_value(_labelled(blocks, "kv_cache_block_type", "used"))
        most = gauge_value(_labelled(blocks, "kv_cache_block_type", "max"))
        if used is not None and most:
            r.kv_usage_ratio = used / most
    reused = gauge_value(_labelled(blocks, "kv_cache_block_type", "reused"))
    allocated = gauge_value(_labelled(blocks, "kv_cache_block_type", "alloc_total"))
    if reused is not None and allocated is not None:
        r.kv_hits, r.kv_queries, r.kv_unit = reused, reused + allocated, "blocks"


def _tokens(v: ModelView, r: ModelReading) -> None:
    """vLLM backend: vLLM's counters; TRT-LLM backend: the _sum of its per-response token histograms."""
    r.prompt_tokens = counter_value(v.counter("vllm:prompt_tokens_total"))
    if r.prompt_tokens is None:
        r.prompt_tokens = histogram_sum(
            v.histogram("nv_llm_input_token_len"),
            lambda lb: lb.get("response_metric_type") == "total_input_tokens",
        )
    r.generation_tokens = counter_value(v.counter("vllm:generation_tokens_total"))
    if r.generation_tokens is None:
        r.generation_tokens = histogram_sum(
            v.histogram("nv_llm_output_token_len"),
            lambda lb: lb.get("response_metric_type") == "total_output_tokens",
        )


def normalize(expo: Exposition) -> list[ModelReading]:
    """Map a Triton exposition to one reading per LLM model."""
    out: list[ModelReading] = []
    for model in _llm_models(expo):
        v = ModelView(expo, MODEL_LABEL, model)
        r = ModelReading(model=model)
        req = v.gauge("nv_trt_llm_request_metrics")
        r.running = gauge_value(_labelled(req, "request_type", "active"))
        if r.running is None:
            r.running = gauge_value(v.gauge("vllm:num_requests_running"))
        r.waiting = gauge_value(_labelled(req, "request_type", "waiting"))
        if r.waiting is None:
            r.waiting = gauge_value(v.gauge("vllm:num_requests_waiting"))
        if r.waiting is None:
            r.waiting = gauge_value(v.gauge("nv_inference_pending_request_count"))
        _kv_blocks(v, r)
        if r.kv_usage_ratio is None:
            r.kv_usage_ratio = gauge_value(v.gauge("vllm:gpu_cache_usage_perc"), "mean")

        _tokens(v, r)
        r.ttft = merge_histograms(v.histogram("vllm:time_to_first_token_seconds"))
        if r.ttft is None:
            r.ttft = merge_histograms(v.histogram("nv_inference_first_response_histogram_ms"), scale=1e-3)
        r.itl = merge_histograms(v.histogram("vllm:time_per_output_token_seconds"))
        r.e2e = merge_histograms(v.histogram("vllm:e2e_request_latency_seconds"))
        r.queue_time = merge_histograms(v.histogram("vllm:request_queue_time_seconds"))
        r.batch_tokens = merge_histograms(v.histogram("vllm:iteration_tokens_total"))
        if r.itl is not None:
            r.batch = {DECODE: r.itl}
            r.batch_source = BatchSource("vllm:time_per_output_token_seconds", proxy=True)
        else:
            busy_us = counter_value(v.counter("nv_inference_compute_infer_duration_us"))
            done = counter_value(v.counter("nv_inference_request_success"))
            if busy_us is not None and done is not None:
                # Every request of a batch is charged the whole batch's compute time, so the
                # per-round mean is a request-weighted batch compute time.
                r.batch_counters = {MIXED: (busy_us * 1e-6, done)}
                r.batch_source = BatchSource(DERIVED_SOURCE, proxy=True)
        out.append(r)
    return out
