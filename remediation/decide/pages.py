"""The pages a human receives: one incident's, the summary of a storm, the breaker's group; the budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from gpupulse.contract import RANK_LABEL, SIGNAL_LABEL
from remediation.diagnosis.types import Diagnosis
from remediation.ladder import incident_identity
from remediation.model import Page, Target
from remediation.records import Incident
from remediation.settings import BudgetSettings
from remediation.signatures import Signature

# a summary page names this many targets, then counts the rest
SUMMARY_TARGETS = 10


def runbook_for(base_url: str, name: str) -> str:
    return f"{base_url.rstrip('/')}/{name}.md"


def page_budget_spent(paged: int, paged_signature: int, signature: str, budgets: BudgetSettings) -> str:
    """Why no further incident of `signature` may page on its own ("" while both budgets last):
    `paged` counts the incidents that paged within the budget's window, `paged_signature` those of
    this signature. A storm of one signature spends its own budget first and leaves the rest of the
    global one to the other signatures."""
    window = f"{budgets.page_window_seconds:.0f} s"
    if paged_signature >= budgets.max_pages_per_signature:
        return (
            f"page budget of {signature} spent: {paged_signature} of its incidents paged within {window} "
            f"(limit {budgets.max_pages_per_signature} per signature)"
        )
    if paged >= budgets.max_pages_per_window:
        limit = budgets.max_pages_per_window
        return f"page budget spent: {paged} incidents paged within {window} (limit {limit})"
    return ""


def job_evidence(target: Target, labels: Mapping[str, str]) -> str:
    """What names the suspect of a job incident: its rank, pod, GPU, node and the signal (or "")."""
    if target.kind != "job":
        return ""
    parts = []
    if labels.get(RANK_LABEL):
        parts.append(f"rank {labels[RANK_LABEL]}")
    if target.pod:
        parts.append(f"pod {target.namespace}/{target.pod}")
    if target.uuid or labels.get("gpu"):
        parts.append(f"GPU {labels.get('gpu', '?')} ({target.uuid or '?'})")
    if target.node:
        parts.append(f"node {target.node}")
    if labels.get(SIGNAL_LABEL):
        parts.append(f"signal {labels[SIGNAL_LABEL]}")
    return f" (suspect: {', '.join(parts)})" if parts else " (no single rank is suspect)"


def cluster_left(history: Sequence[Mapping[str, Any]]) -> str:
    """What the incident's latest action left behind on the cluster (cordon, taint) and its undo, or ""."""
    for entry in reversed(history):
        if entry.get("kind") != "action":
            continue
        left = (entry.get("details") or {}).get("left")
        if left:
            return str(left)
    return ""


def drain_note(history: Sequence[Mapping[str, Any]]) -> str:
    """How the latest drain of a training job met its boundary (remediation/drain.py), or ""."""
    for entry in reversed(history):
        if entry.get("kind") == "event" and str(entry.get("status", "")).startswith("drain_"):
            return str(entry.get("summary", ""))
    return ""


def incident_page(
    inc: Incident,
    sig: Signature,
    history: Sequence[Mapping[str, Any]],
    runbook_base_url: str,
    resolved: bool,
    diagnosis: Diagnosis | None = None,
    dashboard_url: str = "",
) -> Page:
    """One incident's own page (or its resolve), with its latest diagnosis when it has one."""
    runbook = (
        inc.annotations.get("runbook_url")
        or sig.runbook_url
        or runbook_for(runbook_base_url, sig.fault_class)
    )
    summary = inc.annotations.get("summary") or inc.alertname or sig.fault_class
    evidence = job_evidence(inc.target, inc.labels)
    left = cluster_left(history)
    drained = drain_note(history)
    page = Page(
        dedup_key=f"gpupulse-incident-{inc.id}",
        summary=f"{summary} on {incident_identity(inc.target)}{evidence}: {inc.reason or sig.reason}"
        + (f" (cluster state: {left})" if left else "")
        + (f" (drain: {drained})" if drained else ""),
        severity=sig.page_severity or inc.labels.get("severity", "") or "critical",
        fault_class=sig.fault_class,
        signature=sig.name,
        runbook_url=runbook,
        target=inc.target,
        history=history,
        resolved=resolved,
    )
    if diagnosis is None or resolved:
        return page
    return with_diagnosis(page, diagnosis, dashboard_url, inc.labels)


def with_diagnosis(page: Page, diagnosis: Diagnosis, dashboard_url: str, labels: Mapping[str, str]) -> Page:
    """The page with this diagnosis: its headline ends the summary, its evidence and a dashboard link
    over the onset window go with it (a fresher diagnosis replaces an older one)."""
    base = page.summary.split(_DIAGNOSIS_SEP, 1)[0]
    return replace(
        page,
        summary=f"{base}{_DIAGNOSIS_SEP}{diagnosis.headline}",
        diagnosis=page_diagnosis(diagnosis, dashboard_url, labels),
    )


_DIAGNOSIS_SEP = " | diagnosis: "


def page_diagnosis(diagnosis: Diagnosis, dashboard_url: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """What a page carries of a diagnosis: enough to act on without opening another tool (the
    series' points stay in the incident's record)."""
    top = diagnosis.top
    evidence = [
        {k: v for k, v in e.to_dict().items() if k != "points"} for e in (top.evidence if top else ())
    ]
    return {
        "headline": diagnosis.headline,
        "status": diagnosis.status,
        "top_cause": top.cause if top else None,
        "layer": top.layer if top else None,
        "confident": diagnosis.confident,
        "reason": diagnosis.reason,
        "symptom_onset": diagnosis.symptom_onset,
        "evidence": evidence,
        "others": [{"cause": c.cause, "score": round(c.score, 3)} for c in diagnosis.candidates[1:4]],
        "layers": dict(diagnosis.layers),
        "dashboard_url": dashboard_link(dashboard_url, diagnosis, labels),
    }


def dashboard_link(base_url: str, diagnosis: Diagnosis, labels: Mapping[str, str]) -> str:
    """A Grafana link over the diagnosis window (from 40 min before the alert to the diagnosis), with
    the incident's node, namespace and pod as dashboard variables; "" without a base URL."""
    if not base_url:
        return ""
    params: dict[str, str] = {
        "from": str(int(diagnosis.window_start * 1000)),
        "to": str(int(diagnosis.window_end * 1000)),
    }
    for name in ("cluster", "node", "namespace", "pod", "model"):
        if labels.get(name):
            params[f"var-{name}"] = labels[name]
    sep = "&" if "?" in base_url else "?"
    return f"{base_url}{sep}{urlencode(params)}"


def summary_page(
    state: Mapping[str, Any],
    members: Sequence[Incident],
    sig: Signature,
    budgets: BudgetSettings,
    external_url: str,
    runbook_base_url: str,
    resolved: bool,
) -> Page:
    """The page that speaks for the incidents of one signature that paged over the budget."""
    signature = str(state["signature"])
    targets = [incident_identity(m.target) for m in members]
    first = ", ".join(targets[:SUMMARY_TARGETS])
    more = f" and {len(targets) - SUMMARY_TARGETS} more" if len(targets) > SUMMARY_TARGETS else ""
    query = urlencode({"signature": signature, "state": "active"})
    link = f"{external_url.rstrip('/')}/api/v1/incidents?{query}"
    since = datetime.fromtimestamp(float(state["started_at"]), tz=UTC).isoformat(timespec="seconds")
    summary = (
        f"{len(members)} incidents of {signature} ({sig.fault_class}) since {since}; past the page "
        f"budget ({budgets.max_pages_per_signature} of one signature, {budgets.max_pages_per_window} in "
        f"all, per {budgets.page_window_seconds:.0f} s) they share this page. First targets: "
        f"{first}{more}. All of them: {link}"
    )
    history = [
        {
            "incident_id": m.id,
            "target": incident_identity(m.target),
            "alertname": m.alertname,
            "state": m.state,
            "opened_at": m.opened_at,
            "reason": m.reason,
        }
        for m in members[:SUMMARY_TARGETS]
    ]
    return Page(
        dedup_key=f"gpupulse-{state['group']}",
        summary=summary,
        severity=sig.page_severity or "critical",
        fault_class=sig.fault_class,
        signature=signature,
        runbook_url=sig.runbook_url or runbook_for(runbook_base_url, sig.fault_class),
        target=members[0].target if members else Target(kind="node"),
        history=history,
        resolved=resolved,
    )


def breaker_page(
    breaker: Mapping[str, Any], group: str, members: Sequence[Incident], runbook_base_url: str
) -> Page:
    """The grouped page of every incident that met the open breaker."""
    history = [
        {
            "incident_id": m.id,
            "signature": m.signature,
            "fault_class": m.fault_class,
            "alertname": m.alertname,
            "target": incident_identity(m.target),
            "opened_at": m.opened_at,
            # a member drained before the breaker opened says what a human must still do
            "reason": m.reason,
        }
        for m in members
    ]
    return Page(
        dedup_key=f"gpupulse-{group}",
        summary=(
            f"Remediation breaker open ({breaker.get('reason', '')}): {len(members)} incidents "
            "need a human; automation stopped until someone resets the breaker"
        ),
        severity="critical",
        fault_class="breaker",
        signature="safety-breaker",
        runbook_url=runbook_for(runbook_base_url, "remediation-breaker"),
        target=Target(kind="node"),
        history=history,
    )
