"""Timer transitions: what a tick advances, and how a start resumes after a crash or a gap."""

from __future__ import annotations

import logging
from typing import cast

from remediation.decide import HEARTBEAT, HELD, HELD_DUE, PAGE_INFLIGHT_SECONDS
from remediation.decide.incidents import due_step, held_gives_up
from remediation.effects import Act, CheckPromQL, Effect
from remediation.ladder import first_step
from remediation.metrics import BoardSnapshot
from remediation.model import Rung
from remediation.records import Incident, LedgerEntry
from remediation.transitions.board import read_board
from remediation.transitions.events import EventTransitions
from remediation.verify import render_query

log = logging.getLogger("remediation.engine")


class TimerTransitions(EventTransitions):
    """Recovery at start and the work of each tick."""

    def recover(self) -> None:
        """Actions recorded as started but never finished are verified, never repeated; those the
        backend can take again safely (`resumable`) are taken again, as the same action."""
        now = self.clock.time()
        with self._db.transaction():
            # after a gap longer than the evidence may age, open incidents are held (_hold_after_gap):
            # nothing is taken again then either
            last = self._db.get_state(HEARTBEAT).get("at")
            fresh = last is None or now - float(last) <= self.settings.max_event_age_seconds
            for e in self._db.started_actions():
                inc = self._row(e.incident_id)
                if e.rung == "page":
                    self._db.finish_entry(
                        e.id, "interrupted", now, "controller restarted while paging; re-sent", {}
                    )
                    if inc.state == "paged" and inc.page_group == "":
                        self._set(inc.id, page_pending=1, page_next_at=0.0)
                    continue
                waiting = self._db.waiting_drain(e.id)
                if waiting is not None:
                    # it waited for the job's next step: nothing was drained, so it waits on
                    self._deferred += self._resume_drain(inc, e, waiting, now)
                    continue
                if fresh and self._resume(e, inc, now):
                    continue
                self._db.finish_entry(
                    e.id,
                    "interrupted",
                    now,
                    f"controller restarted before the {e.rung} outcome was recorded; "
                    "not repeated, verifying instead",
                    {},
                )
                if inc.state != "acting":
                    continue
                self._entry(inc, "event", "recovered", f"resuming: verifying the interrupted {e.rung}")
                # as if it succeeded: verified (or a human paged) like any action, never repeated;
                # effects go out with the first tick, when there is an event loop
                self._deferred += self._after_success(inc.id, e.rung, now)
            self._hold_after_gap(now)
            self._deferred += self._lemon_marks()
            self._post = []
        self.metrics.incidents_open.set(self._db.count_open())
        self.metrics.breaker_open.set(1 if self._safety.breaker_open() else 0)
        self.metrics.paused.set(1 if self._safety.paused() else 0)
        self.metrics.paused_since.set(self._safety.paused_since())
        self._publish_board(now)

    def _resume(self, e: LedgerEntry, inc: Incident, now: float) -> bool:
        """Take an unconfirmed action again where the backend can do so safely (a fenced act never
        ran; a UID-preconditioned delete deletes only the pod it recorded): the same ledger entry, so
        loops and budgets count it once. Only while its evidence is fresh, else it is verified."""
        rung = cast(Rung, e.rung)
        if inc.state != "acting" or not self.resumable(rung, inc.target):
            return False
        age = now - e.at
        if age > self.settings.max_event_age_seconds:
            return False
        prepared = self._db.entry_details(e.id).get("prepared") or {}
        what = "on what it recorded" if prepared else "(it recorded no change yet)"
        self._entry(
            inc,
            "event",
            "resumed",
            f"resuming the {rung} left unconfirmed {age:.0f} s ago {what}: taken again, not repeated",
        )
        sig = self._sig(inc)
        reason = f"{inc.alertname} ({sig.fault_class}, signature {sig.name}); attempt {e.attempt}, resumed"
        self._deferred.append(
            Act(e.id, inc.id, rung, inc.target, reason, signature=sig.name, prepared=dict(prepared))
        )
        return True

    def _hold_after_gap(self, now: float) -> None:
        """After the engine did not watch for longer than the evidence may age (a restart after an
        outage, a failover), what it knew about firing alerts may be stale: no open incident acts
        again until a fresh notification confirms its alert."""
        last = self._db.get_state(HEARTBEAT).get("at")
        self._db.set_state(HEARTBEAT, {"at": now})
        if last is None or now - float(last) <= self.settings.max_event_age_seconds:
            return
        gap = now - float(last)
        held = self._db.holdable_incidents()
        for inc in held:
            self._entry(
                inc,
                "event",
                "held",
                f"the controller did not watch for {gap:.0f} s (restart, failover or stall): what it knew "
                "may be stale, so nothing acts until a fresh notification confirms the alert",
            )
            self._set(inc.id, held=HELD)
        if held:
            log.warning(
                "not watched for %.0f s: %d open incidents wait for fresh notifications", gap, len(held)
            )

    def on_tick(self) -> list[Effect]:
        """Advance timers: due incidents, pending and grouped pages, PromQL re-checks, pruning."""
        now = self.clock.time()
        effects, self._deferred = self._deferred, []
        for inc in self._db.due_incidents(now):
            incident_id = inc.id
            sig = self._sig(inc)
            step = due_step(inc)
            if step == "held":
                effects += self._held_due(inc, now)
            elif step == "start":
                self._entry(inc, "event", "persistent", "still firing; starting the ladder")
                rung, attempt = first_step(sig.ladder)
                effects += self._start(incident_id, rung, attempt, now)
            elif step == "escalate":
                window = sig.ladder.verify_window_seconds
                why = f"{inc.rung} not verified within {window:.0f} s"
                effects += self._escalate(incident_id, now, why)
            elif step == "still_firing":
                effects += self._still_firing(inc, now)
            elif step == "validate":
                effects += self._validate(incident_id, now, again=True)
            elif step == "retry":
                self._entry(inc, "event", "retry", f"retrying {inc.rung} after a temporary failure")
                effects += self._start(incident_id, cast(Rung, inc.rung), inc.attempt, now, retry=True)
            elif step:  # self_resolved, automated, unresolved
                effects += self._close(incident_id, step, now)
        for inc in self._db.pending_pages(now):
            self._set(inc.id, page_next_at=now + PAGE_INFLIGHT_SECONDS)
            effects.append(self._page_effect(inc.id, resolved=False))
        effects += self._flush_group(now)
        effects += self._flush_summaries(now)
        effects += self._promql_rechecks(now)
        horizon = max(self.settings.loops.flap_window_seconds, 3600.0)
        self._db.prune(now - horizon, now - self.settings.handled_keys_retention_seconds)
        board = self._read_board(now)
        if board is not None:
            self._later(lambda: self.metrics.board.publish(board))
        return effects

    def _publish_board(self, now: float) -> None:
        board = self._read_board(now)
        if board is not None:
            self.metrics.board.publish(board)

    def _read_board(self, now: float) -> BoardSnapshot | None:
        """The board for /metrics, or None when it cannot be read: the board only shows what the
        engine did, so a failure to read it leaves the last one published and never stops a tick."""
        try:
            return read_board(self._db, self._safety, (sig.name for sig in self.library), now)
        except Exception:
            log.exception("the on-call board could not be read; /metrics keeps the last one")
            return None

    def _still_firing(self, inc: Incident, now: float) -> list[Effect]:
        """The cooldown of an unverifiable rung ended with the alert still firing: it did not hold."""
        cooldown = self._sig(inc).ladder.cooldown_seconds
        why = f"{inc.rung} did not hold: the alert still fires after the {cooldown:.0f} s cooldown"
        # as with a recurrence: after a migrate, only a human is left
        blocked: frozenset[Rung] = frozenset({"migrate"}) if inc.rung == "migrate" else frozenset()
        return self._escalate(inc.id, now, why, blocked)

    def _held_due(self, inc: Incident, now: float) -> list[Effect]:
        """A held incident's next step came due: it waits for a fresh notification, then gives up."""
        incident_id = inc.id
        if held_gives_up(inc):
            why = "no fresh notification confirmed the alert after the controller's gap"
            self._set(incident_id, reason=why)
            return self._close(incident_id, "unresolved", now)
        if inc.state == "cooldown" and not inc.firing_fps:
            self._set(incident_id, held=0)  # closing on a quiet cooldown acts on nothing
            return self._close(incident_id, "automated", now)
        self._entry(
            inc,
            "event",
            "held",
            f"{inc.state} step due, not taken on evidence from before the gap; waiting up to "
            f"{self.settings.paged_incident_max_age_seconds:.0f} s for a fresh notification",
        )
        self._set(incident_id, held=HELD_DUE, next_at=now + self.settings.paged_incident_max_age_seconds)
        return []

    def _promql_rechecks(self, now: float) -> list[Effect]:
        if not self.verifying:
            return []
        out: list[Effect] = []
        for inc in self._db.list_incidents("verifying", 10_000):
            if inc.resolved_at is None:
                continue
            sig = self._sig(inc)
            if not sig.verify_promql:
                self._enter_cooldown(inc.id, now)
                continue
            last = self._promql_last.get(inc.id, 0.0)
            if now - last >= self.settings.promql_recheck_seconds:
                self._promql_last[inc.id] = now
                out.append(CheckPromQL(inc.id, render_query(sig.verify_promql, inc.labels)))
        return out
