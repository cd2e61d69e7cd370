"""Outcome transitions: what an effect's result (an action, a page, a PromQL check) does to its incident."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from remediation.diagnosis.types import DIAGNOSIS_FAILED, PROMETHEUS_UNAVAILABLE, Diagnosis
from remediation.drain import BoundaryOutcome, iso
from remediation.effects import Act, Announce, CheckPromQL, Effect, SendGroupPage, SendPage, Validate
from remediation.ladder import first_step
from remediation.safety import BREAKER
from remediation.transitions.timers import TimerTransitions

# a diagnosis that says nothing because it could not read Prometheus, not because nothing lined up
DIAGNOSIS_FAILURE_CODES = (PROMETHEUS_UNAVAILABLE, DIAGNOSIS_FAILED)


class Transitions(TimerTransitions):
    """Every transition of the engine's state machine; the runner reports outcomes through these."""

    def on_diagnosis(self, incident_id: int, trigger: str, diagnosis: Diagnosis) -> list[Effect]:
        """Record a diagnosis with its incident; an incident waiting for it to act goes on."""
        now = self.clock.time()
        inc = self._db.incident(incident_id)
        if inc is None:
            return []
        self._db.add_diagnosis(incident_id, now, trigger, diagnosis)
        when = "refreshed before paging" if trigger == "page" else "on open"
        self._entry(inc, "event", "diagnosed", f"{diagnosis.headline} ({when})")
        top = diagnosis.top
        layer, cause = (top.layer, top.cause) if top is not None else ("none", "none")
        confident = "true" if diagnosis.confident else "false"
        self._later(
            lambda: self.metrics.diagnoses.labels(layer=layer, cause=cause, confident=confident).inc()
        )
        if diagnosis.reason_code in DIAGNOSIS_FAILURE_CODES:  # the signals could not be read at all
            code = diagnosis.reason_code
            self._later(lambda: self.metrics.diagnosis_failures.labels(reason=code).inc())
        waiting = inc.state == "open" and inc.next_at is not None and inc.firing_fps and not inc.held
        if trigger != "open" or not waiting:
            return []
        sig = self._sig(inc)
        due = inc.opened_at + sig.ladder.act_after_seconds
        if now < due:
            self._set(incident_id, next_at=due)  # the signature's own wait still runs
            return []
        rung, attempt = first_step(sig.ladder)
        return self._start(incident_id, rung, attempt, now)

    def on_boundary_wait(self, eff: Act) -> list[Effect]:
        """A job's drain waits for its next step: say until when, in the ledger and the incident."""
        inc = self._db.incident(eff.incident_id)
        if inc is None:
            return []
        until = eff.decided_at + eff.boundary_wait_seconds
        text = f"waiting for checkpoint (the job's next step) until {iso(until)} before the {eff.rung}"
        self._entry(
            inc,
            "event",
            "waiting_for_checkpoint",
            text,
            rung=eff.rung,
            attempt=inc.attempt,
            details={"deadline_at": until, "decided_at": eff.decided_at},
        )
        self._set(eff.incident_id, reason=text)
        return []

    def on_boundary_done(self, eff: Act, outcome: BoundaryOutcome) -> list[Effect]:
        """The wait ended (a step landed, the deadline, or no progress to read): the drain follows."""
        inc = self._db.incident(eff.incident_id)
        if inc is None:
            return []
        details: dict[str, Any] = {"outcome": outcome.kind, "waited_seconds": outcome.at - eff.decided_at}
        if outcome.progress_at is not None:
            details["progress_at"] = outcome.progress_at
        self._entry(
            inc,
            "event",
            "drain_" + outcome.kind,
            outcome.summary,
            rung=eff.rung,
            attempt=inc.attempt,
            details=details,
        )
        self._set(eff.incident_id, reason=outcome.summary)
        waited, kind = details["waited_seconds"], outcome.kind
        self._later(lambda: self.metrics.drain_wait.labels(outcome=kind).observe(waited))
        return []

    def on_preview(self, eff: Announce, summary: str, details: Mapping[str, Any]) -> list[Effect]:
        """Record what a dry-run migrate left as a preview (a DeviceTaintRule with effect None)."""
        inc = self._db.incident(eff.incident_id)
        if inc is not None:
            self._entry(inc, "event", "dry_run_preview", summary, rung=eff.rung, details=details)
        return []

    def on_validated(
        self, eff: Validate, outcome: str, summary: str, details: Mapping[str, Any], delay: float
    ) -> list[Effect]:
        """A validation's verdict: a pass returns the GPU and closes the incident (its page resolves);
        a fail keeps the GPU out and pages again with why; temporary asks again after `delay`."""
        now = self.clock.time()
        inc = self._db.incident(eff.incident_id)
        if inc is None or inc.state != "validating":
            return []  # a verdict that came too late: the incident moved on
        if outcome == "temporary":
            self._entry(inc, "event", "validation_retry", summary, details=details)
            self._set(inc.id, next_at=now + max(delay, 1.0))
            return []
        if outcome == "passed":
            self._entry(inc, "event", "returned", summary, details=details)
            self._set(inc.id, page_sticky=0)  # the repair the page asked for is proven: resolve it
            return self._close(inc.id, "returned", now)
        self._entry(inc, "event", "validation_failed", summary, details=details)
        self._set(
            inc.id,
            state="paged",
            reason=summary,
            next_at=now + self.settings.paged_incident_max_age_seconds,
        )
        return self._request_page(inc.id, now, f"validation failed: {summary}")

    def on_action_done(
        self, eff: Act, outcome: str, summary: str, details: Mapping[str, Any], delay: float
    ) -> list[Effect]:
        now = self.clock.time()
        entry = self._db.entry(eff.entry_id)
        if entry is None or entry.status != "started":
            return []
        if eff.prepared is not None and outcome == "refused":
            return self._resume_refused(eff, summary, now)
        self._db.finish_entry(eff.entry_id, outcome, now, summary, details)
        metric_outcome = "success" if outcome == "success" else "failed"
        self._later(lambda: self.metrics.actions.labels(rung=eff.rung, outcome=metric_outcome).inc())
        inc = self._row(eff.incident_id)
        if inc.state != "acting":
            return []
        if outcome == "success":
            return self._after_success(eff.incident_id, eff.rung, now)
        if outcome in ("temporary", "refused") and inc.temp_retries < self.settings.max_temporary_retries:
            self._set(
                eff.incident_id,
                state="retry_wait",
                temp_retries=inc.temp_retries + 1,
                next_at=now + max(0.0, delay),
            )
            return []
        rung = eff.rung
        if not inc.firing_fps:
            # the alert resolved while the failed action ran: nothing left to fix
            return self._close(eff.incident_id, "self_resolved", now)
        if outcome == "refused":
            # the server never acted: a bigger rung would act on a fault nothing has tried to fix yet
            why = f"could not act: {rung} refused {inc.temp_retries + 1} times, nothing changed: {summary}"
            self._conclude_rung(inc, "failed", why)
            return self._page(eff.incident_id, now, why)
        why = f"{rung} failed: {summary}"
        return self._escalate(eff.incident_id, now, why, frozenset({rung}))

    def _resume_refused(self, eff: Act, summary: str, now: float) -> list[Effect]:
        """A resumed action the server refused (the node still locked by the try it resumes, or
        throttled) is taken only once: it is verified instead, as one not taken again would be."""
        self._db.finish_entry(
            eff.entry_id,
            "interrupted",
            now,
            f"left unconfirmed by the last leader; taken again but refused ({summary}): "
            "not repeated, verifying instead",
            {},
        )
        inc = self._row(eff.incident_id)
        if inc.state != "acting":
            return []
        self._entry(inc, "event", "recovered", f"resuming: verifying the interrupted {eff.rung}")
        return self._after_success(eff.incident_id, eff.rung, now)

    def on_action_prepared(self, eff: Act, details: Mapping[str, Any]) -> list[Effect]:
        """What a resumable action is about to change (its pods' UIDs), stored before it changes it:
        a leader that finds the action unconfirmed takes it again on exactly these, or on nothing."""
        entry = self._db.entry(eff.entry_id)
        if entry is not None and entry.status == "started":
            self._db.note_entry(eff.entry_id, {"prepared": dict(details)})
        return []

    def on_page_done(self, eff: SendPage, error: str) -> list[Effect]:
        now = self.clock.time()
        entry = self._db.entry(eff.entry_id)
        if entry is None or entry.status != "started":
            return []
        inc = self._row(eff.incident_id)
        status = "failed" if error else "success"
        summary = f"{'resolve page' if eff.page.resolved else 'page'} via {self.pager_name}"
        self._db.finish_entry(eff.entry_id, status, now, summary + (f": {error}" if error else ""), {})
        self._later(lambda: self.metrics.actions.labels(rung="page", outcome=status).inc())
        if eff.page.resolved:
            return []
        if error:
            self._set(eff.incident_id, page_next_at=now + self.settings.page_retry_seconds)
            return []
        self._set(eff.incident_id, page_pending=0)
        if inc.state == "paged":
            self._conclude_rung(self._row(eff.incident_id), "success", f"paged via {self.pager_name}")
        return []

    def on_group_page_done(self, eff: SendGroupPage, error: str) -> list[Effect]:
        now = self.clock.time()
        status = "failed" if error else "success"
        self._later(lambda: self.metrics.actions.labels(rung="page", outcome=status).inc())
        for incident_id in eff.member_ids:
            inc = self._row(incident_id)
            self._entry(
                inc,
                "action",
                status,
                f"grouped page {eff.group} via {self.pager_name} {error}".strip(),
                rung="page",
                finished_at=now,
            )
            if error:
                self._set(incident_id, group_sent=0)
            else:
                self._conclude_rung(inc, "success", f"grouped page {eff.group}")
        if error and eff.state_key == BREAKER:
            breaker = self._safety.breaker()
            if breaker.get("open"):
                self._db.set_state(BREAKER, {**breaker, "last_group_page_at": 0.0})
        elif error:  # a summary page: the next tick sends it again
            state = self._db.get_state(eff.state_key)
            if state:
                self._db.set_state(eff.state_key, {**state, "last_page_at": 0.0})
        return []

    def on_promql(self, eff: CheckPromQL, healthy: bool, detail: str) -> list[Effect]:
        now = self.clock.time()
        inc = self._row(eff.incident_id)
        if inc.state != "verifying" or inc.resolved_at is None:
            return []
        self._entry(inc, "event", "promql", f"{eff.query}: {detail}")
        if healthy:
            self._enter_cooldown(eff.incident_id, now)
        return []
