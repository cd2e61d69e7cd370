"""Specs of the page-cache collector: residency of model weight files in the host page cache."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, gauge

_C = "pagecache"
_LABELS = ("model", "namespace", "pod")

MODEL_WEIGHTS_PAGE_CACHE_RESIDENT_RATIO = gauge(
    "model_weights_page_cache_resident_ratio",
    "ratio",
    "Share of a model's weight file bytes resident in the host page cache (mincore).",
    _C,
    _LABELS,
)

MODEL_WEIGHTS_RESIDENT_BYTES = gauge(
    "model_weights_resident_bytes",
    "bytes",
    "Bytes of a model's weight files resident in the host page cache.",
    _C,
    _LABELS,
)

MODEL_WEIGHTS_SIZE_BYTES = gauge(
    "model_weights_size_bytes",
    "bytes",
    "Total size of a model's weight files on disk.",
    _C,
    _LABELS,
)

PAGECACHE_METRICS: tuple[MetricSpec, ...] = (
    MODEL_WEIGHTS_PAGE_CACHE_RESIDENT_RATIO,
    MODEL_WEIGHTS_RESIDENT_BYTES,
    MODEL_WEIGHTS_SIZE_BYTES,
)
