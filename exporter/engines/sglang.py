"""SGLang (0.4.x -> 0.5.23, and Ray's `sglang_` spelling) -> ModelReading.

KV hits, best source first: `prefill_effective_tokens_total{mode=*_hit}` / all modes (> 0.5.14);
`realtime_tokens_total{mode=prefill_cache}` / prefill_cache + prefill_compute (0.5.14);
`cached_tokens_total` / `prompt_tokens_total` (>= 0.4.10, counted per finished request). Only the
oldest releases fall back to the `cache_hit_rate` gauge (last prefill batch; percent before 0.4).
"""

from __future__ import annotations

from exporter.engines.exposition import Exposition
from exporter.engines.reading import (
    BatchSource,
    ModelReading,
    ModelView,
    counter_value,
    gauge_value,
    merge_histograms,
    models,
)

KIND = "sglang"
MODEL_LABEL = "model_name"


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
        r.ttft = merge_histograms(v.histogram("sglang:time_to_first_token_seconds"))
        r.itl = merge_histograms(v.histogram("sglang:inter_token_latency_seconds"))
        r.e2e = merge_histograms(v.histogram("sglang:e2e_request_latency_seconds"))
        if r.itl is not None:
            # The device-timer counters give only a mean and are opt-in; ITL is per token here.
            r.batch = r.itl
            r.batch_source = BatchSource("sglang:inter_token_latency_seconds", proxy=True)
        out.append(r)
    return out
