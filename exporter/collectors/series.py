"""The one way the exporter builds a family from a MetricSpec, and the series it renders from.

`family(spec)` gives a gauge, counter or info family; `histogram_family(spec)` a histogram family
(engines pass histograms through as they read them). Every collector builds its families with these.

Building ~1,400 prometheus_client samples per tick (a dict and a namedtuple each) and then turning
them back into text cost more than the NVML calls themselves. A SeriesFamily instead keeps
(series, value) rows: each Series holds its `name{labels} ` prefix, built once, and the last line it
rendered, reused while the value does not change. The prometheus_client view (`samples`) is built
only when a consumer asks for it (OTLP push, merging with a plug-in's family, tests).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import cast

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gpupulse.metrics.spec import MetricSpec

log = logging.getLogger(__name__)
_go_float = cast(Callable[[float], str], floatToGoString)  # Go-style floats, as Prometheus prints
_TABLE_MAX_SERIES = 50_000  # series churn (processes come and go): a table starts over past this
# Every this many families made from a table (ticks, for most), it forgets the series its latest
# family did not use: pods and processes that came and went leave nothing behind.
_SWEEP_FAMILIES = 256
_CHILD_MAX_BOUNDS = 256  # bucket bounds kept per histogram child


def format_value(value: float) -> str:
    """A sample value as prometheus_client's text exposition writes it."""
    # 0 and 1 are most values (up, info, flags, link states): skip the general formatter for them
    if value == 1.0:
        return "1.0"
    if value == 0.0 and math.copysign(1.0, value) > 0:
        return "0.0"
    return _go_float(value)


def escape_label_value(value: str) -> str:
    """A label value escaped for the text exposition."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def help_header(name: str, documentation: str, type_: str) -> str:
    """The `# HELP` and `# TYPE` lines of a family."""
    doc = documentation.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {type_}\n"


class Series:
    """One series: sample name, labels, its text prefix, and the last (value, line) it rendered."""

    __slots__ = ("key", "labels", "last", "name", "prefix")

    def __init__(self, name: str, labels: dict[str, str], key: tuple[str, ...] = ()) -> None:
        self.name, self.labels = name, labels
        self.key = key  # its label values, as its table finds it
        if labels:
            text = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(labels.items()))
            self.prefix = f"{name}{{{text}}} "
        else:
            self.prefix = f"{name} "
        # One tuple, swapped whole: a reader never pairs a value with another value's line.
        self.last: tuple[float, str] = (math.nan, "")

    def line(self, value: float) -> str:
        """`name{labels} value\\n`, reusing last tick's text when the value is unchanged."""
        last = self.last
        # 0.0 == -0.0 but they print differently, so zero is always formatted (cheaply)
        if value == last[0] and value != 0.0:
            return last[1]
        line = self.prefix + format_value(value) + "\n"
        self.last = (value, line)
        return line


class SeriesTable:
    """The series of one catalog spec, made once per distinct label values."""

    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec
        self.counter = spec.type == "counter"
        if spec.type not in ("gauge", "counter", "info"):
            raise ValueError(f"{spec.name}: only gauges, counters and info metrics have series tables")
        # prometheus_client names a counter family without _total and its samples with it
        self.family_name = spec.name[: -len("_total")] if self.counter else spec.name
        self.header = help_header(spec.name, spec.help, "counter" if self.counter else "gauge")
        self._series: dict[tuple[str, ...], Series] = {}
        # (rows, values, text) of the last family rendered; a tuple swapped whole, like Series.last
        self.last_text: tuple[list[Series], list[float], str] | None = None
        self._made = 0  # families made since the last sweep
        self._latest: SeriesFamily | None = None

    def series(self, *values: str) -> Series:
        """The series with these label values, in the spec's label order."""
        found = self._series.get(values)
        if found is None:
            if len(self._series) >= _TABLE_MAX_SERIES:
                self._series.clear()
            labels = dict(zip(self.spec.labels, values, strict=True))
            found = self._series[values] = Series(self.spec.name, labels, values)
        return found

    def __len__(self) -> int:
        return len(self._series)

    def family(self) -> SeriesFamily:
        """An empty family for one tick."""
        self._made += 1
        if self._made >= _SWEEP_FAMILIES:
            self._made = 0
            latest = self._latest
            if latest is not None and len(self._series) > len(latest.rows):
                # A series still used but not in the latest family (another family of the table, a
                # collector's own cache) stays valid; a lookup of its labels only makes it anew.
                self._series = {s.key: s for s in latest.rows}
        fam = self._latest = SeriesFamily(self)
        return fam


class SeriesFamily(Metric):
    """A gauge or counter family holding (series, value) rows; `samples` is built on first use.

    A family may be deferred (see `defer`): its rows are then made on first use, usually when a scrape
    renders the snapshot, from what its tick kept; one deferred without rows renders nothing, as a
    collector leaves an empty family out.
    """

    def __init__(self, table: SeriesTable) -> None:
        # Metric.__init__ would validate the name again and assign samples; the catalog is validated.
        self.name = table.family_name
        self.documentation = table.spec.help
        self.unit = ""
        self.type = "counter" if table.counter else "gauge"
        self.table = table
        self._rows: list[Series] = []
        self._values: list[float] = []
        self._samples: list[Sample] | None = None
        self._fill: _Fill | None = None
        self._deferred = False

    @property
    def rows(self) -> list[Series]:
        """The series, one per row."""
        if self._fill is not None:
            self._filled()
        return self._rows

    @rows.setter
    def rows(self, rows: list[Series]) -> None:
        # a whole list at once (a collector that builds rows with one comprehension); pair with values
        self._filled()
        self._rows = rows

    @property
    def values(self) -> list[float]:
        """The values, one per row."""
        if self._fill is not None:
            self._filled()
        return self._values

    @values.setter
    def values(self, values: list[float]) -> None:
        self._filled()
        self._values = values

    @property
    def pending(self) -> bool:
        """True while a deferred family's rows are not made yet."""
        return self._fill is not None and self._fill.pending

    def _filled(self) -> None:
        fill = self._fill
        if fill is not None:
            fill.run()
            self._fill = None

    def add(self, series: Series, value: float) -> None:
        """Add one row."""
        self._rows.append(series)
        self._values.append(value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        """Add one row by its label values, in the spec's label order."""
        self.add(self.table.series(*labels), value)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def materialized(self) -> bool:
        """True once `samples` was read or set: from then on the samples are the truth."""
        return self._samples is not None

    @property
    def samples(self) -> list[Sample]:
        """The rows as prometheus_client samples (built once, on first use)."""
        if self._samples is None:
            self._samples = [
                Sample(s.name, dict(s.labels), v, None, None)
                for s, v in zip(self.rows, self.values, strict=True)
            ]
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._filled()
        self._samples = list(value)

    def render_into(self, out: list[str]) -> None:
        """Append the family's exposition text (header and one line per row)."""
        table, rows, values = self.table, self.rows, self.values
        if not rows and self._deferred:
            return
        last = table.last_text
        # Same series with the same values as the last render of this spec: the same text. Series
        # compare by identity; -0.0 == 0.0 but prints differently, so a negative zero on either side
        # (now, or in the text that would be reused) re-renders.
        if (
            last is not None
            and last[0] == rows
            and last[1] == values
            and not _negative_zero(values)
            and not _negative_zero(last[1])
        ):
            out.append(last[2])
            return
        text = table.header + "".join([s.line(v) for s, v in zip(rows, values, strict=True)])
        table.last_text = (rows, values, text)
        out.append(text)


Rows = list[list[Series]]
Values = list[list[float]]


class _Fill:
    """Makes the rows of a tick's deferred families once, on whichever thread first needs them.

    It holds the families' lists, not the families: no reference cycle, so a snapshot nobody scraped
    is freed by reference counting alone.
    """

    __slots__ = ("_fn", "_lock", "_rows", "_values")

    def __init__(self, fn: Callable[[Rows, Values], None], rows: Rows, values: Values) -> None:
        self._fn: Callable[[Rows, Values], None] | None = fn
        self._rows, self._values = rows, values
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        return self._fn is not None

    def run(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
            if fn is None:
                return
            try:
                fn(self._rows, self._values)
            except Exception:  # a bug in one collector's fill must not take the whole scrape down
                log.exception("building deferred families failed; they are left out")
                for rows in self._rows:
                    rows.clear()
                for values in self._values:
                    values.clear()


def defer(families: Sequence[SeriesFamily], fill: Callable[[Rows, Values], None]) -> None:
    """Make the families' rows on first use: `fill(rows, values)` appends to each family's lists, in
    the order of `families`.

    A tick keeps what it read and returns the families at once; the rows are made when a scrape (or a
    push) first reads them, and most ticks are never scraped (every 15-30 s, a tick every second).
    `fill` runs at most once, on any thread, so it may read only what the tick handed it: readings
    and series made before, never a table it would add to.
    """
    shared = _Fill(fill, [f._rows for f in families], [f._values for f in families])
    for f in families:
        f._fill, f._deferred = shared, True


def _negative_zero(values: list[float]) -> bool:
    return 0.0 in values and any(v == 0.0 and math.copysign(1.0, v) < 0 for v in values)


_TABLES: dict[str, SeriesTable] = {}


def table(spec: MetricSpec) -> SeriesTable:
    """The process-wide series table of a spec."""
    found = _TABLES.get(spec.name)
    if found is None or found.spec is not spec:
        found = _TABLES[spec.name] = SeriesTable(spec)
    return found


def family(spec: MetricSpec) -> SeriesFamily:
    """An empty family of a gauge, counter or info spec for one round (info rows are gauges of 1)."""
    return table(spec).family()


class HistogramChild:
    """One histogram child (label values): the text prefix of each of its lines, built once."""

    __slots__ = ("buckets", "count", "key", "labels", "sum")

    def __init__(self, name: str, labels: dict[str, str], key: tuple[str, ...]) -> None:
        self.labels, self.key = labels, key
        self.buckets: dict[float, tuple[str, str]] = {}  # upper bound -> (le text, line prefix)
        own = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(labels.items()))
        self.count = f"{name}_count{{{own}}} " if own else f"{name}_count "
        self.sum = f"{name}_sum{{{own}}} " if own else f"{name}_sum "

    def bucket(self, name: str, bound: float) -> tuple[str, str]:
        """(le text, `name_bucket{labels,le="..."} `) of one upper bound."""
        found = self.buckets.get(bound)
        if found is None:
            if len(self.buckets) >= _CHILD_MAX_BOUNDS:  # bounds that keep changing (NaN never matches)
                self.buckets.clear()
            le = "+Inf" if bound == math.inf else repr(float(bound))
            pairs = sorted([*self.labels.items(), ("le", le)])  # the exposition sorts label names
            text = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)
            found = self.buckets[bound] = (le, f"{name}_bucket{{{text}}} ")
        return found


class HistogramTable:
    """The histogram children of one catalog spec, made once per distinct label values."""

    def __init__(self, spec: MetricSpec) -> None:
        if spec.type != "histogram":
            raise ValueError(f"{spec.name}: a {spec.type}, not a histogram")
        self.spec = spec
        self.header = help_header(spec.name, spec.help, "histogram")
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        self._made = 0
        self._latest: HistogramFamily | None = None

    def child(self, values: tuple[str, ...]) -> HistogramChild:
        """The child with these label values, in the spec's label order."""
        found = self._children.get(values)
        if found is None:
            if len(self._children) >= _TABLE_MAX_SERIES:
                self._children.clear()
            labels = dict(zip(self.spec.labels, values, strict=True))
            found = self._children[values] = HistogramChild(self.spec.name, labels, values)
        return found

    def __len__(self) -> int:
        return len(self._children)

    def family(self) -> HistogramFamily:
        """An empty family for one round; every _SWEEP_FAMILIES of them, children unused are forgotten."""
        self._made += 1
        if self._made >= _SWEEP_FAMILIES:
            self._made = 0
            latest = self._latest
            if latest is not None and len(self._children) > len(latest.rows):
                self._children = {row[0].key: row[0] for row in latest.rows}
        fam = self._latest = HistogramFamily(self)
        return fam


class HistogramFamily(Metric):
    """A histogram family of (child, buckets, sum) rows: text from the children's prefixes, rendered
    once; prometheus_client's `samples` (what HistogramMetricFamily would hold) built on first use."""

    def __init__(self, table: HistogramTable) -> None:
        self.name = table.spec.name
        self.documentation = table.spec.help
        self.unit = ""
        self.type = "histogram"
        self.table = table
        self.rows: list[tuple[HistogramChild, Sequence[tuple[float, float]], float | None]] = []
        self._samples: list[Sample] | None = None
        self._text: str | None = None

    def add_metric(
        self, labels: Sequence[str], buckets: Sequence[tuple[float, float]], sum_value: float | None
    ) -> None:
        """Add one child: cumulative (upper bound, count) pairs, sorted and ending in +Inf, and its sum."""
        self.rows.append((self.table.child(tuple(labels)), buckets, sum_value))

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def materialized(self) -> bool:
        """True once `samples` was read or set: from then on the samples are the truth."""
        return self._samples is not None

    @property
    def samples(self) -> list[Sample]:
        """The rows as prometheus_client samples, in HistogramMetricFamily's order (built once)."""
        if self._samples is None:
            name, out = self.name, []
            for child, buckets, sum_value in self.rows:
                for bound, value in buckets:
                    le = child.bucket(name, bound)[0]
                    out.append(Sample(name + "_bucket", {**child.labels, "le": le}, value, None, None))
                if buckets and buckets[0][0] >= 0 and sum_value is not None:
                    count = buckets[-1][1]
                    out.append(Sample(name + "_count", dict(child.labels), count, None, None))
                    out.append(Sample(name + "_sum", dict(child.labels), sum_value, None, None))
            self._samples = out
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._samples = list(value)

    def render_into(self, out: list[str]) -> None:
        """Append the family's exposition text (rendered on first use: a round's family never changes)."""
        if self._text is None:
            name, parts = self.name, [self.table.header]
            for child, buckets, sum_value in self.rows:
                for bound, value in buckets:
                    parts.append(child.bucket(name, bound)[1] + format_value(value) + "\n")
                if buckets and buckets[0][0] >= 0 and sum_value is not None:
                    parts.append(child.count + format_value(buckets[-1][1]) + "\n")
                    parts.append(child.sum + format_value(sum_value) + "\n")
            self._text = "".join(parts)
        out.append(self._text)


_HISTOGRAM_TABLES: dict[str, HistogramTable] = {}


def histogram_family(spec: MetricSpec) -> HistogramFamily:
    """An empty family of a histogram spec for one round."""
    found = _HISTOGRAM_TABLES.get(spec.name)
    if found is None or found.spec is not spec:
        found = _HISTOGRAM_TABLES[spec.name] = HistogramTable(spec)
    return found.family()
