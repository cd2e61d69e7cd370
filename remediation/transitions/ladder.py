"""Ladder transitions: start a rung (through loops, pause, breaker and budgets), escalate, verify, close."""

from __future__ import annotations

import logging
from typing import Any

from remediation.decide.incidents import ladder_end_reason
from remediation.diagnosis.policy import veto
from remediation.effects import Act, Announce, CheckPromQL, Effect, Validate
from remediation.ladder import incident_identity, next_step
from remediation.model import Rung
from remediation.safety import NODES_OFF, PAUSE
from remediation.signatures import Signature
from remediation.tracing import AttrValue
from remediation.transitions.paging import PagingTransitions
from remediation.verify import render_query

log = logging.getLogger("remediation.engine")


class LadderTransitions(PagingTransitions):
    """The rungs of an incident's ladder, from the first action to its close."""

    def _start(
        self,
        incident_id: int,
        rung: Rung,
        attempt: int,
        now: float,
        blocked: frozenset[Rung] = frozenset(),
        retry: bool = False,
    ) -> list[Effect]:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        target = inc.target
        if not retry:
            self._set(
                incident_id, rung=rung, attempt=attempt, rung_started_at=now, temp_retries=0, next_at=None
            )
            inc = self._row(incident_id)
        if rung == "page":
            return self._page(incident_id, now, ladder_end_reason(inc, sig))
        if not retry:
            vetoed = self._diagnosis_veto(inc.id, sig)
            if vetoed:
                self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="skipped").inc())
                self._entry(inc, "action", "skipped", vetoed, rung=rung, attempt=attempt, finished_at=now)
                self._conclude_rung(self._row(incident_id), "skipped", vetoed)
                return self._page(incident_id, now, vetoed)
        if rung == "migrate" and not self.settings.scope.nodes:
            # a pod's or a job's migrate cordons its node: the next rung (a page) instead
            self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="skipped").inc())
            self._entry(inc, "action", "skipped", NODES_OFF, rung=rung, attempt=attempt, finished_at=now)
            self._set(incident_id, reason=NODES_OFF)
            self._conclude_rung(self._row(incident_id), "skipped", NODES_OFF)
            off: frozenset[Rung] = frozenset({"migrate"})
            nxt, nxt_attempt = next_step(sig.ladder, rung, attempt, blocked | off)
            return self._start(incident_id, nxt, nxt_attempt, now, blocked | off)
        job = target.kind == "job"
        if rung == "restart" or (job and rung == "migrate"):
            loop = self._loops.restart_loop(inc.loop_key, now, job=job)
            if loop:
                # a job whose restarts do not hold is not restarted by the other rung either
                skip: frozenset[Rung] = frozenset({"restart", "migrate"}) if job else frozenset({"restart"})
                self._record_loop(inc, loop, now)
                self._later(self.metrics.loops.inc)
                self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="skipped").inc())
                self._entry(
                    inc, "action", "skipped", loop.detail, rung=rung, attempt=attempt, finished_at=now
                )
                self._set(incident_id, reason=loop.detail)
                self._conclude_rung(self._row(incident_id), "skipped", loop.detail)
                nxt, nxt_attempt = next_step(sig.ladder, rung, attempt, blocked | skip)
                return self._start(incident_id, nxt, nxt_attempt, now, blocked | skip)
        common: dict[str, Any] = {
            "rung": rung,
            "attempt": attempt,
            "target_kind": target.kind,
            "loop_key": inc.loop_key,
            "node": target.node,
        }
        if self.settings.dry_run:
            self._entry(
                inc, "action", "dry_run", f"dry run: would {rung} {target.key}", finished_at=now, **common
            )
            self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="dry_run").inc())
            self._set(incident_id, state="verifying", next_at=now + sig.ladder.verify_window_seconds)
            return [Announce(incident_id, rung, target, sig.name, f"dry run: would {rung} {target.key}")]
        if self._safety.paused():
            paused_by = self._db.get_state(PAUSE).get("by", "an operator")
            why = f"automation paused by {paused_by}: {rung} not taken"
            self._entry(inc, "action", "blocked", why, finished_at=now, **common)
            self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="blocked").inc())
            return self._page(incident_id, now, why)
        if self._safety.breaker_open():
            self._entry(inc, "action", "blocked", "breaker open: paging instead", finished_at=now, **common)
            self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="blocked").inc())
            return self._join_group(incident_id, now)
        check = self._safety.check(rung, target, now)
        if check.exceeded:
            self._safety.open_breaker(check.exceeded, now)
            self._entry(inc, "event", "breaker_opened", f"budget exceeded: {check.exceeded}")
            self._entry(
                inc, "action", "blocked", f"budget exceeded: {check.exceeded}", finished_at=now, **common
            )
            self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="blocked").inc())
            self._later(lambda: self.metrics.breaker_open.set(1))
            log.error("remediation breaker opened: %s", check.exceeded)
            return self._join_group(incident_id, now)
        reason = f"{inc.alertname} ({sig.fault_class}, signature {sig.name}); attempt {attempt}"
        entry_id = self._entry(inc, "action", "started", f"{rung} {target.key}", **common)
        self._set(incident_id, state="acting", next_at=None, resolved_at=None)
        return [Act(entry_id, incident_id, rung, target, reason, signature=sig.name)]

    def _diagnosis_veto(self, incident_id: int, sig: Signature) -> str:
        """Why the incident's latest confident diagnosis rules out acting ("" when it does not)."""
        latest = self._db.latest_diagnosis(incident_id)
        return veto(sig.diagnosis, sig.ladder.rungs, latest.diagnosis if latest is not None else None)

    def _escalate(
        self, incident_id: int, now: float, why: str, blocked: frozenset[Rung] = frozenset()
    ) -> list[Effect]:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        self._conclude_rung(inc, "failed", why)
        rung, attempt = next_step(sig.ladder, inc.rung, inc.attempt, blocked)
        self._entry(inc, "event", "escalated", f"{why}; next: {rung} (attempt {attempt})")
        self._set(incident_id, reason=why)
        return self._start(incident_id, rung, attempt, now, blocked)

    def _after_success(self, incident_id: int, rung: str, now: float) -> list[Effect]:
        """What a rung's success leads to, per the signature's verification semantics: a page when a
        human must finish after a migrate; else a wait for the alert's resolution where that proves
        the rung worked, or straight to the cooldown (recurrence is the only evidence) where not."""
        inc = self._row(incident_id)
        sig = self._sig(inc)
        ladder = sig.ladder
        if rung == "migrate" and ladder.human_after_migrate:
            self._conclude_rung(inc, "success", "work moved away; a human must finish")
            why = (
                f"the work was moved off {incident_identity(inc.target)}, which still needs a "
                f"human: {ladder.human_after_migrate}"
            )
            self._set(incident_id, rung="page", attempt=1, rung_started_at=now, page_sticky=1)
            return self._page(incident_id, now, why)
        self._set(incident_id, state="verifying", next_at=now + ladder.verify_window_seconds)
        if not ladder.resolution_verifies_rung(rung):
            if sig.verify_promql and self.verifying:
                return self._verified_or_check(incident_id, now)
            self._enter_cooldown(incident_id, now, by_resolution=False)
            return []
        if not inc.firing_fps:
            return self._verified_or_check(incident_id, now)
        return []

    def _verified_or_check(self, incident_id: int, now: float) -> list[Effect]:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        self._set(incident_id, resolved_at=now)
        if sig.verify_promql and self.verifying:
            self._promql_last[incident_id] = now
            return [CheckPromQL(incident_id, render_query(sig.verify_promql, inc.labels))]
        self._enter_cooldown(incident_id, now)
        return []

    def _enter_cooldown(self, incident_id: int, now: float, by_resolution: bool = True) -> None:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        cooldown = sig.ladder.cooldown_seconds
        if by_resolution:
            text = f"resolved after {inc.rung}; watching {cooldown:.0f} s for recurrence"
        else:
            text = (
                f"{inc.rung} done; this alert resolving would prove nothing, so it holds only if the "
                f"alert neither recurs nor still fires within {cooldown:.0f} s"
            )
        self._entry(inc, "event", "verified" if by_resolution else "watching", text)
        self._set(incident_id, state="cooldown", next_at=now + cooldown)

    def _validate(self, incident_id: int, now: float, again: bool = False) -> list[Effect]:
        """Test the quarantined GPU before it serves again; `again`: the same validation, asked anew
        (its Job is found by name), after no verdict came back in time."""
        inc = self._row(incident_id)
        attempt = sum(1 for h in self._db.history(incident_id) if h.get("status") == "validation_started")
        if not again:
            attempt += 1
            self._entry(
                inc, "event", "validation_started", f"validating {inc.target.key} (attempt {attempt})"
            )
        else:
            self._entry(
                inc, "event", "validation_asked_again", f"no verdict yet; asking again (attempt {attempt})"
            )
        wait = self.settings.return_to_service_timeout_seconds + 60.0
        self._set(incident_id, state="validating", next_at=now + wait)
        return [Validate(incident_id, inc.target, inc.fault_class, max(attempt, 1))]

    def _close(self, incident_id: int, resolution: str, now: float, state: str = "closed") -> list[Effect]:
        inc = self._row(incident_id)
        outcome = "success" if resolution == "automated" else resolution
        if inc.rung and inc.rung != "page":
            self._conclude_rung(inc, outcome, resolution)
        self._set(
            incident_id,
            state=state,
            closed_at=now,
            resolution=resolution,
            next_at=None,
            page_pending=0,
        )
        self._entry(inc, "event", "closed", f"closed: {resolution}")
        self._later(lambda: self.metrics.incidents.labels(resolution=resolution).inc())
        attrs: dict[str, AttrValue] = {"gpupulse.resolution": resolution}
        self._later(lambda: self.tracer.close_incident(incident_id, now, attrs))
        self._promql_last.pop(incident_id, None)
        if inc.page_sticky:
            # the page says a human must still reset, reboot or replace: the alert resolving does not
            # mean that happened, so the page stays open until a human closes it in the pager
            self._entry(inc, "event", "page_left_open", "the page stays open: a human must finish the repair")
            return []
        if inc.paged and not inc.page_group and not self.settings.dry_run:
            return [self._page_effect(incident_id, resolved=True)]
        return []
