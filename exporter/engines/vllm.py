"""vLLM (V0 engine, V1 0.7 -> 0.33, and Ray Serve's `vllm_` spelling) -> ModelReading.

Generations: 0.12+ (`kv_cache_usage_perc`, `prefix_cache_*`, ITL); 0.9.2-0.11 (old and new names
side by side: the new ones win so nothing is counted twice); 0.7-0.9.1 (`gpu_prefix_cache_*` in
blocks up to 0.8.5, tokens from 0.9.1; `time_per_output_token_seconds`); V0 (`gpu_prefix_cache_hit_rate`
ratio only).
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
    merge_histograms,
    models,
)
from exporter.exposition.parse import Exposition

KIND = "vllm"
MODEL_LABEL = "model_name"
# Every family the normalizer reads (counters by base name); the parser keeps only these.
FAMILIES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits",
        "vllm:gpu_prefix_cache_queries",
        "vllm:gpu_prefix_cache_hit_rate",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:iteration_tokens_total",
        "vllm:model_forward_time_milliseconds",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    }
)


def _prefix_unit(expo: Exposition, name: str) -> str:
    """Unit of the pre-0.12 gpu_prefix_cache_* counters: blocks up to 0.8.5, tokens from 0.9.1."""
    text = expo.help.get(name, "")
    if "block" in text:
        return "blocks"
    if "token" in text:
        return "tokens"
    # No help text: 0.7.x V1 (blocks) had no `engine` label; assume tokens otherwise.
    samples = expo.counter(name)
    return "blocks" if samples and "engine" not in samples[0].labels else "tokens"


def normalize(expo: Exposition) -> list[ModelReading]:
    """Map a vLLM exposition to one reading per model_name."""
    out: list[ModelReading] = []
    for model in models(expo, "vllm:", MODEL_LABEL):
        v = ModelView(expo, MODEL_LABEL, model)
        r = ModelReading(model=model)
        r.running = gauge_value(v.gauge("vllm:num_requests_running"))
        r.waiting = gauge_value(v.gauge("vllm:num_requests_waiting"))
        usage = v.gauge("vllm:kv_cache_usage_perc") or v.gauge("vllm:gpu_cache_usage_perc")
        r.kv_usage_ratio = gauge_value(usage, "mean")

        if v.counter("vllm:prefix_cache_queries_total"):
            r.kv_hits = counter_value(v.counter("vllm:prefix_cache_hits_total"))
            r.kv_queries = counter_value(v.counter("vllm:prefix_cache_queries_total"))
            r.kv_unit = "tokens"
        elif v.counter("vllm:gpu_prefix_cache_queries_total"):
            r.kv_hits = counter_value(v.counter("vllm:gpu_prefix_cache_hits_total"))
            r.kv_queries = counter_value(v.counter("vllm:gpu_prefix_cache_queries_total"))
            r.kv_unit = _prefix_unit(expo, "vllm:gpu_prefix_cache_queries")
        else:
            r.kv_hit_ratio = gauge_value(v.gauge("vllm:gpu_prefix_cache_hit_rate"), "mean")

        # All prompt tokens, cached or computed (`prompt_tokens_by_source` splits the same total).
        r.prompt_tokens = counter_value(v.counter("vllm:prompt_tokens_total"))
        r.generation_tokens = counter_value(v.counter("vllm:generation_tokens_total"))
        r.ttft = merge_histograms(v.histogram("vllm:time_to_first_token_seconds"))
        itl_name = "vllm:inter_token_latency_seconds"
        if not v.histogram(itl_name):
            itl_name = "vllm:time_per_output_token_seconds"  # <= 0.14, same observations
        r.itl = merge_histograms(v.histogram(itl_name))
        r.e2e = merge_histograms(v.histogram("vllm:e2e_request_latency_seconds"))
        r.queue_time = merge_histograms(v.histogram("vllm:request_queue_time_seconds"))
        # A histogram despite its name: tokens scheduled per engine step.
        r.batch_tokens = merge_histograms(v.histogram("vllm:iteration_tokens_total"))
        if r.itl is not None:
            # vLLM has no per-iteration metric; each ITL observation is one decode-step interval.
            r.batch = {DECODE: r.itl}
            r.batch_source = BatchSource(itl_name, proxy=True)
        elif v.histogram("vllm:model_forward_time_milliseconds"):
            forward = merge_histograms(v.histogram("vllm:model_forward_time_milliseconds"), scale=1e-3)
            if forward is not None:
                r.batch = {MIXED: forward}
                r.batch_source = BatchSource("vllm:model_forward_time_milliseconds", proxy=True)
        out.append(r)
    return out
