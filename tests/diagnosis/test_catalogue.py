"""The catalogue speaks our real metric names: every series it reads is in docs/metrics.md, is a
recording rule of alerts/*.rules.yaml, or is node_exporter's (and then marked as such)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from remediation.diagnosis import catalogue
from remediation.diagnosis.types import LAYERS

ROOT = Path(__file__).resolve().parents[2]
NODE_EXPORTER = {"node_disk_read_bytes_total", "node_cpu_seconds_total"}
_FUNCTIONS = {
    "sum",
    "max",
    "min",
    "avg",
    "rate",
    "increase",
    "on",
    "or",
    "group_left",
    "vector",
    "by",
    "histogram_count",
}
_HISTOGRAM_SUFFIXES = ("_count", "_sum", "_bucket")


def _documented() -> set[str]:
    names = set(re.findall(r"^\| `([a-z_:]+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M))
    for rules in (ROOT / "alerts").glob("*.rules.yaml"):
        for group in yaml.safe_load(rules.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def _series_names(query: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', query)
    without_labels = re.sub(r"\{[^}]*\}", "", without_strings)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_labels))
    return {
        t
        for t in tokens
        if t not in _FUNCTIONS
        and not re.fullmatch(r"[0-9]+[smhd]", t)
        and t not in {"cluster", "namespace", "workload", "m"}
    }


def _all_signals() -> list[catalogue.Signal]:
    out = [s for c in catalogue.CAUSES for s in (c.primary, *c.corroborating)]
    return out + list(catalogue.CONTEXT) + list(catalogue.SYMPTOMS_BY_ALERT.values())


def test_every_series_the_catalogue_reads_is_documented_or_node_exporter() -> None:
    known = _documented()
    for signal in _all_signals():
        for name in _series_names(signal.query):
            base = next((name[: -len(s)] for s in _HISTOGRAM_SUFFIXES if name.endswith(s)), name)
            if name in NODE_EXPORTER:
                assert signal.source == "node_exporter", signal.id
            else:
                assert name in known or base in known, (
                    f"{signal.id}: {name} is not in docs/metrics.md or the rules"
                )


def test_causes_are_unique_and_named_by_their_layer() -> None:
    ids = [c.id for c in catalogue.CAUSES]
    assert len(ids) == len(set(ids))
    for c in catalogue.CAUSES:
        assert c.layer in LAYERS and c.id.startswith(f"{c.layer}.")
    # every layer of the method has at least one candidate
    assert {c.layer for c in catalogue.CAUSES} == set(LAYERS)


def test_symptom_alerts_are_alerts_that_exist() -> None:
    alerts = {
        r["alert"]
        for rules in (ROOT / "alerts").glob("*.rules.yaml")
        for g in yaml.safe_load(rules.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert set(catalogue.SYMPTOMS_BY_ALERT) <= alerts
