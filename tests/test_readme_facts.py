"""Statements of the README that code can hold true: how many alerts ship, which collectors there are."""

from __future__ import annotations

import re
from pathlib import Path

from exporter import registry
from tests.alerts.ruleset import load_rules

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_counts_the_alerts_that_ship() -> None:
    shipped = sum(1 for rule in load_rules() if "alert" in rule)
    counts = {int(n) for n in re.findall(r"\b(\d+) alerts with runbooks", README.read_text())}
    assert counts == {shipped}


def test_the_readme_lists_every_collector_flag() -> None:
    text = " ".join(README.read_text().split())
    listed = re.search(r"`--no-collector\.<name>` \(([a-z, ]+)\)", text)
    assert listed is not None
    names = [n.strip() for n in listed.group(1).split(",")]
    assert names == [*registry.BUILTINS, *(p.name for p in registry.PLUGINS)]
