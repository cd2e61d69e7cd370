"""Fixtures of the alert tests: the committed rules, parsed once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.alerts.ruleset import load_rules


@pytest.fixture(scope="session")
def alert_rules() -> list[dict[str, Any]]:
    return [r for r in load_rules() if "alert" in r]


@pytest.fixture(scope="session")
def recording_rules() -> list[dict[str, Any]]:
    return [r for r in load_rules() if "record" in r]
