"""Kubernetes Events for every action the controller takes and its outcome, and for every use of the
kill switch (pause, resume, breaker reset) on the controller's own Pod.

`kubectl describe pod` (or node, or the training job) and `kubectl get events` then show what
gpupulse did, without access to the controller: an events.k8s.io/v1 Event regarding the target,
with the incident id and the signature as annotations. Events about a Node (GPU and node targets)
live in the `default` namespace, as the kubelet's do. Creating one is best effort (the runner bounds
it with a deadline and logs a failure): the audit trail never holds an action back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from remediation.kube.client import KubeClient
from remediation.kube.jobs import OWNER_KINDS
from remediation.kube.pods import JSON
from remediation.kube.timing import micro_time
from remediation.model import ActionNotice, ActionPhase, Target

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "gpupulse.io/remediation"
INCIDENT_ANNOTATION = "gpupulse.io/incident-id"
SIGNATURE_ANNOTATION = "gpupulse.io/signature"
# the API server's limits (k8s.io/kubernetes pkg/apis/core/validation/events.go)
NOTE_MAX_BYTES = 1024
FIELD_MAX_CHARS = 128
NAME_MAX_CHARS = 253

REASONS: dict[ActionPhase, tuple[str, str]] = {
    "started": ("RemediationStarted", "Normal"),
    "success": ("RemediationSucceeded", "Normal"),
    "failed": ("RemediationFailed", "Warning"),
    "temporary": ("RemediationRetrying", "Warning"),
    "refused": ("RemediationRetrying", "Warning"),
    "dry_run": ("RemediationDryRun", "Normal"),
}


@dataclass(frozen=True)
class Regarding:
    """The object an Event is about, and the namespace the Event lives in."""

    ref: JSON
    event_namespace: str


def regarding(target: Target) -> Regarding:
    """The object `kubectl describe` shows the Event on: the pod, the training job, or the node."""
    if target.kind == "pod" and target.namespace and target.pod:
        ref = {"apiVersion": "v1", "kind": "Pod", "namespace": target.namespace, "name": target.pod}
        return Regarding(ref, target.namespace)
    if target.kind == "job" and target.namespace and target.training_job:
        owner = OWNER_KINDS.get(target.training_job_kind)
        if owner is not None:
            kind = target.training_job_kind.split(".", 1)[0]
            ref = {
                "apiVersion": f"{owner.group}/{owner.version}",
                "kind": kind,
                "namespace": target.namespace,
                "name": target.training_job,
            }
            return Regarding(ref, target.namespace)
    return Regarding({"apiVersion": "v1", "kind": "Node", "name": target.node}, "default")


def _clip_bytes(text: str, limit: int) -> str:
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode(errors="ignore") + "..."


def event_body(notice: ActionNotice, reporting_instance: str, now: datetime, unique: int) -> JSON:
    """The events.k8s.io/v1 Event for one notice."""
    about = regarding(notice.target)
    reason, kind = REASONS[notice.phase]
    verb = {
        "started": "started",
        "success": "done",
        "failed": "failed",
        "temporary": "will be retried",
        "refused": "refused by the server, nothing changed; will be retried",
        "dry_run": "not taken (dry run)",
    }
    note = (
        f"gpupulse {notice.rung} {verb[notice.phase]} (incident {notice.incident_id}, signature "
        f"{notice.signature or 'unknown'}): {notice.summary}"
    )
    suffix = f".{unique:x}"
    base = str(about.ref["name"] or "gpupulse")[: NAME_MAX_CHARS - len(suffix)]
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": base + suffix,
            "namespace": about.event_namespace,
            "annotations": {
                INCIDENT_ANNOTATION: str(notice.incident_id),
                SIGNATURE_ANNOTATION: notice.signature,
            },
        },
        "eventTime": micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": reporting_instance[:FIELD_MAX_CHARS] or "gpupulse-remediation",
        "action": notice.rung.capitalize(),
        "reason": reason,
        "type": kind,
        "note": _clip_bytes(note, NOTE_MAX_BYTES),
        "regarding": about.ref,
    }
    if notice.target.kind == "pod" and notice.target.node:
        body["related"] = {"apiVersion": "v1", "kind": "Node", "name": notice.target.node}
    return body


class KubeEventAudit:
    """ActionAudit that writes each notice as an Event regarding the target."""

    def __init__(self, client: KubeClient, reporting_instance: str) -> None:
        self._client = client
        self._instance = reporting_instance

    async def announce(self, notice: ActionNotice) -> None:
        body = event_body(notice, self._instance, datetime.now(UTC), time.time_ns())
        await self._client.create_event(str(body["metadata"]["namespace"]), body)


# a human's kill switch, as an Event on the controller's own Pod (remediation/kube/serve.py)
SWITCH_REASONS = {"pause": "Paused", "resume": "Resumed", "breaker_reset": "BreakerReset"}
_SWITCH_WORDS = {"pause": "paused", "resume": "resumed", "breaker_reset": "breaker reset"}
_UNCHANGED = {
    "pause": "it already was paused",
    "resume": "it was not paused",
    "breaker_reset": "the breaker was not open",
}


def switch_event_body(
    action: str,
    by: str,
    changed: bool,
    pod: str,
    namespace: str,
    reporting_instance: str,
    now: datetime,
    unique: int,
) -> JSON:
    """The events.k8s.io/v1 Event for pause, resume or breaker reset, regarding the controller's Pod:
    who (and why: `by` carries the reason, "alice (rack 4)"), and whether it changed anything."""
    note = f"gpupulse {_SWITCH_WORDS[action]} by {by or 'unknown'}"
    if not changed:
        note += f": nothing changed ({_UNCHANGED[action]})"
    suffix = f".{unique:x}"
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": (pod or "gpupulse")[: NAME_MAX_CHARS - len(suffix)] + suffix,
            "namespace": namespace,
        },
        "eventTime": micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": reporting_instance[:FIELD_MAX_CHARS] or "gpupulse-remediation",
        "action": SWITCH_REASONS[action],
        "reason": SWITCH_REASONS[action],
        # a pause turns the automation off: a Warning, as `kubectl get events --field-selector type=Warning`
        # is where an on-call looks
        "type": "Warning" if action == "pause" and changed else "Normal",
        "note": _clip_bytes(note, NOTE_MAX_BYTES),
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod},
    }


class KubeSwitchAudit:
    """Writes each kill-switch use as an Event on the controller's own Pod, best effort."""

    def __init__(self, client: KubeClient, pod: str, namespace: str, deadline_seconds: float = 5.0) -> None:
        self._client = client
        self._pod = pod
        self._namespace = namespace
        self._deadline = deadline_seconds

    async def announce(self, action: str, by: str, changed: bool) -> None:
        """Create the Event; a failure or a hang is logged, never raised (the switch has taken effect)."""
        body = switch_event_body(
            action, by, changed, self._pod, self._namespace, self._pod, datetime.now(UTC), time.time_ns()
        )
        try:
            await asyncio.wait_for(self._client.create_event(self._namespace, body), self._deadline)
        except Exception as exc:  # the audit trail never undoes or fails a switch
            log.warning("could not record %s by %s as an Event: %s", action, by, exc)
