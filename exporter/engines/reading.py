"""What a normalizer returns: one reading per served model, in our units, engine-neutral."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from exporter.exposition.parse import Exposition, HistogramSeries, Labels, Sample

# Labels that never identify a model: summed (counters, histograms, count gauges) or averaged away.
PID_LABEL = "pid"


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets (upper bound in seconds, count) ending in +Inf, plus sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


# Phases of an engine step, the `phase` label of inference_batch_latency_seconds.
PREFILL, DECODE, MIXED = "prefill", "decode", "mixed"  # mixed: a step the engine does not split


@dataclass(frozen=True)
class BatchSource:
    """Where inference_batch_latency_seconds comes from for one engine."""

    source: str
    proxy: bool


@dataclass
class ModelReading:
    """Normalized signals of one model served by one endpoint; None means the engine lacks it."""

    model: str
    running: float | None = None
    waiting: float | None = None
    kv_usage_ratio: float | None = None
    kv_hits: float | None = None
    kv_queries: float | None = None
    kv_unit: str = "tokens"
    kv_hit_ratio: float | None = None  # passthrough, only when the engine has no counters
    # Cumulative prompt (prefill input) and generated tokens, from a counter or a histogram's _sum.
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    e2e: Histogram | None = None
    queue_time: Histogram | None = None
    batch_tokens: Histogram | None = None  # tokens per engine step
    batch: dict[str, Histogram] = field(default_factory=dict)  # phase -> histogram
    batch_source: BatchSource | None = None
    # Engines without a batch histogram feed exporter-side histograms (see derived.py) from either
    # a last-iteration gauge sampled once per round, or cumulative (busy seconds, steps) counters.
    batch_gauge_seconds: float | None = None
    batch_counters: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> counters


def _collapse_pid(samples: Sequence[Sample]) -> list[Sample]:
    """Multiprocess gauges carry a `pid` label per writer process; keep the max per other labels.

    The processes of one engine report the same engine state, so summing would double-count.
    """
    if len(samples) <= 1 and not (samples and PID_LABEL in samples[0].labels):
        return list(samples)  # one sample per model and engine, the common case: nothing to collapse
    best: dict[tuple[tuple[str, str], ...], Sample] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != PID_LABEL))
        if key not in best or s.value > best[key].value:
            best[key] = s
    return list(best.values())


def gauge_value(samples: Sequence[Sample], how: str = "sum") -> float | None:
    """Aggregate gauge samples of one model across ranks/engine indices: sum, mean or max."""
    vals = [s.value for s in _collapse_pid(samples) if not math.isnan(s.value)]
    if not vals:
        return None
    if how == "mean":
        return sum(vals) / len(vals)
    if how == "max":
        return max(vals)
    return sum(vals)


def counter_value(samples: Sequence[Sample], keep: Callable[[Labels], bool] | None = None) -> float | None:
    """Sum counter samples (optionally filtered by labels); None when none match."""
    vals = [s.value for s in samples if keep is None or keep(s.labels)]
    return sum(vals) if vals else None


def merge_histograms(
    children: Sequence[HistogramSeries], scale: float = 1.0, keep: Callable[[Labels], bool] | None = None
) -> Histogram | None:
    """Sum histogram children that share the first child's bucket bounds; scale converts units."""
    chosen = [c for c in children if keep is None or keep(c.labels)]
    if not chosen:
        return None
    if len(chosen) == 1:  # one child (one engine, one model): its buckets, added to zeros as below
        c = chosen[0]
        if scale == 1.0:  # b * 1.0 is b, whatever b is
            buckets = tuple([(b, 0.0 + v) for b, v in c.buckets])
        else:
            buckets = tuple([(b * scale if b != math.inf else math.inf, 0.0 + v) for b, v in c.buckets])
        return Histogram(
            buckets,
            (0.0 + (0.0 if math.isnan(c.sum) else c.sum)) * scale,
            0.0 + c.count,
        )
    bounds = [b for b, _ in chosen[0].buckets]
    counts = [0.0] * len(bounds)
    total_sum = 0.0
    total_count = 0.0
    for c in chosen:
        if [b for b, _ in c.buckets] != bounds:
            continue  # children with other bounds cannot be added bucket-wise
        for i, (_, v) in enumerate(c.buckets):
            counts[i] += v
        total_sum += 0.0 if math.isnan(c.sum) else c.sum
        total_count += c.count
    return Histogram(
        tuple((b * scale if b != math.inf else math.inf, v) for b, v in zip(bounds, counts, strict=True)),
        total_sum * scale,
        total_count,
    )


def histogram_sum(
    children: Sequence[HistogramSeries], keep: Callable[[Labels], bool] | None = None
) -> float | None:
    """Sum of the `_sum` of histogram children: the total of a per-request token-count histogram."""
    vals = [c.sum for c in children if (keep is None or keep(c.labels)) and not math.isnan(c.sum)]
    return sum(vals) if vals else None


class ModelView:
    """The samples of one model inside an exposition, looked up by family name."""

    def __init__(self, expo: Exposition, model_label: str, model: str) -> None:
        self._expo = expo
        self._label = model_label
        self.model = model

    def gauge(self, name: str) -> list[Sample]:
        """Gauge samples of this model."""
        label, model = self._label, self.model
        return [s for s in self._expo.gauge(name) if s.labels.get(label, "") == model]

    def counter(self, name: str) -> list[Sample]:
        """Counter samples of this model."""
        label, model = self._label, self.model
        return [s for s in self._expo.counter(name) if s.labels.get(label, "") == model]

    def histogram(self, name: str) -> list[HistogramSeries]:
        """Histogram children of this model."""
        label, model = self._label, self.model
        return [c for c in self._expo.histogram(name) if c.labels.get(label, "") == model]


def models(expo: Exposition, prefix: str, model_label: str) -> list[str]:
    """Sorted model label values seen on any family whose name starts with prefix."""
    seen: set[str] = set()
    for table in (expo.gauges, expo.counters):
        for name, samples in table.items():
            if name.startswith(prefix):
                seen.update([s.labels.get(model_label, "") for s in samples])
    for name, children in expo.histograms.items():
        if name.startswith(prefix):
            seen.update([c.labels.get(model_label, "") for c in children])
    return sorted(seen)
