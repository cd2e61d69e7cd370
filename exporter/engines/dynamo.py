"""NVIDIA Dynamo frontend and worker metrics -> ModelReading.

The router's `kv_hit_rate` histogram is a *prediction* made at routing time and is not exported as a
hit ratio. Engine metrics passed through on a worker port (vllm:, sglang:, trtllm_) fill what the
Dynamo families lack.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.engines import sglang, trtllm, vllm
from exporter.engines.reading import (
    DECODE,
    BatchSource,
    ModelReading,
    ModelView,
    gauge_value,
    merge_histograms,
    models,
)
from exporter.exposition.parse import Exposition

KIND = "dynamo"
MODEL_LABEL = "model"
# kvstats' prefix hit-rate gauge is gone from 2026 releases (prometheus_names.rs keeps total_blocks and
# gpu_cache_usage_percent); hit counters then come from the passed-through engine families.
FAMILIES = frozenset(
    {
        "dynamo_frontend_inflight_requests",
        "dynamo_frontend_queued_requests",
        "dynamo_component_kvstats_gpu_cache_usage_percent",
        "dynamo_component_kvstats_gpu_prefix_cache_hit_rate",
        "dynamo_frontend_time_to_first_token_seconds",
        "dynamo_frontend_inter_token_latency_seconds",
        "dynamo_frontend_request_duration_seconds",
    }
    | vllm.FAMILIES
    | sglang.FAMILIES
    | trtllm.FAMILIES
)
_INNER: tuple[tuple[str, Callable[[Exposition], list[ModelReading]]], ...] = (
    ("vllm:", vllm.normalize),
    ("sglang:", sglang.normalize),
    ("trtllm_", trtllm.normalize),
)


def _fill(r: ModelReading, inner: ModelReading) -> None:
    """Copy fields Dynamo lacks from the passed-through engine reading of the same model."""
    for name, value in vars(inner).items():
        mine = getattr(r, name)
        if name != "model" and (mine is None or mine == {}) and value is not None and value != {}:
            setattr(r, name, value)
    if r.kv_queries is not None:
        r.kv_unit = inner.kv_unit


def normalize(expo: Exposition) -> list[ModelReading]:
    """Map Dynamo frontend/worker families to one reading per model."""
    readings: dict[str, ModelReading] = {}
    for model in models(expo, "dynamo_", MODEL_LABEL):
        v = ModelView(expo, MODEL_LABEL, model)
        r = ModelReading(model=model)
        r.running = gauge_value(v.gauge("dynamo_frontend_inflight_requests"))
        r.waiting = gauge_value(v.gauge("dynamo_frontend_queued_requests"))
        r.kv_usage_ratio = gauge_value(v.gauge("dynamo_component_kvstats_gpu_cache_usage_percent"), "mean")
        r.kv_hit_ratio = gauge_value(v.gauge("dynamo_component_kvstats_gpu_prefix_cache_hit_rate"), "mean")
        r.ttft = merge_histograms(v.histogram("dynamo_frontend_time_to_first_token_seconds"))
        r.itl = merge_histograms(v.histogram("dynamo_frontend_inter_token_latency_seconds"))
        r.e2e = merge_histograms(v.histogram("dynamo_frontend_request_duration_seconds"))
        if r.itl is not None:
            r.batch = {DECODE: r.itl}
            r.batch_source = BatchSource("dynamo_frontend_inter_token_latency_seconds", proxy=True)
        readings[model] = r
    for prefix, inner_normalize in _INNER:
        if not expo.has_prefix(prefix):
            continue
        for inner in inner_normalize(expo):
            if inner.model in readings:
                _fill(readings[inner.model], inner)
            else:
                readings[inner.model] = inner
    for r in readings.values():
        if r.kv_queries is not None:
            r.kv_hit_ratio = None  # counters win over the ratio gauge
    return [readings[k] for k in sorted(readings)]
