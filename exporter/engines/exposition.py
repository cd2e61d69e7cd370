"""A parsed engine exposition indexed by metric name, with the parser traps handled once.

Traps handled here (docs/design/engines.md, "Parser traps"):
- prometheus-client's text parser strips `_total` from counter *family* names and appends it to
  samples of counters that lacked it (TGI, Triton); counters are therefore indexed by base name.
- `_created` gauges that shadow a counter or histogram are dropped.
- Ray's wrappers rename `vllm:x` to `vllm_x` (optionally `ray_vllm_x`); names are put back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as PromSample

Labels = Mapping[str, str]

_RAY_PREFIX = re.compile(r"^(?:ray_)?(vllm|sglang)[:_]")


class ExpositionError(Exception):
    """The payload is not a Prometheus text exposition."""


@dataclass(frozen=True)
class Sample:
    labels: Labels
    value: float


@dataclass(frozen=True)
class HistogramSeries:
    """One histogram child: cumulative (upper bound, count) pairs ending in +Inf."""

    labels: Labels
    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass
class Exposition:
    """Samples of one scrape, keyed by canonical name (colon prefixes restored, counters by base)."""

    gauges: dict[str, list[Sample]] = field(default_factory=dict)  # gauge and untyped
    counters: dict[str, list[Sample]] = field(default_factory=dict)  # base name, no `_total`
    histograms: dict[str, list[HistogramSeries]] = field(default_factory=dict)
    help: dict[str, str] = field(default_factory=dict)
    ray_prefixed: bool = False

    def names(self) -> Iterable[str]:
        """Every canonical family name present."""
        yield from self.gauges
        yield from self.counters
        yield from self.histograms

    def has_prefix(self, prefix: str) -> bool:
        """True when any family name starts with prefix."""
        return any(n.startswith(prefix) for n in self.names())

    def gauge(self, name: str) -> list[Sample]:
        """Samples of a gauge (or untyped) family; [] when absent."""
        return self.gauges.get(name, [])

    def counter(self, name: str) -> list[Sample]:
        """Samples of a counter by wire or base name; falls back to untyped series of that name."""
        base = name.removesuffix("_total")
        if base in self.counters:
            return self.counters[base]
        return self.gauges.get(base + "_total") or self.gauges.get(base, [])

    def histogram(self, name: str) -> list[HistogramSeries]:
        """Children of a histogram family; [] when absent."""
        return self.histograms.get(name, [])


def canonical_name(name: str) -> str:
    """Undo Ray's sanitising of `vllm:`/`sglang:` prefixes (`ray_vllm_x`, `vllm_x` -> `vllm:x`)."""
    return _RAY_PREFIX.sub(r"\1:", name, count=1)


def parse_exposition(text: str) -> Exposition:
    """Parse Prometheus text format into an Exposition; raise ExpositionError on garbage."""
    expo = Exposition()
    created: dict[str, list[Sample]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
        raise ExpositionError(f"unparseable exposition: {exc}") from exc
    for fam in families:
        name = canonical_name(fam.name)
        if name != fam.name:
            expo.ray_prefixed = True
        if fam.documentation:
            expo.help.setdefault(name, fam.documentation)
        if fam.type == "counter":
            expo.counters.setdefault(name, []).extend(
                Sample(s.labels, float(s.value)) for s in fam.samples if s.name.endswith("_total")
            )
        elif fam.type == "histogram":
            expo.histograms.setdefault(name, []).extend(_histogram_children(fam.name, fam.samples))
        elif fam.type in ("gauge", "unknown", "untyped"):
            samples = [Sample(s.labels, float(s.value)) for s in fam.samples]
            if name.endswith("_created"):
                created[name] = samples
            else:
                expo.gauges.setdefault(name, []).extend(samples)
        # summaries, info and stateset families carry nothing we map
    for name, samples in created.items():
        base = name.removesuffix("_created")
        if base in expo.counters or base in expo.histograms or base + "_total" in expo.histograms:
            continue  # prometheus-client's creation timestamp, not a metric
        expo.gauges.setdefault(name, []).extend(samples)
    if text.strip() and not any(True for _ in expo.names()):
        raise ExpositionError("no metric families in payload")
    return expo


@dataclass
class _Child:
    buckets: list[tuple[float, float]] = field(default_factory=list)
    sum: float = math.nan
    count: float = math.nan


def _histogram_children(family: str, samples: Iterable[PromSample]) -> list[HistogramSeries]:
    """Group _bucket/_sum/_count samples into children keyed by their non-`le` labels."""
    groups: dict[tuple[tuple[str, str], ...], _Child] = {}
    for s in samples:
        labels = dict(s.labels)
        le = labels.pop("le", None)
        child = groups.setdefault(tuple(sorted(labels.items())), _Child())
        if s.name == family + "_bucket" and le is not None:
            child.buckets.append((float(le), float(s.value)))
        elif s.name == family + "_sum":
            child.sum = float(s.value)
        elif s.name == family + "_count":
            child.count = float(s.value)
    out: list[HistogramSeries] = []
    for key, child in groups.items():
        buckets = sorted(child.buckets)
        if not buckets:
            continue
        count = child.count if not math.isnan(child.count) else buckets[-1][1]
        if buckets[-1][0] != math.inf:
            buckets.append((math.inf, count))
        out.append(HistogramSeries(dict(key), tuple(buckets), child.sum, count))
    return out
