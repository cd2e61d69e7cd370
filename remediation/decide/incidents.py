"""An incident's identity, the fields it opens with, and what each of its states does when its time comes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from remediation.decide import HELD_DUE
from remediation.ladder import incident_identity, loop_identity
from remediation.model import AlertEvent, Target
from remediation.records import Incident
from remediation.signatures import Signature

DueStep = Literal[
    "",
    "held",
    "start",
    "self_resolved",
    "escalate",
    "still_firing",
    "automated",
    "retry",
    "unresolved",
    "validate",
]
ResolvedStep = Literal["", "self_resolved", "mark_resolved", "verify", "human"]


def incident_key(sig: Signature, target: Target, labels: Mapping[str, str]) -> str:
    """The key that merges notifications into one incident: its signature and target."""
    if sig.origin == "fallback":  # unrelated unknown alerts on one target must not merge
        return f"{sig.name}:{labels.get('alertname', '')}|{incident_identity(target)}"
    return f"{sig.name}|{incident_identity(target)}"


def opening_fields(event: AlertEvent, sig: Signature, target: Target, key: str, now: float) -> dict[str, Any]:
    """The ledger fields of an incident the event opens."""
    labels = dict(event.labels)
    return {
        "key": key,
        "signature": sig.name,
        "fault_class": sig.fault_class,
        "alertname": labels.get("alertname", ""),
        "target": target,
        "loop_key": loop_identity(target),
        "state": "open",
        "firing_fps": [event.fingerprint],
        "opened_at": now,
        "updated_at": now,
        "labels": labels,
        "annotations": dict(event.annotations),
        "evidence_at": event.received_at.timestamp(),
    }


def due_step(inc: Incident) -> DueStep:
    """What an incident whose timer (next_at) came due does now."""
    if inc.held and inc.state != "paged":
        return "held"
    if inc.state == "open":
        return "start" if inc.firing_fps else "self_resolved"
    if inc.state == "verifying":
        return "escalate"  # the rung was not verified within its window
    if inc.state == "cooldown":
        # still firing only where a resolution could not verify the rung
        return "still_firing" if inc.firing_fps else "automated"
    if inc.state == "retry_wait":
        return "retry"
    if inc.state == "paged":
        return "unresolved"
    if inc.state == "validating":
        return "validate"  # no verdict came back in time (a restart, a lost task): ask again
    return ""


def held_gives_up(inc: Incident) -> bool:
    """A held incident whose step came due twice: no fresh notification came, a human takes over."""
    return inc.held == HELD_DUE


def resolved_step(state: str) -> ResolvedStep:
    """What the last firing alert of an incident resolving means in each state."""
    if state in ("open", "retry_wait"):
        return "self_resolved"
    if state == "acting":
        return "mark_resolved"  # the action's outcome decides; the resolution is noted
    if state == "verifying":
        return "verify"
    if state == "paged":
        return "human"
    return ""


def returns_to_service(history: Sequence[Mapping[str, Any]]) -> bool:
    """The incident's latest restart or migrate is a successful migrate that quarantined one device
    (not a node): that is what a validation can lift. Pages after it do not count."""
    for entry in reversed(history):
        if entry.get("kind") != "action" or entry.get("rung") not in ("restart", "migrate"):
            continue
        details = entry.get("details") or {}
        return (
            entry.get("rung") == "migrate"
            and entry.get("status") == "success"
            and (details.get("quarantine") == "device")
        )
    return False


def ladder_end_reason(inc: Incident, sig: Signature) -> str:
    """Why an incident reaching the page rung pages."""
    if inc.reason:
        return inc.reason
    if sig.ladder.rungs == ("page",):
        return f"no automated fix for this fault: {sig.reason}"
    return "the ladder has no automated rung left"
