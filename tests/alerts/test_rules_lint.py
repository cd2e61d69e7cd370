"""Every alert has the kubernetes-mixin anatomy and the label contract of docs/alerts.md, a runbook, and
selects only metrics the exporter catalog (or the controller) declares."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from alerts.config import ConfigError, load_config
from alerts.rules import rule_files
from alerts.rules.promql import base_metric, metric_names
from gpupulse.contract import ALERT_LABELS, LAYERS, SEVERITIES, TARGET_KINDS
from tests.alerts.ruleset import ROOT, RUNBOOKS_DIR, known_metrics

CONTRACT = ROOT / "docs" / "alerts.md"
RUNBOOK_URL = "https://github.com/gpupulse/gpupulse/blob/main/docs/runbooks/{}.md"
PROMETHEUS_INTERNAL = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "time"}


def contract_table(heading: str) -> list[str]:
    """First-column values of the markdown table under a heading of docs/alerts.md."""
    text = CONTRACT.read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)


def test_alert_names_are_camel_case_and_unique(alert_rules: list[dict[str, Any]]) -> None:
    names = [r["alert"] for r in alert_rules]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"(?:[A-Z][a-z0-9]*|GPU|XID|KV|P99|ECC|PCIe)+", name), name


def test_every_alert_has_the_anatomy(alert_rules: list[dict[str, Any]]) -> None:
    for rule in alert_rules:
        assert rule.get("for"), rule["alert"]
        assert set(ALERT_LABELS) <= set(rule["labels"]), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, rule["alert"]
        assert "{{" not in rule["annotations"]["summary"], "summaries are static (kubernetes-mixin)"
        assert "{{ $labels." in rule["annotations"]["description"], rule["alert"]
        assert rule["annotations"]["runbook_url"] == RUNBOOK_URL.format(rule["alert"])


def test_label_values_are_those_of_the_contract(alert_rules: list[dict[str, Any]]) -> None:
    fault_classes = set(contract_table("Fault classes"))
    assert {"xid_app", "memory_leak", "observability"} <= fault_classes
    for rule in alert_rules:
        labels = rule["labels"]
        assert labels["severity"] in SEVERITIES
        assert labels["layer"] in LAYERS
        assert labels["target_kind"] in TARGET_KINDS
        assert labels["fault_class"] in fault_classes, f"{rule['alert']}: {labels['fault_class']}"


def test_alerts_named_in_the_fault_class_table_exist_with_that_class(
    alert_rules: list[dict[str, Any]],
) -> None:
    by_name = {r["alert"]: r["labels"]["fault_class"] for r in alert_rules}
    text = CONTRACT.read_text().split("## Fault classes", 1)[1].split("\n## ", 1)[0]
    for row in re.findall(r"^\| `([a-z_]+)` \| ([^|]*)\|", text, flags=re.MULTILINE):
        fault_class, typical = row
        for name in re.findall(r"`([A-Z][A-Za-z0-9]+)`", typical):
            if name == "KubePodCrashLooping":  # kube-state-metrics' alert, not ours
                continue
            assert by_name.get(name) == fault_class, f"{name} should carry fault_class {fault_class}"


def test_every_alert_has_a_runbook(alert_rules: list[dict[str, Any]]) -> None:
    for rule in alert_rules:
        path = RUNBOOKS_DIR / f"{rule['alert']}.md"
        assert path.is_file(), path
        text = path.read_text()
        for heading in ("## Meaning", "## Confirm", "## Automation", "## What to do"):
            assert heading in text, f"{path.name} lacks {heading}"
        labels = rule["labels"]
        # the runbook's header table must say what the rule says
        assert f"| Severity | `{labels['severity']}` |" in text, path.name
        assert f"| fault_class | `{labels['fault_class']}` |" in text, path.name
        assert f"| target_kind | `{labels['target_kind']}`" in text, path.name
        assert f"| for | `{rule['for']}` |" in text, path.name


def test_alert_table_in_docs_lists_every_alert(alert_rules: list[dict[str, Any]]) -> None:
    text = CONTRACT.read_text()
    for rule in alert_rules:
        labels = rule["labels"]
        row = (
            f"| [{rule['alert']}](runbooks/{rule['alert']}.md) | `{labels['severity']}` | {rule['for']} | "
            f"`{labels['layer']}` | `{labels['fault_class']}` | `{labels['target_kind']}` |"
        )
        assert row in text, f"docs/alerts.md row out of date: {row}"


def test_recording_rules_are_named_level_metric_operations(recording_rules: list[dict[str, Any]]) -> None:
    for rule in recording_rules:
        assert re.fullmatch(r"[a-z_]*:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_rules_select_only_known_metrics(
    alert_rules: list[dict[str, Any]], recording_rules: list[dict[str, Any]]
) -> None:
    allowed = known_metrics() | PROMETHEUS_INTERNAL | {r["record"] for r in recording_rules}
    for rule in alert_rules + recording_rules:
        used = {base_metric(n) if n not in allowed else n for n in metric_names(rule["expr"])}
        unknown = used - allowed
        assert not unknown, f"{rule.get('alert') or rule.get('record')} uses unknown metrics {unknown}"


def test_metric_name_extraction_ignores_labels_functions_and_keywords() -> None:
    expr = (
        'sum by (node, uuid) (rate(x_total{pod!="", a=~"b|c"}[5m])) / on(uuid) group_left(pod) '
        "y_info > bool 0.3 or max_over_time(z_bucket[1h] offset 10m) unless vector(0)"
    )
    assert metric_names(expr) == {"x_total", "y_info", "z_bucket"}
    assert base_metric("z_bucket") == "z"


def test_missing_threshold_is_a_config_error(tmp_path: Path) -> None:
    from alerts.config import DEFAULT_CONFIG_PATH

    text = DEFAULT_CONFIG_PATH.read_text().replace("  temperature_celsius: 85", "")
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="temperature_celsius"):
        load_config(path)


def test_a_limit_hold_shorter_than_three_intervals_is_a_config_error() -> None:
    # the held limit is looked up over memory_limit_hold; a shorter one drops it at one late evaluation
    with pytest.raises(ConfigError, match="memory_limit_hold"):
        load_config(overrides={"windows": {"memory_history_interval": "5m", "memory_limit_hold": "10m"}})
    load_config(overrides={"windows": {"memory_history_interval": "5m", "memory_limit_hold": "15m"}})


def test_for_of_an_unknown_alert_is_a_config_error() -> None:
    config = load_config(overrides={"for": {"GPUDoesNotExist": "5m"}})
    with pytest.raises(ConfigError, match="GPUDoesNotExist"):
        rule_files(config)


def test_thresholds_come_from_the_config() -> None:
    config = load_config(
        overrides={"thresholds": {"temperature_celsius": 91}, "for": {"GPUTemperatureHigh": "3m"}}
    )
    (hardware,) = [f for f in rule_files(config) if f.name == "hardware"]
    (temp,) = [a for a in hardware.alerts() if a.alert == "GPUTemperatureHigh"]
    assert temp.expr.endswith("> 91") and temp.for_ == "3m"
