"""The alert/controller contract holds end to end: every shipped alert, with the labels its rule really
emits after aggregation, reaches the signature meant for it; the XID classes have one home that the
rules, the signatures and the docs all follow."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupulse.contract import FAULT_CLASSES, TARGET_KINDS
from gpupulse.xid import XID_CLASSES
from remediation.ladder import target_from_labels, target_problem
from remediation.signatures import KNOWN_FAULT_CLASSES, Signature, SignatureLibrary, load_library

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "alerts").glob("*.rules.yaml"))
PROMTOOL_TESTS = sorted((REPO / "tests" / "alerts").glob("*.test.yaml"))


def _alert_rules() -> dict[str, dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules[rule["alert"]] = rule
    return rules


def _emitted() -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """(alertname, labels, annotations) of every alert the promtool tests expect. promtool checks
    these against what the rule really emits (exact label sets, after aggregation), so they are the
    labels Alertmanager hands the controller, less the external labels Prometheus adds."""
    for path in PROMTOOL_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test") or []:
                for exp in case.get("exp_alerts") or []:
                    labels = {
                        "alertname": case["alertname"],
                        **{k: str(v) for k, v in exp["exp_labels"].items()},
                    }
                    yield case["alertname"], labels, dict(exp.get("exp_annotations") or {})


EMITTED = list(_emitted())


def _meant_for(lib: SignatureLibrary, alertname: str, fault_class: str) -> Signature:
    """The signature written for this alert: its XID class's signature for the XID alerts, else the
    class signature of its fault_class (the one matching that label alone)."""
    for cls in XID_CLASSES:
        if cls.alertname == alertname:
            (sig,) = [s for s in lib if s.matcher.xid_class == cls]
            return sig
    (sig,) = [
        s
        for s in lib
        if s.matcher.to_dict() == {"labels": {"fault_class": fault_class}} and s.origin == "builtin"
    ]
    return sig


def test_every_shipped_alert_is_covered_by_a_promtool_case_that_fires() -> None:
    assert set(_alert_rules()) == {name for name, _, _ in EMITTED}


@pytest.mark.parametrize(
    ("alertname", "labels", "annotations"),
    EMITTED,
    ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(EMITTED)],
)
def test_each_emitted_alert_reaches_the_signature_meant_for_it(
    alertname: str, labels: dict[str, str], annotations: dict[str, str]
) -> None:
    lib = load_library()
    got = lib.match(labels, annotations)
    want = _meant_for(lib, alertname, labels["fault_class"])
    assert got.name == want.name, (labels, [s.name for s in lib.candidates(labels, annotations)])
    # and the controller can identify its target wherever the ladder would act
    target, known = target_from_labels(labels)
    assert known and target.kind == labels["target_kind"]
    if got.ladder.rungs != ("page",) and not (alertname == "GPUXidAppError" and "pod" not in labels):
        assert target_problem(target, known) == "", labels


def test_an_idle_allocated_gpu_is_a_ticket_for_its_workload_never_a_page() -> None:
    """Issue 40: GPUIdleWhileAllocated fired on every serving GPU every night and its signature paged.
    What it emits now reaches a signature that only ever sends an info page (a ticket), and carries
    the workload the chart's Alertmanager route groups it by."""
    lib = load_library()
    emitted = [(labels, ann) for name, labels, ann in EMITTED if name == "GPUIdleWhileAllocated"]
    assert emitted
    for labels, ann in emitted:
        sig = lib.match(labels, ann)
        assert sig.name == "idle-allocated"
        assert sig.ladder.rungs == ("page",) and sig.page_severity == "info"
        assert labels["severity"] == "warning" and labels["workload"]


def test_gpu_fell_off_bus_reaches_the_xid_79_signature_though_it_aggregates_xid_away() -> None:
    rule = _alert_rules()["GPUFellOffBus"]
    assert "xid" not in re.findall(r"max by \(([^)]*)\)", rule["expr"])[0]
    labels = {"alertname": "GPUFellOffBus", **rule["labels"], "node": "n", "uuid": "u", "gpu": "0"}
    assert load_library().match(labels, {}).name == "xid-79-fell-off-bus"


@pytest.mark.parametrize("cls", XID_CLASSES, ids=[c.name for c in XID_CLASSES])
def test_the_rules_select_the_xid_codes_of_the_contract(cls: Any) -> None:
    rule = _alert_rules()[cls.alertname]
    assert f'xid=~"{cls.regex}"' in rule["expr"]
    assert rule["labels"]["fault_class"] == cls.fault_class
    other = {str(c) for k in XID_CLASSES if k is not cls for c in k.codes}
    assert not other & set(re.findall(r'xid=~"([0-9|]+)"', rule["expr"])[0].split("|"))


@pytest.mark.parametrize("cls", XID_CLASSES, ids=[c.name for c in XID_CLASSES])
def test_every_code_of_a_class_and_no_other_reaches_its_signature(cls: Any) -> None:
    lib = load_library()
    (sig,) = [s for s in lib if s.matcher.xid_class == cls]
    for klass in XID_CLASSES:
        for code in klass.codes:
            # a foreign rule's alert carrying only the code, as DCGM-style rules send it
            matched = lib.match({"alertname": "GpuXidError", "xid": str(code)}, {})
            assert (matched.name == sig.name) == (klass is cls), (code, matched.name)
    assert lib.match({"alertname": "GpuXidError", "xid": "999"}, {}).name == "unknown-fault"


@pytest.mark.parametrize("cls", XID_CLASSES, ids=[c.name for c in XID_CLASSES])
def test_the_docs_list_the_xid_codes_of_the_contract(cls: Any) -> None:
    codes = ", ".join(str(c) for c in cls.codes)
    alerts_md = (REPO / "docs" / "alerts.md").read_text()
    assert f"`{cls.alertname}` (XID {codes}" in alerts_md, cls.name
    engine_md = (REPO / "docs" / "design" / "remediation-engine.md").read_text()
    assert f"xid {codes} (" in engine_md or f"`xid_class: {cls.name}` (XID {codes})" in engine_md, cls.name
    runbook = (REPO / "docs" / "runbooks" / f"{cls.alertname}.md").read_text().split("## Confirm")[0]
    mentioned = {int(n) for n in re.findall(r"\b(\d{2,3})\b", runbook)}
    assert set(cls.codes) <= mentioned, (cls.alertname, set(cls.codes) - mentioned)


def test_fault_classes_and_target_kinds_have_one_home() -> None:
    assert frozenset(FAULT_CLASSES) == KNOWN_FAULT_CLASSES
    assert len(set(FAULT_CLASSES)) == len(FAULT_CLASSES)
    kinds = {r["labels"]["target_kind"] for r in _alert_rules().values()}
    assert kinds <= set(TARGET_KINDS)


def test_a_controller_alert_names_its_namespace_and_never_a_node() -> None:
    from remediation.ladder import incident_identity, target_from_labels, target_problem

    labels = {"target_kind": "controller", "namespace": "gpupulse", "job": "ctl", "instance": "10.0.0.7:9836"}
    target, known = target_from_labels(labels)
    assert known and target.kind == "controller"
    assert (target.namespace, target.node, target.pod) == ("gpupulse", "", "")  # instance is an exporter's
    assert target_problem(target, known) == ""
    assert incident_identity(target) == "controller:gpupulse"
