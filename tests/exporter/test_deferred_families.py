"""The NVML collectors' families are deferred: a tick keeps what it read and the rows are made when a
scrape (or a push) first reads them. What a snapshot renders is its own tick's, however many ticks
came after; a tick nobody scrapes makes no rows; a fill that fails leaves out its families only; two
threads reading at once build the rows once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exporter.collectors.series import Rows, SeriesFamily, SeriesTable, Values, defer
from exporter.snapshot import render
from gpupulse.metrics.spec import MetricSpec
from tests.exporter.harness import normalise, simulated_exporter
from tests.exporter.test_exporter_failures import series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exporter"
GAUGE = MetricSpec("gpu_deferred_test_ratio", "gauge", "ratio", ("uuid",), "A test gauge.", "device")
OTHER = MetricSpec("gpu_deferred_other_ratio", "gauge", "ratio", ("uuid",), "Another gauge.", "device")


def _deferred(spec: MetricSpec, calls: list[str]) -> SeriesFamily:
    table = SeriesTable(spec)
    family = table.family()
    one = table.series("GPU-1")

    def fill(rows: Rows, values: Values) -> None:
        calls.append(threading.current_thread().name)
        rows[0].append(one)
        values[0].append(0.5)

    defer([family], fill)
    return family


async def test_a_snapshot_renders_its_own_tick_after_later_ticks() -> None:
    async with simulated_exporter(FIXTURES / "failures.yaml", start_seconds=1.0) as h:
        first = await h.tick(0)
        for _ in range(3):
            await h.tick(1.0)
        later = h.text()
        early = first.body.decode()  # rendered only now, three ticks later
        assert early != later
        energy = series(early, "gpu_energy_joules_total")
        assert energy and all(series(later, "gpu_energy_joules_total")[k] > v for k, v in energy.items())
        # the same as what that tick would have rendered at once: a fresh run to the same point
    async with simulated_exporter(FIXTURES / "failures.yaml", start_seconds=1.0) as fresh:
        await fresh.tick(0)
        assert normalise(fresh.text()) == normalise(early)


async def test_a_tick_nobody_scrapes_makes_no_rows() -> None:
    async with simulated_exporter(FIXTURES / "failures.yaml", start_seconds=1.0) as h:
        for _ in range(3):
            snap = await h.tick(1.0)
        deferred = [f for f in snap.families if isinstance(f, SeriesFamily) and f.pending]
        names = {f.name for f in deferred}
        assert {"gpu_temperature_celsius", "gpu_sm_active_ratio", "gpu_process_memory_used_bytes"} <= names
        _ = snap.body
        assert not any(f.pending for f in deferred)


def test_a_fill_that_fails_leaves_out_its_families_only(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    good = _deferred(GAUGE, calls)
    table = SeriesTable(OTHER)
    broken, broken_too = table.family(), SeriesTable(
        MetricSpec("gpu_deferred_third_ratio", "gauge", "ratio", ("uuid",), "A third.", "device")
    ).family()
    one = table.series("GPU-1")

    def fill(rows: Rows, values: Values) -> None:
        rows[0].append(one)
        values[0].append(1.0)
        raise RuntimeError("a bug half way")

    defer([broken, broken_too], fill)
    text = render([good, broken, broken_too]).decode()
    assert "gpu_deferred_test_ratio" in text and "gpu_deferred_other_ratio" not in text
    assert "gpu_deferred_third_ratio" not in text
    assert (broken.rows, broken.values) == ([], [])  # nothing half made
    assert "building deferred families failed" in caplog.text


def test_two_threads_reading_at_once_build_the_rows_once() -> None:
    calls: list[str] = []
    family = _deferred(GAUGE, calls)
    start = threading.Barrier(4)
    seen: list[int] = []

    def read() -> None:
        start.wait()
        seen.append(len(family.rows))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == [1, 1, 1, 1] and len(calls) == 1


def test_a_deferred_family_without_rows_renders_nothing_but_an_eager_one_keeps_its_header() -> None:
    empty_deferred = SeriesTable(GAUGE).family()
    defer([empty_deferred], lambda rows, values: None)
    eager = SeriesTable(OTHER).family()
    text = render([empty_deferred, eager]).decode()
    assert "gpu_deferred_test_ratio" not in text
    assert text.startswith("# HELP gpu_deferred_other_ratio")
