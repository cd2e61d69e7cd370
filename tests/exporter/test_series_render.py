"""The collectors' prepared-text families render exactly what prometheus_client would."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from exporter.collectors.series import _SWEEP_FAMILIES, HistogramTable, SeriesTable
from exporter.snapshot import render
from gpupulse.metrics.spec import MetricSpec

GAUGE = MetricSpec("gpu_test_ratio", "gauge", "ratio", ("uuid", "note"), "A test gauge.", "device")
HISTOGRAM = MetricSpec(
    "inference_test_latency_seconds",
    "histogram",
    "seconds",
    ("model", "phase"),
    "A test histogram.",
    "engines",
)
COUNTER = MetricSpec("gpu_test_events_total", "counter", "", ("uuid",), "A test counter.", "health")
VALUES = [0.0, -0.0, 1.0, 0.5, 1e-9, 123456789.0, math.inf, -math.inf, math.nan, 42.0]
NOTES = ["plain", 'quote"d', "back\\slash", "new\nline", "", "ünïcode", "a", "b", "c", "d"]


class _One(Collector):
    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> list[Metric]:
        return [self.family]


def _reference_gauge(values: list[float]) -> bytes:
    family = GaugeMetricFamily("gpu_test_ratio", "A test gauge.", labels=["uuid", "note"])
    for i, (value, note) in enumerate(zip(values, NOTES, strict=True)):
        family.add_metric([f"GPU-{i}", note], value)
    return generate_latest(_One(family))


def _ours_gauge(table: SeriesTable, values: list[float]) -> bytes:
    family = table.family()
    for i, (value, note) in enumerate(zip(values, NOTES, strict=True)):
        family.add(table.series(f"GPU-{i}", note), value)
    return render([family])


def test_gauge_text_matches_prometheus_client_across_ticks() -> None:
    table = SeriesTable(GAUGE)
    assert _ours_gauge(table, VALUES) == _reference_gauge(VALUES)
    # second tick, same values: served from the cached text, still identical
    assert _ours_gauge(table, VALUES) == _reference_gauge(VALUES)
    # a value that changes (including 0.0 -> -0.0, equal but printed differently) shows up
    changed = [-0.0, 0.0, *VALUES[2:-1], 43.0]
    assert _ours_gauge(table, changed) == _reference_gauge(changed)


def test_counter_text_and_samples_match_prometheus_client() -> None:
    table = SeriesTable(COUNTER)
    ours = table.family()
    reference = CounterMetricFamily("gpu_test_events", "A test counter.", labels=["uuid"])
    for i in range(3):
        ours.add(table.series(f"GPU-{i}"), float(i * 7))
        reference.add_metric([f"GPU-{i}"], float(i * 7))
    assert render([ours]) == generate_latest(_One(reference))
    assert ours.name == reference.name and ours.type == reference.type
    assert ours.samples == reference.samples


def test_replaced_samples_are_what_gets_rendered() -> None:
    # OTLP or the sampler's family merge may read or replace samples; the renderer must follow them.
    table = SeriesTable(COUNTER)
    family = table.family()
    family.add(table.series("GPU-0"), 1.0)
    extra = CounterMetricFamily("gpu_test_events", "A test counter.", labels=["uuid"])
    extra.add_metric(["GPU-9"], 5.0)
    family.samples = family.samples + extra.samples
    text = render([family]).decode()
    assert 'gpu_test_events_total{uuid="GPU-0"} 1.0' in text
    assert 'gpu_test_events_total{uuid="GPU-9"} 5.0' in text


def test_only_gauges_counters_and_info_get_tables() -> None:
    with pytest.raises(ValueError, match="only gauges, counters and info"):
        SeriesTable(MetricSpec("gpu_x_seconds", "histogram", "seconds", (), "h", "device"))


def test_zero_then_negative_zero_renders_each_as_written() -> None:
    # -0.0 == 0.0, so a value cache keyed on equality would serve "0.0" for it
    table = SeriesTable(GAUGE)
    series = table.series("GPU-0", "z")
    assert series.line(0.0).endswith(" 0.0\n")
    assert series.line(-0.0).endswith(" -0.0\n")
    assert series.line(0.0).endswith(" 0.0\n")
    # and the whole-family cache: same rows, values equal but not the same zero
    for value, text in ((0.0, " 0.0\n"), (-0.0, " -0.0\n"), (0.0, " 0.0\n")):
        family = table.family()
        family.add(series, value)
        assert render([family]).decode().endswith(text)


def test_wrong_number_of_label_values_is_refused() -> None:
    table = SeriesTable(GAUGE)  # labels: uuid, note
    with pytest.raises(ValueError):
        table.series("GPU-0")
    with pytest.raises(ValueError):
        table.series("GPU-0", "note", "extra")
    assert table.series("GPU-0", "note").labels == {"uuid": "GPU-0", "note": "note"}


def test_a_plug_in_label_name_prometheus_refuses_never_takes_the_fast_path() -> None:
    # A plug-in (not catalog-checked) family with `bad-label`: the direct renderer would write it as
    # is, which Prometheus refuses; prometheus_client's writer escapes it.
    family = GaugeMetricFamily("plugin_thing", "A plug-in gauge.", labels=["bad-label", "ok"])
    family.add_metric(["x", "y"], 1.0)
    text = render([family]).decode()
    assert "bad-label" not in text
    assert text == generate_latest(_One(family)).decode()


def test_a_plug_in_family_is_rendered_once_however_many_ticks_serve_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exporter import snapshot

    hist = snapshot_hist()
    first = render([hist])
    calls: list[object] = []
    real = snapshot.generate_latest

    def counting(*args: object) -> bytes:
        calls.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot, "generate_latest", counting)
    assert render([hist]) == first and calls == []  # served from its rendered text
    assert render([snapshot_hist()]) == first and len(calls) == 1  # a new round's family afresh


def snapshot_hist() -> Metric:
    from prometheus_client.core import HistogramMetricFamily

    hist = HistogramMetricFamily("plugin_latency_seconds", "A plug-in histogram.", labels=["model"])
    hist.add_metric(["m"], [("0.1", 1.0), ("+Inf", 2.0)], 0.3)
    return hist


def test_series_of_gone_processes_are_forgotten_while_live_ones_keep_their_text() -> None:
    # Processes (and the pods they run in) come and go: every tick below lists two new ones beside
    # one that stays. The table must not keep every label set it ever saw.
    table = SeriesTable(GAUGE)
    staying = table.series("GPU-0", "pid-1")
    for tick in range(3 * _SWEEP_FAMILIES):
        family = table.family()
        family.add(table.series("GPU-0", "pid-1"), 1.0)
        for n in (2 * tick, 2 * tick + 1):
            family.add(table.series("GPU-0", f"gone-{n}"), 0.5)
        text = render([family]).decode()
        assert f'note="gone-{2 * tick + 1}"' in text and 'note="pid-1"' in text
    assert len(table) <= 2 * _SWEEP_FAMILIES + 3  # at most one sweep period of churn, not 1,536
    assert table.series("GPU-0", "pid-1") is staying  # still listed: the same series, its text kept


# (labels, cumulative buckets, sum): escaping, an integral bound, -0.0 and NaN values, a negative
# first bound (prometheus_client then writes no _count and _sum), no sum at all
HISTOGRAM_ROWS: list[tuple[list[str], list[tuple[float, float]], float | None]] = [
    (["m", "prefill"], [(0.005, 0.0), (0.1, 3.0), (1.0, 7.0), (math.inf, 9.0)], 2.25),
    (['q"uote', "new\nline"], [(1.0, -0.0), (2.0, math.nan), (math.inf, 4.0)], 0.0),
    (["neg", "decode"], [(-1.0, 1.0), (math.inf, 2.0)], 1.5),
    (["nosum", "mixed"], [(0.5, 1.0), (math.inf, 1.0)], None),
]


def _reference_histogram(rows: list[tuple[list[str], list[tuple[float, float]], float | None]]) -> Metric:
    family = HistogramMetricFamily(HISTOGRAM.name, HISTOGRAM.help, labels=list(HISTOGRAM.labels))
    for labels, buckets, sum_value in rows:
        as_text = [("+Inf" if b == math.inf else repr(b), v) for b, v in buckets]
        family.add_metric(labels, as_text, sum_value)
    return family


def _comparable(samples: list[Sample]) -> list[tuple[object, ...]]:
    return [(s.name, s.labels, repr(s.value), s.timestamp, s.exemplar) for s in samples]  # NaN != NaN


def test_histogram_text_and_samples_match_prometheus_client_across_rounds() -> None:
    table = HistogramTable(HISTOGRAM)
    for shift in (0.0, 1.0, 0.0):  # the children's prefixes are reused from the second round on
        rows = [(labels, [(b, v + shift) for b, v in buckets], s) for labels, buckets, s in HISTOGRAM_ROWS]
        ours = table.family()
        for labels, buckets, sum_value in rows:
            ours.add_metric(labels, buckets, sum_value)
        reference = _reference_histogram(rows)
        assert render([ours]) == generate_latest(_One(reference))
        assert _comparable(ours.samples) == _comparable(reference.samples)


def test_histogram_children_of_gone_endpoints_are_forgotten() -> None:
    table = HistogramTable(HISTOGRAM)
    for round_ in range(3 * _SWEEP_FAMILIES):
        family = table.family()
        family.add_metric(["staying", "mixed"], [(math.inf, float(round_))], 1.0)
        family.add_metric([f"gone-{round_}", "mixed"], [(math.inf, 1.0)], 1.0)
        text = render([family]).decode()
        assert f'model="gone-{round_}"' in text and f'{{model="staying",phase="mixed"}} {round_}.0' in text
    assert len(table) <= _SWEEP_FAMILIES + 2  # at most one sweep period of churn, not 768


def test_histogram_tables_are_for_histograms_only() -> None:
    with pytest.raises(ValueError, match="not a histogram"):
        HistogramTable(GAUGE)
