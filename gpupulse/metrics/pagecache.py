"""Specs of the page-cache collector: residency of model weight files in the host page cache."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec

_LABELS = ("model", "namespace", "pod")

MODEL_WEIGHTS_PAGE_CACHE_RESIDENT_RATIO = MetricSpec(
    name="model_weights_page_cache_resident_ratio",
    type="gauge",
    unit="ratio",
    labels=_LABELS,
    help="Share of a model's weight file bytes resident in the host page cache (mincore).",
    collector="pagecache",
)

MODEL_WEIGHTS_RESIDENT_BYTES = MetricSpec(
    name="model_weights_resident_bytes",
    type="gauge",
    unit="bytes",
    labels=_LABELS,
    help="Bytes of a model's weight files resident in the host page cache.",
    collector="pagecache",
)

MODEL_WEIGHTS_SIZE_BYTES = MetricSpec(
    name="model_weights_size_bytes",
    type="gauge",
    unit="bytes",
    labels=_LABELS,
    help="Total size of a model's weight files on disk.",
    collector="pagecache",
)

PAGECACHE_METRICS: tuple[MetricSpec, ...] = (
    MODEL_WEIGHTS_PAGE_CACHE_RESIDENT_RATIO,
    MODEL_WEIGHTS_RESIDENT_BYTES,
    MODEL_WEIGHTS_SIZE_BYTES,
)
