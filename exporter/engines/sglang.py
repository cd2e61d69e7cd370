"""SGLang (0.4.x -> 0.5.23, and Ray's `sglang_` spelling) -> ModelReading.

Batch latency, best source first: the device timer (`SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`),
`forward_execution_seconds_total{category}` (GPU-busy seconds of forward passes) over
`cuda_graph_passes_total{mode}` (passes), per phase: a real step time, averaged per round; else the
inter-token latency histogram as a proxy. Decode passes are counted in every release that has the
counter, prefill passes (`prefill_*` modes) only in newer ones: prefill is derived only where both
exist. The `extend` and `mixed` categories are prefill-carrying steps.

KV hits, best source first: `prefill_effective_tokens_total{mode=*_hit}` / all modes (> 0.5.14);
`realtime_tokens_total{mode=prefill_cache}` / prefill_cache + prefill_compute (0.5.14);
`cached_tokens_total` / `prompt_tokens_total` (>= 0.4.10, counted per finished request). Only the
oldest releases fall back to the `cache_hit_rate` gauge (last prefill batch; percent before 0.4).
"""

from __future__ import annotations

from exporter.engines.reading import (
    DECODE,
    PREFILL,
    BatchSource,
    ModelReading,
    ModelView,
    counter_value,
    gauge_value,
    merge_histograms,
    models,
)
from exporter.exposition.parse import Exposition

KIND = "sglang"
MODEL_LABEL = "model_name"
DEVICE_TIMER_SOURCE = "sglang:forward_execution_seconds_total/sglang:cuda_graph_passes_total"
FAMILIES = frozenset(
    {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:prefill_effective_tokens",
        "sglang:realtime_tokens",
        "sglang:cached_tokens",
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
        "sglang:cache_hit_rate",
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:queue_time_seconds",
        "sglang:forward_execution_seconds",
        "sglang:cuda_graph_passes",
    }
)
_PREFILL_CATEGORIES = ("extend", "mixed")


def _kv_counters(v: ModelView) -> tuple[float | None, float | None]:
    eff = v.counter("sglang:prefill_effective_tokens_total")
    if eff:
        return counter_value(eff, lambda lb: lb.get("mode", "").endswith("_hit")), counter_value(eff)
    realtime = v.counter("sglang:realtime_tokens_total")
    if any(s.labels.get("mode") == "prefill_cache" for s in realtime):
        hits = counter_value(realtime, lambda lb: lb.get("mode") == "prefill_cache")
        queries = counter_value(realtime, lambda lb: lb.get("mode") in ("prefill_cache", "prefill_compute"))
        return hits, queries
    cached = v.counter("sglang:cached_tokens_total")
    prompt = v.counter("sglang:prompt_tokens_total")
    if cached and prompt:
        # `cache_source="total"` is a fallback row, not an extra tier: never add it to the tiers.
        tiers = [s for s in cached if s.labels.get("cache_source") != "total"] or cached
        return counter_value(tiers), counter_value(prompt)
    return None, None


def _device_timer(v: ModelView) -> dict[str, tuple[float, float]]:
    """(GPU-busy seconds, passes) per phase from the device-timer counters; {} when they are off."""
    busy = v.counter("sglang:forward_execution_seconds_total")
    passes = v.counter("sglang:cuda_graph_passes_total")
    if not busy or not passes:
        return {}
    out: dict[str, tuple[float, float]] = {}
    decode_busy = counter_value(busy, lambda lb: lb.get("category") == "decode")
    decode_passes = counter_value(passes, lambda lb: lb.get("mode", "").startswith("decode_"))
    if decode_busy is not None and decode_passes is not None:
        out[DECODE] = (decode_busy, decode_passes)
    prefill_busy = counter_value(busy, lambda lb: lb.get("category") in _PREFILL_CATEGORIES)
    prefill_passes = counter_value(passes, lambda lb: lb.get("mode", "").startswith("prefill_"))
    if prefill_busy is not None and prefill_passes is not None:
        out[PREFILL] = (prefill_busy, prefill_passes)
    return out


def normalize(expo: Exposition) -> list[ModelReading]:
    """Map an SGLang exposition to one reading per model_name (ranks summed)."""
    out: list[ModelReading] = []
    for model in models(expo, "sglang:", MODEL_LABEL):
        v = ModelView(expo, MODEL_LABEL, model)
        r = ModelReading(model=model)
        r.running = gauge_value(v.gauge("sglang:num_running_reqs"))
        r.waiting = gauge_value(v.gauge("sglang:num_queue_reqs"))
        r.kv_usage_ratio = gauge_value(v.gauge("sglang:token_usage"), "mean")
        r.kv_hits, r.kv_queries = _kv_counters(v)
        r.kv_unit = "tokens"
        if r.kv_queries is None:
            ratio = gauge_value(v.gauge("sglang:cache_hit_rate"), "mean")
            if ratio is not None and ratio > 1.0:
                ratio /= 100.0  # 2024-era SGLang reported percent
            r.kv_hit_ratio = ratio
        # Counted per finished request; summed over `is_streaming` and the other split labels.
        r.prompt_tokens = counter_value(v.counter("sglang:prompt_tokens_total"))
        r.generation_tokens = counter_value(v.counter("sglang:generation_tokens_total"))
        r.ttft = merge_histograms(v.histogram("sglang:time_to_first_token_seconds"))
        r.itl = merge_histograms(v.histogram("sglang:inter_token_latency_seconds"))
        r.e2e = merge_histograms(v.histogram("sglang:e2e_request_latency_seconds"))
        r.queue_time = merge_histograms(v.histogram("sglang:queue_time_seconds"))
        timer = _device_timer(v)
        if timer:
            r.batch_counters = timer
            r.batch_source = BatchSource(DEVICE_TIMER_SOURCE, proxy=False)
        elif r.itl is not None:
            r.batch = {DECODE: r.itl}
            r.batch_source = BatchSource("sglang:inter_token_latency_seconds", proxy=True)
        out.append(r)
    return out
