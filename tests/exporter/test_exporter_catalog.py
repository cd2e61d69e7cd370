"""The catalog is the one source: names follow the conventions, output matches it (docs/metrics.md
matching it is tests/test_generated.py's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupulse.metrics import catalog
from gpupulse.metrics.spec import MetricSpec, validate

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
# Families no shipped scenario produces (fan speed: the simulated boards are fanless; the Kubernetes
# requests: the golden exporters run without an API server, test_kube_watch.py counts them).
NOT_IN_GOLDEN = {"gpu_fan_speed_ratio", "gpupulse_kube_requests_total"}


def test_catalog_follows_naming_conventions() -> None:
    assert validate(catalog.ALL_SPECS) == []


def test_validate_catches_bad_names() -> None:
    bad = MetricSpec("gpu_thing", "counter", "bytes", ("gpu",), "", "device")
    problems = validate([bad, bad])
    assert any("declared twice" in p for p in problems)
    assert any("end in _total" in p for p in problems)
    assert any("unit bytes" in p for p in problems)
    assert any("no help" in p for p in problems)
    assert any("uuid and gpu" in p for p in problems)


def test_catalog_main_prints_the_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert catalog.main(["--markdown"]) == 0
    assert capsys.readouterr().out == catalog.markdown(catalog.ALL_SPECS)
    assert catalog.main([]) == 0


def test_all_specs_hold_every_part_and_the_controller() -> None:
    parts = {s.collector for s in catalog.ALL_SPECS}
    assert parts == {
        "device",
        "gpm",
        "health",
        "nvlink",
        "processes",
        "mig",
        "self",
        "engines",
        "attribution",
        "pagecache",
        "progress",
        "controller",
    }
    assert set(catalog.CONTROLLER_SPECS).isdisjoint(catalog.EXPORTER_SPECS)


def test_controller_registry_exports_exactly_its_specs() -> None:
    from prometheus_client import CollectorRegistry

    from remediation.metrics import RemediationMetrics

    registry = CollectorRegistry()
    RemediationMetrics(registry)
    exported = {
        (f.name + "_total" if f.type == "counter" else f.name, f.type, f.documentation)
        for f in registry.collect()
    }
    # info series are written as gauges of 1 (remediation/metrics.py), as node_exporter writes them
    assert exported == {
        (s.name, "gauge" if s.type == "info" else s.type, s.help) for s in catalog.CONTROLLER_SPECS
    }


def test_validate_catches_buckets_outside_histograms() -> None:
    bad = MetricSpec("x_seconds", "gauge", "seconds", (), "h", "self", buckets=(1.0,))
    unsorted = MetricSpec("y_seconds", "histogram", "seconds", (), "h", "self", buckets=(2.0, 1.0))
    assert len(validate([bad, unsorted])) == 2


def _golden_types() -> dict[str, str]:
    types: dict[str, str] = {}
    for path in GOLDEN.glob("*.prom"):
        for m in re.finditer(r"^# TYPE (\S+) (\S+)$", path.read_text(), re.M):
            types[m.group(1)] = m.group(2)
    return types


def test_every_exported_family_is_in_the_catalog_with_its_type() -> None:
    specs = {s.name: s for s in catalog.ALL_SPECS}
    for name, kind in _golden_types().items():
        assert name in specs, f"{name} is exported but not in the catalog"
        expected = {"info": "gauge"}.get(specs[name].type, specs[name].type)
        assert kind == expected, name


def test_every_core_family_appears_in_some_golden_file() -> None:
    exported = set(_golden_types())
    missing = {s.name for s in catalog.CORE_SPECS} - exported - NOT_IN_GOLDEN
    assert missing == set()
