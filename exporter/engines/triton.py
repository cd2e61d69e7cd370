"""NVIDIA Triton (core, TensorRT-LLM backend, vLLM backend) -> ModelReading, one per Triton model.

The vLLM backend reuses `vllm:` names with `model`/`version` labels and other buckets, which is why
detection looks at labels, not only prefixes. No Triton flavour exports a KV hit *and* query count.
"""

from __future__ import annotations

from exporter.engines.exposition import Exposition, Sample
from exporter.engines.reading import (
    BatchSource,
    ModelReading,
    ModelView,
    counter_value,
    gauge_value,
    merge_histograms,
    models,
)

KIND = "triton"
MODEL_LABEL = "model"
DERIVED_SOURCE = "nv_inference_compute_infer_duration_us/nv_inference_request_success"

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


def normalize(expo: Exposition) -> list[ModelReading]:
    """Map a Triton exposition to one reading per LLM model."""
    out: list[ModelReading] = []
    for model in _llm_models(expo):
        v = ModelView(expo, MODEL_LABEL, model)
        r = ModelReading(model=model)
        req = v.gauge("nv_trt_llm_request_metrics")
        r.running = gauge_value(_labelled(req, "request_type", "active"))
        r.waiting = gauge_value(_labelled(req, "request_type", "waiting"))
        if r.waiting is None:
            r.waiting = gauge_value(v.gauge("nv_inference_pending_request_count"))
        blocks = v.gauge("nv_trt_llm_kv_cache_block_metrics")
        r.kv_usage_ratio = gauge_value(_labelled(blocks, "kv_cache_block_type", "fraction"), "mean")

        r.ttft = merge_histograms(v.histogram("vllm:time_to_first_token_seconds"))
        if r.ttft is None:
            r.ttft = merge_histograms(v.histogram("nv_inference_first_response_histogram_ms"), scale=1e-3)
        r.itl = merge_histograms(v.histogram("vllm:time_per_output_token_seconds"))
        r.e2e = merge_histograms(v.histogram("vllm:e2e_request_latency_seconds"))
        if r.itl is not None:
            r.batch = r.itl
            r.batch_source = BatchSource("vllm:time_per_output_token_seconds", proxy=True)
        else:
            busy_us = counter_value(v.counter("nv_inference_compute_infer_duration_us"))
            done = counter_value(v.counter("nv_inference_request_success"))
            if busy_us is not None and done is not None:
                # Every request of a batch is charged the whole batch's compute time, so the
                # per-round mean is a request-weighted batch compute time.
                r.batch_counters = (busy_us * 1e-6, done)
                r.batch_source = BatchSource(DERIVED_SOURCE, proxy=True)
        out.append(r)
    return out
