"""The contract module and docs/alerts.md say the same: label names, their values, target identity."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupulse.contract import (
    ALERT_LABELS,
    FAULT_CLASSES,
    LAYERS,
    SEVERITIES,
    TARGET_IDENTITY,
    TARGET_KINDS,
)
from gpupulse.xid import XID_CLASSES, xid_class

ALERTS_MD = (Path(__file__).resolve().parents[2] / "docs" / "alerts.md").read_text()


def _section(heading: str) -> str:
    return ALERTS_MD.split(heading, 1)[1].split("\n## ", 1)[0]


def _label_row(label: str) -> list[str]:
    """The backticked values in the `values` column of a label's row."""
    table = _section("## Labels every gpupulse alert carries")
    (row,) = re.findall(rf"^\| `{label}` \| ([^|]*)\|", table, re.M)
    return re.findall(r"`([a-z_]+)`", row)


def test_the_docs_list_the_label_values_of_the_contract() -> None:
    assert tuple(_label_row("severity")) == SEVERITIES
    assert tuple(_label_row("layer")) == LAYERS
    assert tuple(_label_row("target_kind")) == TARGET_KINDS
    for label in ALERT_LABELS:
        assert f"| `{label}` |" in _section("## Labels every gpupulse alert carries"), label


def test_the_docs_identify_targets_as_the_contract_does() -> None:
    rows = re.findall(r"^\| `([a-z]+)` \| ([^|]*)\|", _section("Identity of a remediation target"), re.M)
    documented = {kind: tuple(re.findall(r"`([a-z_]+)`", text.split("(")[0])) for kind, text in rows}
    assert documented == dict(TARGET_IDENTITY)
    assert set(TARGET_IDENTITY) == set(TARGET_KINDS)


def test_the_docs_table_of_fault_classes_is_the_contract_in_order() -> None:
    documented = re.findall(r"^\| `([a-z_]+)` \|", _section("## Fault classes"), re.M)
    assert tuple(documented) == FAULT_CLASSES


def test_every_xid_class_names_a_fault_class_of_the_contract() -> None:
    assert {cls.fault_class for cls in XID_CLASSES} <= set(FAULT_CLASSES)
    codes = [code for cls in XID_CLASSES for code in cls.codes]
    assert len(codes) == len(set(codes)), "an XID code belongs to one class"


def test_an_unknown_xid_class_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"restart_app.*fell_off_bus"):
        xid_class("reboot")
