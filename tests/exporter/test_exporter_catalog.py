"""The catalog is the one source: names follow the conventions, output matches it (docs/metrics.md
matching it is tests/test_generated.py's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter import catalog

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
# Families no shipped scenario produces (fan speed: the simulated boards are fanless).
NOT_IN_GOLDEN = {"gpu_fan_speed_ratio"}


def test_catalog_follows_naming_conventions() -> None:
    assert catalog.validate(catalog.ALL_METRICS) == []


def test_validate_catches_bad_names() -> None:
    bad = catalog.MetricSpec("gpu_thing", "counter", "bytes", ("gpu",), "", "device")
    problems = catalog.validate([bad, bad])
    assert any("declared twice" in p for p in problems)
    assert any("end in _total" in p for p in problems)
    assert any("unit bytes" in p for p in problems)
    assert any("no help" in p for p in problems)
    assert any("uuid and gpu" in p for p in problems)


def test_catalog_main_prints_the_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert catalog.main(["--markdown"]) == 0
    assert capsys.readouterr().out == catalog.markdown(catalog.ALL_METRICS)
    assert catalog.main([]) == 0


def test_all_metrics_include_the_plugin_specs_that_exist() -> None:
    names = {s.name for s in catalog.ALL_METRICS}
    for module, attribute in catalog._PLUGIN_SPECS:
        try:
            specs = getattr(__import__(module, fromlist=[attribute]), attribute)
        except ImportError:
            continue
        assert {s.name for s in specs} <= names


def _golden_types() -> dict[str, str]:
    types: dict[str, str] = {}
    for path in GOLDEN.glob("*.prom"):
        for m in re.finditer(r"^# TYPE (\S+) (\S+)$", path.read_text(), re.M):
            types[m.group(1)] = m.group(2)
    return types


def test_every_exported_family_is_in_the_catalog_with_its_type() -> None:
    specs = {s.name: s for s in catalog.ALL_METRICS}
    for name, kind in _golden_types().items():
        assert name in specs, f"{name} is exported but not in the catalog"
        expected = {"info": "gauge"}.get(specs[name].type, specs[name].type)
        assert kind == expected, name


def test_every_core_family_appears_in_some_golden_file() -> None:
    exported = set(_golden_types())
    missing = {s.name for s in catalog.CORE_METRICS} - exported - NOT_IN_GOLDEN
    assert missing == set()
