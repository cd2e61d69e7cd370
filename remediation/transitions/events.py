"""Event transitions: one accepted alert notification opens, renews, re-fires or resolves an incident."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from remediation.decide import HELD_DUE
from remediation.decide.freshness import is_fresh, staleness
from remediation.decide.incidents import incident_key, opening_fields, resolved_step, returns_to_service
from remediation.diagnosis.types import NO_PROMETHEUS, Diagnosis, no_diagnosis
from remediation.effects import Diagnose, Effect
from remediation.ladder import first_step, loop_identity, target_from_labels, target_problem
from remediation.ledger import OPEN_STATES
from remediation.model import AlertEvent, Rung, Target
from remediation.records import Incident
from remediation.safety import in_scope
from remediation.signatures import Signature
from remediation.tracing import AttrValue
from remediation.transitions.ladder import LadderTransitions

log = logging.getLogger("remediation.engine")


class EventTransitions(LadderTransitions):
    """What one alert notification does to the incident it belongs to."""

    def _record_stale(self, event: AlertEvent, reason: str, detail: str, now: float) -> None:
        alertname = event.labels.get("alertname", "")
        self._db.add_stale(now, event.dedup_key, alertname, reason, detail)
        self._db.mark_handled(event.dedup_key, None, now, stale=reason == "too_old")
        self._later(lambda: self.metrics.stale_alerts.labels(reason=reason).inc())
        log.info("not acting on %s (%s): %s: %s", alertname or "alert", event.dedup_key, reason, detail)

    def _renew_evidence(self, incident_id: int | None, event: AlertEvent, now: float) -> list[Effect]:
        """A fresh re-delivery of a firing alert already handled: the incident's evidence is current."""
        inc = self._db.incident(incident_id) if incident_id is not None else None
        if inc is not None and inc.state in OPEN_STATES and event.fingerprint in inc.firing_fps:
            self._renew(inc, event, now)
        return []

    def _renew(self, inc: Incident, event: AlertEvent, now: float) -> None:
        fields: dict[str, Any] = {"evidence_at": event.received_at.timestamp()}
        if inc.held:
            self._entry(inc, "event", "evidence_renewed", "a fresh notification confirms the alert")
            fields["held"] = 0
            if inc.held == HELD_DUE:
                fields["next_at"] = now  # the step that came due while held runs at the next tick
        self._set(inc.id, **fields)

    def on_event(self, event: AlertEvent, node_labels: Mapping[str, str] | None = None) -> list[Effect]:
        db = self._db
        now = self.clock.time()
        max_age = self.settings.max_event_age_seconds
        fresh = is_fresh(event, now, max_age)
        seen = db.handled(event.dedup_key)
        if seen is not None and not (seen.stale and fresh):
            if event.status == "firing" and fresh:
                return self._renew_evidence(seen.incident_id, event, now)
            return []
        reason, detail = staleness(db.alert_state(event.fingerprint), event, now, fresh, max_age)
        if reason and reason != "too_old":
            self._record_stale(event, reason, detail, now)
            return []
        db.set_alert_state(event.fingerprint, event.starts_at.timestamp(), event.status, now)
        if reason:
            self._record_stale(event, reason, detail, now)
            return []
        labels = dict(event.labels)
        annotations = dict(event.annotations)
        sig = self.library.match(labels, annotations)
        target, kind_known = target_from_labels(labels)
        key = incident_key(sig, target, labels)
        db.add_transition(key, event.status, now)
        if target.node:
            db.see_node(target.node, now)
        inc = db.open_incident_for(key)
        effects: list[Effect] = []
        incident_id: int | None = None
        if event.status == "firing":
            if inc is None:
                incident_id, effects = self._open(event, sig, target, kind_known, key, now, node_labels)
            else:
                incident_id = inc.id
                effects = self._firing_again(inc, event, now)
        elif inc is not None:
            incident_id = inc.id
            effects = self._resolved(inc, event, now)
        db.mark_handled(event.dedup_key, incident_id, now)
        return effects

    def _open(
        self,
        event: AlertEvent,
        sig: Signature,
        target: Target,
        kind_known: bool,
        key: str,
        now: float,
        node_labels: Mapping[str, str] | None = None,
    ) -> tuple[int, list[Effect]]:
        labels = dict(event.labels)
        alertname = labels.get("alertname", "")
        incident_id = self._db.insert_incident(opening_fields(event, sig, target, key, now))
        attrs: dict[str, AttrValue] = {
            "gpupulse.incident_id": incident_id,
            "signature": sig.name,
            "gpupulse.fault_class": sig.fault_class,
            "gpupulse.target": target.key,
            "alertname": alertname,
        }
        trace_id, span_id = self.tracer.open_incident(incident_id, now, attrs)
        self._set(incident_id, trace_id=trace_id, span_id=span_id)
        inc = self._row(incident_id)
        self._entry(
            inc,
            "event",
            "opened",
            f"{alertname or 'alert'} matched signature {sig.name} ({sig.fault_class}); "
            f"ladder {' -> '.join(sig.ladder.rungs)}",
            details={"signature": sig.name, "restart_fixes": sig.restart_fixes, "reason": sig.reason},
        )
        if self.settings.diagnosis.enabled and not self.diagnosing:
            self._db.add_diagnosis(incident_id, now, "open", _no_prometheus(now))
        out_of_scope = in_scope(self.settings.scope, target, labels, event.annotations, node_labels)
        if out_of_scope and self.settings.scope.off_scope == "page":
            self._entry(inc, "event", "out_of_scope", f"paged, not acted on: {out_of_scope}")
            return incident_id, self._page(incident_id, now, f"out of scope, not acted on: {out_of_scope}")
        if out_of_scope:
            self._entry(inc, "event", "out_of_scope", f"recorded, not acted on: {out_of_scope}")
            self._set(incident_id, reason=out_of_scope)
            return incident_id, self._close(incident_id, "out_of_scope", now, state="ignored")
        acting = any(r != "page" for r in sig.ladder.rungs)
        problem = target_problem(target, kind_known)
        if acting and problem:
            self._entry(inc, "event", "unidentified", problem)
            return incident_id, self._page(incident_id, now, problem)
        flap = self._loops.flapping(key, now)
        if flap:
            return incident_id, self._loop_page(incident_id, flap, now)
        if acting:
            recurrence = self._loops.recurrence_after_migration(loop_identity(target), now)
            if recurrence:
                return incident_id, self._loop_page(incident_id, recurrence, now)
        effects: list[Effect] = []
        if sig.ladder.page_on_open:
            spent = self._page_budget_spent(inc, now)
            if spent:
                self._entry(inc, "event", "page_skipped", f"informational page not sent: {spent}")
            else:
                effects += self._request_page(
                    incident_id, now, "informational page on open; the ladder continues"
                )
        if acting and self.diagnosing:
            effects.append(Diagnose(incident_id, labels, event.starts_at.timestamp()))
        # wait for the diagnosis where it could change what the signature does
        wait = (
            self.settings.diagnosis.wait_seconds
            if acting
            and self.diagnosing
            and (sig.diagnosis.acts_on or sig.diagnosis.effective_not_when(sig.ladder.rungs))
            else 0.0
        )
        if sig.ladder.act_after_seconds > 0 or wait > 0:
            self._set(incident_id, next_at=now + max(sig.ladder.act_after_seconds, wait))
            if sig.ladder.act_after_seconds > 0:
                self._entry(
                    inc,
                    "event",
                    "waiting",
                    f"acting only if still firing after {sig.ladder.act_after_seconds:.0f} s",
                )
            if wait > 0:
                self._entry(
                    inc,
                    "event",
                    "waiting",
                    f"waiting up to {wait:.0f} s for the diagnosis before acting",
                )
            return incident_id, effects
        rung, attempt = first_step(sig.ladder)
        return incident_id, effects + self._start(incident_id, rung, attempt, now)

    def _firing_again(self, inc: Incident, event: AlertEvent, now: float) -> list[Effect]:
        incident_id = inc.id
        fps = set(inc.firing_fps) | {event.fingerprint}
        self._set(incident_id, firing_fps=fps, evidence_at=event.received_at.timestamp())
        if inc.held:
            self._entry(
                inc, "event", "evidence_renewed", "a fresh notification confirms the alert; continuing"
            )
            self._set(incident_id, held=0, **({"next_at": now} if inc.held == HELD_DUE else {}))
        state = inc.state
        if state != "paged":
            flap = self._loops.flapping(inc.key, now)
            if flap:
                self._conclude_rung(inc, "failed", flap.detail)
                return self._loop_page(incident_id, flap, now)
        if state == "cooldown":
            self._entry(inc, "event", "recurred", f"fault recurred within the cooldown after {inc.rung}")
            blocked: frozenset[Rung] = frozenset({"migrate"}) if inc.rung == "migrate" else frozenset()
            target = inc.target
            if target.kind == "job" and (not target.node or event.labels.get("node", "") != target.node):
                # a job's migrate cordons the suspect node it opened with: only when that node is the
                # suspect again (no suspect, or another one, does not say the node is the cause)
                blocked |= {"migrate"}
            return self._escalate(incident_id, now, f"{inc.rung} did not hold (recurred)", blocked)
        if state in ("verifying", "acting") and inc.resolved_at is not None:
            self._entry(inc, "event", "firing", "alert fired again before verification completed")
            self._set(incident_id, resolved_at=None)
        return []

    def _resolved(self, inc: Incident, event: AlertEvent, now: float) -> list[Effect]:
        incident_id = inc.id
        fps = set(inc.firing_fps) - {event.fingerprint}
        self._set(incident_id, firing_fps=fps)
        if fps:
            return []
        self._entry(inc, "event", "resolved", "alert resolved")
        step = resolved_step(inc.state)
        if (
            step == "human"
            and self.settings.return_to_service
            and returns_to_service(self._db.history(incident_id))
        ):
            # the GPU was taken out by a DeviceTaintRule: it returns only once a validation passes
            return self._validate(incident_id, now)
        if step in ("self_resolved", "human"):
            return self._close(incident_id, step, now)
        if step == "mark_resolved":
            self._set(incident_id, resolved_at=now)
        elif step == "verify":
            return self._verified_or_check(incident_id, now)
        return []


def _no_prometheus(now: float) -> Diagnosis:
    return no_diagnosis(
        NO_PROMETHEUS,
        "no Prometheus is configured (--diagnosis.prometheus-url or --verify.prometheus-url)",
        window_start=now,
        window_end=now,
        computed_at=now,
    )
