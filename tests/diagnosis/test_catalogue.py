"""The catalogue speaks our real metric names: every series it reads is in docs/metrics.md, is a
recording rule of alerts/*.rules.yaml, or is a neighbour's (node_exporter, kube-state-metrics, and
then marked as such); and every label it selects or joins our series on is one they carry."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpupulse.metrics.catalog import EXPORTER_SPECS
from remediation.diagnosis import catalogue
from remediation.diagnosis.types import LAYERS

ROOT = Path(__file__).resolve().parents[2]
# the neighbours' standard series the catalogue may read, by the source a signal must name
NEIGHBOURS = {
    "node_disk_read_bytes_total": "node_exporter",
    "node_cpu_seconds_total": "node_exporter",
    "node_pressure_cpu_waiting_seconds_total": "node_exporter",
    "kube_pod_start_time": "kube-state-metrics",
    "kube_pod_container_status_restarts_total": "kube-state-metrics",
}
_FUNCTIONS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "topk",
    "rate",
    "increase",
    "count_over_time",
    "time",
    "on",
    "or",
    "unless",
    "group_left",
    "vector",
    "by",
    "histogram_count",
}
# labels Prometheus' scrape configuration adds (our chart's `node`, kube-prometheus' `instance`)
_SCRAPE_LABELS = {"node", "instance", "cluster", "job"}
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
        and t not in {"cluster", "namespace", "pod", "workload", "m"}
    }


def _all_signals() -> list[catalogue.Signal]:
    out = [
        s for c in catalogue.CAUSES for s in (c.primary, *c.corroborating, *(r.signal for r in c.requires))
    ]
    return out + list(catalogue.CONTEXT) + list(catalogue.SYMPTOMS_BY_ALERT.values())


def test_every_series_the_catalogue_reads_is_documented_or_node_exporter() -> None:
    known = _documented()
    for signal in _all_signals():
        for name in _series_names(signal.query):
            base = next((name[: -len(s)] for s in _HISTOGRAM_SUFFIXES if name.endswith(s)), name)
            if name in NEIGHBOURS:
                assert signal.source == NEIGHBOURS[name], signal.id
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


def test_the_labels_the_catalogue_selects_and_joins_on_are_those_of_the_exporters_catalog() -> None:
    specs = {spec.name: spec for spec in EXPORTER_SPECS}
    checked = 0
    for signal in _all_signals():
        query = re.sub(r'"[^"]*"', '""', signal.query)
        for name, matchers in re.findall(r"([a-z_]+)\{([^}]*)\}", query):
            if name in specs:
                used = set(re.findall(r"([a-z_]+)\s*(?:=~|!=|!~|=)", matchers))
                assert used <= set(specs[name].labels) | _SCRAPE_LABELS, (signal.id, name, used)
                checked += 1
        # `unless on(L) m{`, `sum by (L) (m{`: the series right after the join carries its labels
        joins = r"\b(?:on|by)\s*\(([^)]*)\)\s*(?:group_left\(\)\s*)?[\s(]*(?:[a-z_]+\s*\()*\s*([a-z_:]+)\{"
        for group, name in re.findall(joins, query):
            for label in filter(None, (x.strip() for x in group.split(","))):
                if name in specs:
                    assert label in set(specs[name].labels) | _SCRAPE_LABELS, (signal.id, name, label)
                    checked += 1
    assert checked > 20


def test_causes_that_explain_others_name_causes_that_exist() -> None:
    for c in catalogue.CAUSES:
        assert set(c.explains) <= catalogue.CAUSE_IDS - {c.id}, c.id
