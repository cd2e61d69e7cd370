"""An immutable sample of every collector, rendered to the text exposition at most once, when first
asked for, and reused by every scrape of it."""

from __future__ import annotations

import gzip
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from exporter.collectors.base import GpuRef
from exporter.collectors.self import CollectorRound
from exporter.collectors.series import (
    HistogramFamily,
    SeriesFamily,
    escape_label_value,
    format_value,
    help_header,
)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

log = logging.getLogger(__name__)


class _Families(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SIMPLE_TYPES = {"gauge": "gauge", "counter": "counter", "unknown": "untyped", "untyped": "untyped"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")

_VALID_LABEL_NAMES: set[str] = set()
_RENDERED = "_gpupulse_rendered"  # attribute holding a plug-in family's text once rendered
# "name{labels} " per series: series repeat every tick, so their text is built once.
_SERIES_PREFIX: dict[tuple[object, ...], str] = {}
_SERIES_PREFIX_MAX = 100_000  # label names already checked against _LABEL_NAME


def _fast_path(family: Metric) -> bool:
    if family.type not in _SIMPLE_TYPES or not _LEGACY_NAME.match(family.name):
        return False
    known = _VALID_LABEL_NAMES
    for sample in family.samples:
        if sample.timestamp is not None or sample.name.endswith(_OM_SUFFIXES):
            return False
        if not known.issuperset(sample.labels):
            if not all(_LABEL_NAME.match(k) for k in sample.labels):
                return False
            known.update(sample.labels)
    return True


def _render_fast(family: Metric, out: list[str]) -> None:
    name = family.name + "_total" if family.type == "counter" else family.name
    out.append(help_header(name, family.documentation, _SIMPLE_TYPES[family.type]))
    cache = _SERIES_PREFIX
    if len(cache) > _SERIES_PREFIX_MAX:  # series churn (processes come and go): start over
        cache.clear()
    for sample in family.samples:
        key = (sample.name, *sample.labels.items())
        prefix = cache.get(key)
        if prefix is None:
            if sample.labels:
                labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(sample.labels.items()))
                prefix = cache[key] = f"{sample.name}{{{labels}}} "
            else:
                prefix = cache[key] = f"{sample.name} "
        out.append(prefix + format_value(sample.value) + "\n")


def render(families: Sequence[Metric]) -> bytes:
    """Text exposition format 0.0.4 of the families, byte-identical to prometheus_client's.

    SeriesFamily rows render from their prepared text; other gauges and counters with plain names
    take a direct path (about twice as fast as generate_latest, which re-validates every name and
    label); anything else goes through prometheus_client.
    """
    out: list[str] = []
    for family in families:
        mark = len(out)
        try:
            _render_family(family, out)
        except Exception:  # one family that cannot be written as text must not empty the whole scrape
            del out[mark:]
            log.exception("family %s could not be rendered and is left out of this scrape", family.name)
    return "".join(out).encode()


def _render_family(family: Metric, out: list[str]) -> None:
    # The collectors' own families render from their rows, unless a consumer replaced the samples
    if type(family) is SeriesFamily or type(family) is HistogramFamily:
        if not family.materialized:
            family.render_into(out)
        else:
            out.append(_render_other(family))
        return
    # Any other family is built fresh by its collector's round and never changed after it, and a
    # collector on its own interval serves the same objects for several ticks: render it once.
    text = getattr(family, _RENDERED, None)
    if text is None:
        text = _render_other(family)
        setattr(family, _RENDERED, text)
    out.append(text)


def _render_other(family: Metric) -> str:
    if _fast_path(family):
        part: list[str] = []
        _render_fast(family, part)
        return "".join(part)
    return generate_latest(_Families([family])).decode()


@dataclass(frozen=True)
class Snapshot:
    """What one sampling tick produced; never mutated after it is published.

    The text (and its gzip) is made on first use and kept: Prometheus scrapes every 15-30 s while the
    loop ticks every second, so most snapshots are never rendered. The sampling loop renders a
    snapshot before publishing it when the previous one was scraped (a scraper keeping up with the
    ticks finds the text ready); otherwise the first scrape renders it, on a thread.
    """

    families: tuple[Metric, ...]
    taken_at_unix: float
    taken_at_monotonic: float
    good: bool  # did this tick produce fresh GPU data (see Sampler)
    gpus: tuple[tuple[GpuRef, str], ...] = ()  # (GPU, "up" | "stale" | "lost") for the landing page
    rounds: Mapping[str, CollectorRound] = field(default_factory=dict)
    # [text], [gzip text]: set once, under the lock; [True] once a scrape asked for this snapshot
    _body: list[bytes] = field(default_factory=list, repr=False, compare=False)
    _gzip: list[bytes] = field(default_factory=list, repr=False, compare=False)
    _requested: list[bool] = field(default_factory=list, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        families: Sequence[Metric],
        *,
        taken_at_unix: float,
        taken_at_monotonic: float,
        good: bool,
        gpus: Sequence[tuple[GpuRef, str]] = (),
        rounds: Mapping[str, CollectorRound] | None = None,
    ) -> Snapshot:
        """Freeze the families with the tick's facts (rendered on first use)."""
        return cls(
            families=tuple(families),
            taken_at_unix=taken_at_unix,
            taken_at_monotonic=taken_at_monotonic,
            good=good,
            gpus=tuple(gpus),
            rounds=dict(rounds or {}),
        )

    @property
    def body(self) -> bytes:
        """The text exposition, rendered on first use and kept."""
        if self._body:
            return self._body[0]
        with self._lock:
            if not self._body:
                self._body.append(render(self.families))
            return self._body[0]

    @property
    def rendered(self) -> bool:
        """True once the text exists."""
        return bool(self._body)

    @property
    def compressed(self) -> bool:
        """True once the gzip body exists (scrapes asking for gzip then only copy bytes)."""
        return bool(self._gzip)

    def gzipped(self) -> bytes:
        """The body gzip-compressed, computed on first use and kept."""
        if self._gzip:
            return self._gzip[0]
        body = self.body
        with self._lock:
            if not self._gzip:
                self._gzip.append(gzip.compress(body, compresslevel=6, mtime=0))
            return self._gzip[0]

    def ready(self, gzipped: bool) -> bool:
        """True when a scrape (gzip or not) only copies bytes."""
        return bool(self._gzip if gzipped else self._body)

    def mark_requested(self) -> None:
        """A scrape asked for this snapshot (the sampling loop then renders the next one ahead)."""
        if not self._requested:
            self._requested.append(True)

    @property
    def requested(self) -> bool:
        """True once a scrape asked for this snapshot."""
        return bool(self._requested)
