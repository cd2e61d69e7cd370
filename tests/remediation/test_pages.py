"""The pages a human reads, built by remediation/decide/pages.py: every field of an incident's page,
its diagnosis and dashboard link, a storm's summary page, the breaker's group page and the budget.
(tests/remediation/test_engine_pages*.py drive the same through the engine.)"""

from __future__ import annotations

import dataclasses
from typing import Any

from remediation.decide.pages import (
    SUMMARY_TARGETS,
    breaker_page,
    dashboard_link,
    incident_page,
    job_evidence,
    page_budget_spent,
    page_diagnosis,
    runbook_for,
    summary_page,
    with_diagnosis,
)
from remediation.diagnosis.types import Candidate, Diagnosis, Point, SignalEvidence
from remediation.model import Target
from remediation.records import Incident
from remediation.settings import BudgetSettings
from remediation.signatures import Signature, unknown_signature

BASE = "https://runbooks.example/gpupulse/"
POD = Target(kind="pod", node="n1", namespace="llm", pod="vllm-0")
SIG: Signature = dataclasses.replace(
    unknown_signature("serving_latency"), name="serving-latency", reason="the signature's reason"
)


def incident(**kw: Any) -> Incident:
    fields: dict[str, Any] = {
        "id": 7,
        "key": "serving-latency|pod:llm/vllm-0",
        "signature": "serving-latency",
        "fault_class": "serving_latency",
        "alertname": "InferenceLatencyP99Spike",
        "target": POD,
        "loop_key": "",
        "state": "paged",
        "rung": "page",
        "attempt": 1,
        "rung_started_at": None,
        "temp_retries": 0,
        "next_at": None,
        "firing_fps": (),
        "resolved_at": None,
        "opened_at": 1_780_000_000.0,
        "updated_at": 1_780_000_000.0,
        "closed_at": None,
        "resolution": "",
        "reason": "",
        "labels": {},
        "annotations": {},
        "page_pending": False,
        "page_next_at": 0.0,
        "paged": True,
        "page_group": "",
        "group_sent": False,
        "trace_id": "",
        "span_id": "",
        "evidence_at": None,
        "held": 0,
        "page_sticky": False,
    }
    fields.update(kw)
    return Incident(**fields)


def evidence(signal: str) -> SignalEvidence:
    return SignalEvidence(
        signal=signal,
        title=f"{signal} title",
        query=f"{signal}_query",
        direction="down",
        changed=True,
        change_at=1_780_000_100.0,
        before=0.9,
        after=0.1,
        lead_seconds=30.0,
        strength=0.8,
        alignment=0.7,
        passed_gate=True,
        note="moved first",
        points=(Point(1.0, 2.0),),
    )


def candidate(n: int, score: float) -> Candidate:
    return Candidate(
        cause=f"host.cause_{n}", layer="host", title=f"cause {n}", score=score, evidence=(evidence(f"s{n}"),)
    )


def diagnosis(status: str = "diagnosed", confident: bool = True, n: int = 6) -> Diagnosis:
    return Diagnosis(
        status=status,  # type: ignore[arg-type]
        reason_code="",
        reason="one cause lines up",
        symptom_onset=1_780_000_130.0,
        window_start=1_779_997_600.25,
        window_end=1_780_000_200.5,
        computed_at=1_780_000_200.5,
        candidates=tuple(candidate(i, 0.123456 - i / 100) for i in range(n)),
        confident=confident,
        layers={"host": "cause", "serving": "ruled out: steady"},
    )


# -- the budget ----------------------------------------------------------------------------------

BUDGETS = BudgetSettings(max_pages_per_signature=3, max_pages_per_window=5, page_window_seconds=600.4)


def test_the_budget_lasts_below_both_limits() -> None:
    assert page_budget_spent(4, 2, "serving-latency", BUDGETS) == ""


def test_a_signature_spends_its_own_budget_at_its_limit() -> None:
    assert page_budget_spent(3, 3, "serving-latency", BUDGETS) == (
        "page budget of serving-latency spent: 3 of its incidents paged within 600 s (limit 3 per signature)"
    )


def test_all_signatures_spend_the_global_budget_at_its_limit() -> None:
    assert page_budget_spent(5, 1, "serving-latency", BUDGETS) == (
        "page budget spent: 5 incidents paged within 600 s (limit 5)"
    )
    assert page_budget_spent(6, 0, "serving-latency", BUDGETS).startswith("page budget spent: 6 incidents")


def test_a_signature_over_both_budgets_is_told_of_its_own_first() -> None:
    assert page_budget_spent(6, 4, "x", BUDGETS).startswith("page budget of x spent: 4 of its incidents")


# -- an incident's page --------------------------------------------------------------------------


def test_runbook_for_joins_the_base_and_the_name_once() -> None:
    assert runbook_for(BASE, "gpu_lost") == "https://runbooks.example/gpupulse/gpu_lost.md"
    assert runbook_for(BASE.rstrip("/"), "gpu_lost") == "https://runbooks.example/gpupulse/gpu_lost.md"


def test_an_incident_page_carries_every_field() -> None:
    inc = incident(reason="p99 doubled", labels={"severity": "warning"}, annotations={"summary": "p99 up"})
    history = [{"kind": "event", "status": "opened"}]
    page = incident_page(inc, SIG, history, BASE, resolved=False)
    assert page.dedup_key == "gpupulse-incident-7"
    assert page.summary == "p99 up on pod:llm/vllm-0: p99 doubled"
    assert page.severity == "warning"
    assert (page.fault_class, page.signature) == ("serving_latency", "serving-latency")
    assert page.runbook_url == "https://runbooks.example/gpupulse/serving_latency.md"
    assert page.target == POD and page.history == history
    assert page.resolved is False and page.diagnosis is None


def test_an_incident_page_falls_back_field_by_field() -> None:
    # no summary annotation: the alertname; no incident reason: the signature's; no severity: critical
    page = incident_page(incident(), SIG, [], BASE, resolved=True)
    assert page.summary == "InferenceLatencyP99Spike on pod:llm/vllm-0: the signature's reason"
    assert page.severity == "critical" and page.resolved is True
    # no alertname either: the fault class
    assert incident_page(incident(alertname=""), SIG, [], BASE, False).summary.startswith(
        "serving_latency on "
    )


def test_the_signature_decides_severity_and_runbook_before_the_alert_does() -> None:
    sig = dataclasses.replace(SIG, page_severity="info", runbook_url="https://sig.example/rb.md")
    page = incident_page(incident(labels={"severity": "critical"}), sig, [], BASE, False)
    assert (page.severity, page.runbook_url) == ("info", "https://sig.example/rb.md")
    # and the alert's own runbook annotation before the signature's
    annotated = incident(annotations={"runbook_url": "https://alert.example/rb.md"})
    assert incident_page(annotated, sig, [], BASE, False).runbook_url == "https://alert.example/rb.md"


def test_a_job_incident_page_names_its_suspect() -> None:
    job = Target(
        kind="job",
        node="n2",
        namespace="train",
        uuid="GPU-9",
        training_job_kind="PyTorchJob",
        training_job="llm",
    )
    labels = {"rank": "3", "gpu": "1", "signal": "step_time"}
    page = incident_page(incident(target=job, labels=labels), SIG, [], BASE, False)
    assert page.summary == (
        "InferenceLatencyP99Spike on job:train/PyTorchJob/llm (suspect: rank 3, GPU 1 (GPU-9), node n2, "
        "signal step_time): the signature's reason"
    )


def test_job_evidence_names_what_it_has() -> None:
    assert job_evidence(Target(kind="job", uuid="GPU-9"), {}) == " (suspect: GPU ? (GPU-9))"
    assert job_evidence(Target(kind="job"), {"gpu": "2"}) == " (suspect: GPU 2 (?))"
    assert job_evidence(Target(kind="job", namespace="t", pod="w-1"), {}) == " (suspect: pod t/w-1)"
    # only a job names a suspect: a GPU's or an exporter's page (kinds that sort before "job") does not
    labels = {"rank": "3", "gpu": "1"}
    for kind in ("exporter", "gpu", "node", "pod"):
        assert job_evidence(Target(kind=kind, node="n1", uuid="GPU-1", pod="p"), labels) == "", kind  # type: ignore[arg-type]


def test_a_page_carries_its_diagnosis_and_a_resolve_does_not() -> None:
    d = diagnosis()
    page = incident_page(incident(), SIG, [], BASE, False, d, "https://grafana.example/d/x")
    assert page.summary == (
        "InferenceLatencyP99Spike on pod:llm/vllm-0: the signature's reason | diagnosis: host: cause 0"
    )
    assert page.diagnosis is not None and page.diagnosis["headline"] == "host: cause 0"
    resolve = incident_page(incident(), SIG, [], BASE, True, d, "https://grafana.example/d/x")
    assert resolve.diagnosis is None and " | diagnosis: " not in resolve.summary


def test_a_fresher_diagnosis_replaces_the_older_one_on_the_page() -> None:
    page = incident_page(incident(), SIG, [], BASE, False, diagnosis(confident=False), "")
    assert page.summary.endswith(" | diagnosis: host: cause 0 (not certain)")
    fresher = with_diagnosis(page, diagnosis(status="inconclusive"), "", {})
    assert fresher.summary == (
        "InferenceLatencyP99Spike on pod:llm/vllm-0: the signature's reason | diagnosis: no diagnosis: "
        "one cause lines up"
    )
    assert fresher.diagnosis is not None and fresher.diagnosis["status"] == "inconclusive"


def test_page_diagnosis_is_enough_to_act_on() -> None:
    labels = {"node": "n1", "namespace": "llm", "pod": "vllm-0"}
    got = page_diagnosis(diagnosis(), "https://grafana.example/d/x", labels)
    primary = {k: v for k, v in evidence("s0").to_dict().items() if k != "points"}
    assert got == {
        "headline": "host: cause 0",
        "status": "diagnosed",
        "top_cause": "host.cause_0",
        "layer": "host",
        "confident": True,
        "reason": "one cause lines up",
        "symptom_onset": 1_780_000_130.0,
        "evidence": [primary],
        # the three runners-up, scores rounded to three places
        "others": [
            {"cause": "host.cause_1", "score": 0.113},
            {"cause": "host.cause_2", "score": 0.103},
            {"cause": "host.cause_3", "score": 0.093},
        ],
        "layers": {"host": "cause", "serving": "ruled out: steady"},
        "dashboard_url": (
            "https://grafana.example/d/x?from=1779997600250&to=1780000200500"
            "&var-node=n1&var-namespace=llm&var-pod=vllm-0"
        ),
    }
    assert "points" not in got["evidence"][0] and primary["signal"] == "s0"


def test_page_diagnosis_without_a_cause() -> None:
    got = page_diagnosis(diagnosis(status="inconclusive", n=2), "", {})
    assert (got["top_cause"], got["layer"], got["evidence"], got["dashboard_url"]) == (None, None, [], "")
    assert got["others"] == [{"cause": "host.cause_1", "score": 0.113}]


def test_the_dashboard_link_spans_the_diagnosis_window_with_the_incidents_variables() -> None:
    d = diagnosis()
    labels = {"cluster": "c1", "node": "n1", "namespace": "", "pod": "vllm-0", "model": "llama", "gpu": "3"}
    assert dashboard_link("https://g.example/d/x?orgId=1", d, labels) == (
        "https://g.example/d/x?orgId=1&from=1779997600250&to=1780000200500"
        "&var-cluster=c1&var-node=n1&var-pod=vllm-0&var-model=llama"
    )
    assert dashboard_link("", d, labels) == ""


# -- a storm's summary page ----------------------------------------------------------------------

BUDGETS_20 = BudgetSettings(max_pages_per_signature=3, max_pages_per_window=20, page_window_seconds=600.0)
STATE = {
    "group": "summary-serving-latency-1780000000",
    "signature": "serving-latency",
    "started_at": 1_780_000_000.0,
}


def members(n: int) -> list[Incident]:
    return [
        incident(id=100 + i, target=Target(kind="pod", namespace="llm", pod=f"p{i}"), reason=f"r{i}")
        for i in range(n)
    ]


def test_a_summary_page_counts_names_the_first_ten_and_links_all() -> None:
    page = summary_page(STATE, members(12), SIG, BUDGETS_20, "https://rem.example/", BASE, False)
    first = ", ".join(f"pod:llm/p{i}" for i in range(10))
    assert page.summary == (
        "12 incidents of serving-latency (serving_latency) since 2026-05-28T20:26:40+00:00; past the page "
        f"budget (3 of one signature, 20 in all, per 600 s) they share this page. First targets: {first} "
        "and 2 more. All of them: https://rem.example/api/v1/incidents?signature=serving-latency&state=active"
    )
    assert page.dedup_key == "gpupulse-summary-serving-latency-1780000000"
    assert (page.severity, page.fault_class, page.signature) == (
        "critical",
        "serving_latency",
        "serving-latency",
    )
    assert page.runbook_url == "https://runbooks.example/gpupulse/serving_latency.md"
    assert page.target == Target(kind="pod", namespace="llm", pod="p0")
    assert len(page.history) == SUMMARY_TARGETS == 10
    assert page.history[0] == {
        "incident_id": 100,
        "target": "pod:llm/p0",
        "alertname": "InferenceLatencyP99Spike",
        "state": "paged",
        "opened_at": 1_780_000_000.0,
        "reason": "r0",
    }
    assert page.resolved is False and page.diagnosis is None


def test_a_summary_of_ten_names_them_all_and_eleven_counts_one_more() -> None:
    ten = summary_page(STATE, members(10), SIG, BUDGETS_20, "https://rem.example", BASE, False)
    assert "pod:llm/p9. All of them:" in ten.summary and " more" not in ten.summary
    eleven = summary_page(STATE, members(11), SIG, BUDGETS_20, "https://rem.example", BASE, True)
    assert "pod:llm/p9 and 1 more. All of them:" in eleven.summary and eleven.resolved is True


def test_a_summary_page_takes_the_signatures_severity_and_runbook() -> None:
    sig = dataclasses.replace(SIG, page_severity="warning", runbook_url="https://sig.example/rb.md")
    page = summary_page(STATE, members(1), sig, BUDGETS_20, "", BASE, False)
    assert (page.severity, page.runbook_url) == ("warning", "https://sig.example/rb.md")


def test_a_summary_page_with_no_members_left_names_no_target() -> None:
    page = summary_page(STATE, [], SIG, BUDGETS_20, "", BASE, True)
    assert page.target == Target(kind="node") and page.history == []
    assert page.summary.startswith("0 incidents of serving-latency") and " more" not in page.summary


def test_the_breaker_page_groups_every_member() -> None:
    breaker = {"reason": "4 actions in flight (limit 4)"}
    page = breaker_page(breaker, "breaker-1780000000", members(2), BASE)
    assert page.dedup_key == "gpupulse-breaker-1780000000"
    assert page.summary == (
        "Remediation breaker open (4 actions in flight (limit 4)): 2 incidents need a human; automation "
        "stopped until someone resets the breaker"
    )
    assert (page.severity, page.fault_class, page.signature) == ("critical", "breaker", "safety-breaker")
    assert page.runbook_url == "https://runbooks.example/gpupulse/remediation-breaker.md"
    assert page.target == Target(kind="node") and page.resolved is False
    assert page.history[1] == {
        "incident_id": 101,
        "signature": "serving-latency",
        "fault_class": "serving_latency",
        "alertname": "InferenceLatencyP99Spike",
        "target": "pod:llm/p1",
        "opened_at": 1_780_000_000.0,
        "reason": "r1",
    }
