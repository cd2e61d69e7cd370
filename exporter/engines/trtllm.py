"""TensorRT-LLM `trtllm-serve` (`trtllm_` prefix, and the older un-prefixed request histograms).

KV hits, best source first: prompt tokens served from the cache, `trtllm_prompt_cached_tokens_total`
over `trtllm_prompt_tokens_total` (tokens, counted per finished request: what users mean by a hit
rate, and comparable with vLLM and SGLang); else `trtllm_kv_cache_reused_blocks_total` over reused +
`missed` (blocks, per iteration); else the `trtllm_kv_cache_hit_rate` gauge.
"""

from __future__ import annotations

from exporter.engines.reading import (
    BatchSource,
    ModelReading,
    ModelView,
    counter_value,
    gauge_value,
    merge_histograms,
    models,
)
from exporter.exposition.parse import Exposition, HistogramSeries

KIND = "trtllm"
MODEL_LABEL = "model_name"
BATCH_SOURCE = "trtllm_iteration_latency_seconds"
_HISTOGRAMS = (
    "time_to_first_token_seconds",
    "time_per_output_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
)
FAMILIES = frozenset(
    {
        "trtllm_num_requests_running",
        "trtllm_num_requests_waiting",
        "trtllm_kv_cache_utilization",
        "trtllm_kv_cache_reused_blocks",
        "trtllm_kv_cache_missed_blocks",
        "trtllm_kv_cache_hit_rate",
        "trtllm_prompt_cached_tokens",
        "trtllm_prompt_tokens",
        "trtllm_generation_tokens",
        BATCH_SOURCE,
        *_HISTOGRAMS,
        *("trtllm_" + name for name in _HISTOGRAMS),
    }
)


def _hist(v: ModelView, name: str) -> list[HistogramSeries]:
    # 2025 releases registered the request histograms without the `trtllm_` prefix.
    return v.histogram("trtllm_" + name) or v.histogram(name)


def normalize(expo: Exposition) -> list[ModelReading]:
    """Map a trtllm-serve exposition; model_name is "undefined" unless Dynamo set it."""
    out: list[ModelReading] = []
    names = models(expo, "trtllm_", MODEL_LABEL) or models(expo, "time_to_first_token_seconds", MODEL_LABEL)
    for model in names:
        v = ModelView(expo, MODEL_LABEL, model)
        r = ModelReading(model="" if model == "undefined" else model)
        r.running = gauge_value(v.gauge("trtllm_num_requests_running"))
        r.waiting = gauge_value(v.gauge("trtllm_num_requests_waiting"))
        r.kv_usage_ratio = gauge_value(v.gauge("trtllm_kv_cache_utilization"), "mean")
        cached = counter_value(v.counter("trtllm_prompt_cached_tokens_total"))
        prompt = counter_value(v.counter("trtllm_prompt_tokens_total"))
        reused = counter_value(v.counter("trtllm_kv_cache_reused_blocks_total"))
        missed = counter_value(v.counter("trtllm_kv_cache_missed_blocks_total"))
        r.prompt_tokens = prompt
        r.generation_tokens = counter_value(v.counter("trtllm_generation_tokens_total"))
        if cached is not None and prompt is not None:
            r.kv_hits, r.kv_queries, r.kv_unit = cached, prompt, "tokens"
        elif reused is not None and missed is not None:
            r.kv_hits, r.kv_queries, r.kv_unit = reused, reused + missed, "blocks"
        else:
            r.kv_hit_ratio = gauge_value(v.gauge("trtllm_kv_cache_hit_rate"), "mean")
        r.ttft = merge_histograms(_hist(v, "time_to_first_token_seconds"))
        r.itl = merge_histograms(_hist(v, "time_per_output_token_seconds"))
        r.e2e = merge_histograms(_hist(v, "e2e_request_latency_seconds"))
        r.queue_time = merge_histograms(_hist(v, "request_queue_time_seconds"))
        # A gauge of the last iteration only: sampled once per round into an exporter-side histogram.
        r.batch_gauge_seconds = gauge_value(v.gauge(BATCH_SOURCE), "max")
        if r.batch_gauge_seconds is not None:
            r.batch_source = BatchSource(BATCH_SOURCE + " (sampled per scrape)", proxy=True)
        out.append(r)
    return out
