"""Paths and parsed rule files shared by the alert tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS_DIR = ROOT / "alerts"
TESTS_DIR = Path(__file__).resolve().parent
RUNBOOKS_DIR = ROOT / "docs" / "runbooks"


def rule_paths() -> list[Path]:
    """Committed rule files."""
    return sorted(ALERTS_DIR.glob("*.rules.yaml"))


def unit_test_paths() -> list[Path]:
    """promtool unit-test files."""
    return sorted(TESTS_DIR.glob("*.test.yaml"))


def load_rules() -> list[dict[str, Any]]:
    """Every rule (recording and alerting) of the committed files."""
    rules: list[dict[str, Any]] = []
    for path in rule_paths():
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


def known_metrics() -> set[str]:
    """Every metric gpupulse exports, the exporter's and the controller's (gpupulse.metrics.catalog)."""
    from gpupulse.metrics.catalog import ALL_SPECS

    return {spec.name for spec in ALL_SPECS}
