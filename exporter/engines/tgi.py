"""Hugging Face TGI 2.x/3.x -> ModelReading.

TGI has no model label (one router per model), no prefix-cache counters and no KV usage gauge; it is
the one engine with a real batch latency histogram, `tgi_batch_inference_duration{method}`, kept
apart per phase (`prefill` batches are the long ones, `decode` steps set the inter-token pace).
"""

from __future__ import annotations

from exporter.engines.reading import (
    DECODE,
    PREFILL,
    BatchSource,
    ModelReading,
    gauge_value,
    histogram_sum,
    merge_histograms,
)
from exporter.exposition.parse import Exposition

KIND = "tgi"
BATCH_SOURCE = "tgi_batch_inference_duration"
FAMILIES = frozenset(
    {
        "tgi_batch_current_size",
        "tgi_queue_size",
        "tgi_request_duration",
        "tgi_request_mean_time_per_token_duration",
        "tgi_request_queue_duration",
        "tgi_request_input_length",
        "tgi_request_generated_tokens",
        BATCH_SOURCE,
    }
)
_METHODS = {"prefill": PREFILL, "decode": DECODE}


def normalize(expo: Exposition) -> list[ModelReading]:
    """Map a TGI exposition to a single reading with an empty model (set by the target override)."""
    r = ModelReading(model="")
    r.running = gauge_value(expo.gauge("tgi_batch_current_size"))
    r.waiting = gauge_value(expo.gauge("tgi_queue_size"))
    r.e2e = merge_histograms(expo.histogram("tgi_request_duration"))
    r.queue_time = merge_histograms(expo.histogram("tgi_request_queue_duration"))
    # Per-request mean time per output token: the closest TGI has to an inter-token histogram.
    r.itl = merge_histograms(expo.histogram("tgi_request_mean_time_per_token_duration"))
    # Token counts per request are histograms; their _sum is the running total. Input length is
    # observed at validation (requests that fail later still count), generated tokens on success.
    r.prompt_tokens = histogram_sum(expo.histogram("tgi_request_input_length"))
    r.generation_tokens = histogram_sum(expo.histogram("tgi_request_generated_tokens"))
    children = expo.histogram(BATCH_SOURCE)
    for method, phase in _METHODS.items():
        hist = merge_histograms(children, keep=lambda lb, m=method: lb.get("method") == m)  # type: ignore[misc]
        if hist is not None:
            r.batch[phase] = hist
    if r.batch:
        r.batch_source = BatchSource(BATCH_SOURCE, proxy=False)
    return [r]
