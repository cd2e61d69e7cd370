"""The decision engine: alert in, ladder step out (restart -> verify -> migrate -> verify -> page).

Every decision runs as one SQLite transaction on a dedicated thread (so fsyncs never block the event
loop): read state, decide, record intent, mark the event's dedup key handled. Only after the commit
are the effects carried out (backend calls, pages, PromQL checks) as asyncio tasks; their outcomes
are recorded by another transaction. A crash between intent and outcome therefore leaves an action
`started` in the ledger; on start such an action is marked `interrupted` and its incident is
verified, never acted on again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlencode

from opentelemetry.sdk.trace import TracerProvider

from gpupulse.clock import Clock, SystemClock
from remediation.backends import LogPager, NoBackend
from remediation.engine_config import EngineSettings
from remediation.ladder import (
    first_step,
    incident_identity,
    loop_identity,
    next_step,
    target_from_labels,
    target_problem,
)
from remediation.ledger import OPEN_STATES, Ledger, connect
from remediation.loops import LoopDetector, LoopVerdict
from remediation.metrics import RemediationMetrics
from remediation.model import (
    ActionBackend,
    AlertEvent,
    Engine,
    NodeLabels,
    Page,
    Pager,
    PermanentError,
    Rung,
    Target,
    TemporaryError,
)
from remediation.safety import BREAKER, PAUSE, SafetyGate, in_scope
from remediation.signatures import Signature, SignatureLibrary, load_library, unknown_signature
from remediation.tracing import AttrValue, IncidentTracer, make_provider
from remediation.verify import PromQLVerifier, VerifyError, render_query

log = logging.getLogger(__name__)

T = TypeVar("T")

# how long a page send may take before the tick considers it lost and sends it again
_PAGE_INFLIGHT_SECONDS = 120.0
# rem_state row of the last tick: a start long after it means the engine did not watch meanwhile
HEARTBEAT = "heartbeat"
# rem_state rows of summary pages (one per signature and storm) are named SUMMARY + group
SUMMARY = "summary:"
_SUMMARY_TARGETS = 10
# held: 1 = waiting for a fresh notification after a gap, 2 = and its next step came due meanwhile
_HELD, _HELD_DUE = 1, 2


@dataclass(frozen=True)
class _Act:
    entry_id: int
    incident_id: int
    rung: Rung
    target: Target
    reason: str


@dataclass(frozen=True)
class _SendPage:
    incident_id: int
    entry_id: int
    page: Page


@dataclass(frozen=True)
class _SendGroupPage:
    group: str
    page: Page
    member_ids: tuple[int, ...]
    # the rem_state row that schedules this group's pages (the breaker's, or a summary's)
    state_key: str = "breaker"


@dataclass(frozen=True)
class _CheckPromQL:
    incident_id: int
    query: str


_Effect = _Act | _SendPage | _SendGroupPage | _CheckPromQL


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class RemediationEngine:
    """Implements remediation.model.Engine over the shared SQLite database."""

    def __init__(
        self,
        settings: EngineSettings,
        db_path: Path,
        metrics: RemediationMetrics,
        library: SignatureLibrary,
        clock: Clock,
        backend: ActionBackend,
        pager: Pager,
        tracer: IncidentTracer,
        verifier: PromQLVerifier | None,
        node_labels: NodeLabels | None = None,
    ) -> None:
        self.settings = settings
        self.node_labels = node_labels
        self.metrics = metrics
        self.library = library
        self.clock = clock
        self.backend = backend
        self.pager = pager
        self.tracer = tracer
        self.verifier = verifier
        self._db = Ledger(connect(db_path, verify=True))  # decisions, on the executor thread only
        self._ro = Ledger(connect(db_path))  # sync API reads and the rare operator writes
        self._loops = LoopDetector(self._db, settings.loops)
        self._safety = SafetyGate(self._db, settings.budgets, settings.cluster_node_count)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpupulse-engine")
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._post: list[Callable[[], None]] = []
        self._promql_last: dict[int, float] = {}
        # one lock per page dedup key: a resolve never overtakes the trigger it resolves
        self._page_locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self._deferred: list[_Effect] = []
        self._recover()

    # ------------------------------------------------------------------ Engine protocol: async

    async def handle(self, event: AlertEvent) -> None:
        """Process one accepted alert; idempotent on event.dedup_key."""
        node_labels = await self._labels_of_node(event)
        await self._decide(lambda: self._on_event(event, node_labels))

    async def _labels_of_node(self, event: AlertEvent) -> Mapping[str, str] | None:
        """The Node labels the scope's node selector needs for this alert (read before the decision,
        which runs on a thread and must not wait on the network); a failure fails handle(), and the
        worker retries the alert."""
        if not self.settings.scope.node_selector or event.status != "firing" or self.node_labels is None:
            return None
        target, _ = target_from_labels(event.labels)
        if target.kind not in ("gpu", "node") or not target.node:
            return None
        return await self.node_labels.labels(target.node)

    async def tick(self) -> None:
        """Advance timers: verification windows, cooldowns, retries, pending and grouped pages."""
        await self._decide(self._on_tick)

    async def wait_idle(self) -> None:
        """Wait until every action, page and check started so far (and their follow-ups) finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self, grace_seconds: float = 5.0) -> None:
        """Stop: let in-flight work finish for up to grace_seconds, then cancel it.

        A cancelled action stays `started` in the ledger and is verified, not repeated, on the next start.
        """
        if self._tasks and grace_seconds > 0:
            await asyncio.wait(list(self._tasks), timeout=grace_seconds)
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._executor.shutdown(wait=True)
        self._db.conn.close()
        self._ro.conn.close()
        await asyncio.to_thread(self.tracer.shutdown)

    # ------------------------------------------------------------------ Engine protocol: sync

    def list_incidents(
        self, state: str | None = None, limit: int = 100, signature: str | None = None
    ) -> Sequence[Mapping[str, Any]]:
        """Incidents, newest first; state filters one state ("active": all open ones), signature one
        signature (the link a summary page carries)."""
        rows = self._ro.list_incidents(state, max(1, min(limit, 10_000)), signature)
        return [self._incident_dict(r) for r in rows]

    def get_incident(self, incident_id: int) -> Mapping[str, Any] | None:
        """One incident with its full ledger history."""
        row = self._ro.incident(incident_id)
        if row is None:
            return None
        out = self._incident_dict(row)
        out["history"] = self._ro.history(incident_id)
        return out

    def list_signatures(self) -> Sequence[Mapping[str, Any]]:
        """The loaded signature library."""
        return [{**s.to_dict(), "origin": s.origin, "path": s.path} for s in self.library]

    def stats(self) -> Mapping[str, Any]:
        """Incident counts by resolution and the share handled without a human."""
        counts = self._ro.resolution_counts()
        automated = counts.get("automated", 0)
        human = counts.get("human", 0)
        unresolved = counts.get("unresolved", 0)
        acted = automated + human + unresolved
        breaker = self._ro.get_state(BREAKER)
        return {
            "incidents_open": self._ro.count_open(),
            "incidents_closed": counts,
            # of the incidents that needed someone to act, the share the ladder fixed on its own
            "automated_ratio": (automated / acted) if acted else None,
            "by_signature": self._ro.resolution_by_signature(),
            "loops_detected": len(self._ro.loops(limit=1_000_000)),
            # alerts recorded and never acted on (out_of_order, expired, too_old)
            "stale_alerts": self._ro.stale_counts(),
            "breaker": breaker or {"open": False},
            "paused": self._ro.get_state(PAUSE) or {"paused": False},
            "dry_run": self.settings.dry_run,
            "signatures": len(self.library),
        }

    def pause(self, by: str) -> None:
        """Stop taking actions (new actions are blocked and their incidents page) until resume()."""
        with self._ro.transaction():
            self._ro.set_state(PAUSE, {"paused": True, "by": by, "at": self.clock.time()})
        self.metrics.paused.set(1)
        log.warning("remediation paused by %s", by)

    def resume(self, by: str) -> None:
        """Allow actions again."""
        with self._ro.transaction():
            self._ro.set_state(PAUSE, {"paused": False, "by": by, "at": self.clock.time()})
        self.metrics.paused.set(0)
        log.warning("remediation resumed by %s", by)

    def reset_breaker(self, by: str) -> None:
        """A human closes the breaker; incidents already paged stay with humans."""
        with self._ro.transaction():
            SafetyGate(self._ro, self.settings.budgets, self.settings.cluster_node_count).close_breaker(
                by, self.clock.time()
            )
        self.metrics.breaker_open.set(0)
        log.warning("remediation breaker reset by %s", by)

    # ------------------------------------------------------------------ plumbing

    async def _decide(self, fn: Callable[[], list[_Effect]]) -> None:
        if self._closed:
            raise RuntimeError("engine is closed")
        async with self._lock:
            loop = asyncio.get_running_loop()
            effects = await loop.run_in_executor(self._executor, self._transact, fn)
        self._dispatch(effects)

    def _transact(self, fn: Callable[[], list[_Effect]]) -> list[_Effect]:
        self._post = []
        with self._db.transaction():
            effects = fn()
        post, self._post = self._post, []
        for callback in post:  # metrics and spans only after the decision is durable
            callback()
        self.metrics.incidents_open.set(self._db.count_open())
        return effects

    def _dispatch(self, effects: Sequence[_Effect]) -> None:
        for eff in effects:
            coro: Awaitable[None]
            if isinstance(eff, _Act):
                coro = self._run_action(eff)
            elif isinstance(eff, _SendPage):
                coro = self._run_page(eff)
            elif isinstance(eff, _SendGroupPage):
                coro = self._run_group_page(eff)
            else:
                coro = self._run_promql(eff)
            task = asyncio.ensure_future(coro)
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the ledger still says `started`/`page_pending`: the next start or tick picks it up
            log.error("engine effect failed", exc_info=task.exception())

    def _later(self, fn: Callable[[], None]) -> None:
        self._post.append(fn)

    def _sig(self, row: sqlite3.Row) -> Signature:
        sig = self.library.get(row["signature"])
        return sig if sig is not None else unknown_signature(row["fault_class"])

    @staticmethod
    def _target(row: sqlite3.Row) -> Target:
        return Target(
            kind=row["target_kind"],
            node=row["target_node"],
            namespace=row["target_namespace"],
            pod=row["target_pod"],
            uuid=row["target_uuid"],
        )

    def _incident_dict(self, row: sqlite3.Row) -> dict[str, Any]:
        out = {k: row[k] for k in row.keys()}
        out["labels"] = json.loads(row["labels"])
        out["annotations"] = json.loads(row["annotations"])
        out["firing_fps"] = json.loads(row["firing_fps"])
        out["target"] = {
            "kind": row["target_kind"],
            "node": row["target_node"],
            "namespace": row["target_namespace"],
            "pod": row["target_pod"],
            "uuid": row["target_uuid"],
        }
        return out

    def _entry(self, inc: sqlite3.Row, kind: str, status: str, summary: str, **kw: Any) -> int:
        return self._db.add_entry(int(inc["id"]), self.clock.time(), kind, status, summary, **kw)

    def _set(self, incident_id: int, **fields: Any) -> None:
        self._db.update_incident(incident_id, updated_at=self.clock.time(), **fields)

    def _row(self, incident_id: int) -> sqlite3.Row:
        row = self._db.incident(incident_id)
        assert row is not None, incident_id
        return row

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        """Actions recorded as started but never finished are verified, never repeated."""
        now = self.clock.time()
        with self._db.transaction():
            for e in self._db.started_actions():
                inc = self._row(int(e["incident_id"]))
                if e["rung"] == "page":
                    self._db.finish_entry(
                        int(e["id"]), "interrupted", now, "controller restarted while paging; re-sent", {}
                    )
                    if inc["state"] == "paged" and inc["page_group"] == "":
                        self._set(int(inc["id"]), page_pending=1, page_next_at=0.0)
                    continue
                self._db.finish_entry(
                    int(e["id"]),
                    "interrupted",
                    now,
                    f"controller restarted before the {e['rung']} outcome was recorded; "
                    "not repeated, verifying instead",
                    {},
                )
                if inc["state"] != "acting":
                    continue
                self._entry(inc, "event", "recovered", f"resuming: verifying the interrupted {e['rung']}")
                # as if it succeeded: verified (or a human paged) like any action, never repeated;
                # effects go out with the first tick, when there is an event loop
                self._deferred += self._after_success(int(inc["id"]), str(e["rung"]), now)
            self._hold_after_gap(now)
            self._post = []
        self.metrics.incidents_open.set(self._db.count_open())
        self.metrics.breaker_open.set(1 if self._safety.breaker_open() else 0)
        self.metrics.paused.set(1 if self._safety.paused() else 0)

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
            self._set(int(inc["id"]), held=_HELD)
        if held:
            log.warning(
                "not watched for %.0f s: %d open incidents wait for fresh notifications", gap, len(held)
            )

    # ------------------------------------------------------------------ events

    def _staleness(self, event: AlertEvent, now: float, fresh: bool) -> tuple[str, str]:
        """(reason, detail) when the event must not act, ("", "") when it is fresh evidence."""
        state = self._db.alert_state(event.fingerprint)
        starts = event.starts_at.timestamp()
        if state is not None:
            if float(state["starts"]) > starts:
                return "out_of_order", (
                    f"an older episode (startsAt {event.starts_at.isoformat()}) of an alert whose latest "
                    f"{state['status']} notification started later"
                )
            if (
                float(state["starts"]) == starts
                and state["status"] == "resolved"
                and event.status == "firing"
            ):
                return "out_of_order", "the firing notification arrived after its own resolution"
        if event.status != "firing":
            return "", ""  # a resolution never acts; however old, it is still true
        if event.ends_at is not None and event.ends_at.timestamp() <= now:
            return "expired", (
                f"endsAt {event.ends_at.isoformat()} has passed: Alertmanager counts the alert resolved"
            )
        if not fresh:
            age = now - event.received_at.timestamp()
            limit = self.settings.max_event_age_seconds
            return "too_old", f"received {age:.0f} s before it was processed (limit {limit:.0f} s)"
        return "", ""

    def _record_stale(self, event: AlertEvent, reason: str, detail: str, now: float) -> None:
        alertname = event.labels.get("alertname", "")
        self._db.add_stale(now, event.dedup_key, alertname, reason, detail)
        self._db.mark_handled(event.dedup_key, None, now, stale=reason == "too_old")
        self._later(lambda: self.metrics.stale_alerts.labels(reason=reason).inc())
        log.info("not acting on %s (%s): %s: %s", alertname or "alert", event.dedup_key, reason, detail)

    def _renew_evidence(self, incident_id: int | None, event: AlertEvent, now: float) -> list[_Effect]:
        """A fresh re-delivery of a firing alert already handled: the incident's evidence is current."""
        inc = self._db.incident(incident_id) if incident_id is not None else None
        if (
            inc is not None
            and inc["state"] in OPEN_STATES
            and event.fingerprint in json.loads(inc["firing_fps"])
        ):
            self._renew(inc, event, now)
        return []

    def _renew(self, inc: sqlite3.Row, event: AlertEvent, now: float) -> None:
        fields: dict[str, Any] = {"evidence_at": event.received_at.timestamp()}
        if inc["held"]:
            self._entry(inc, "event", "evidence_renewed", "a fresh notification confirms the alert")
            fields["held"] = 0
            if inc["held"] == _HELD_DUE:
                fields["next_at"] = now  # the step that came due while held runs at the next tick
        self._set(int(inc["id"]), **fields)

    def _on_event(self, event: AlertEvent, node_labels: Mapping[str, str] | None = None) -> list[_Effect]:
        db = self._db
        now = self.clock.time()
        fresh = now - event.received_at.timestamp() <= self.settings.max_event_age_seconds
        seen = db.handled(event.dedup_key)
        if seen is not None and not (seen["stale"] and fresh):
            if event.status == "firing" and fresh:
                return self._renew_evidence(seen["incident_id"], event, now)
            return []
        reason, detail = self._staleness(event, now, fresh)
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
        key = f"{sig.name}|{incident_identity(target)}"
        if sig.origin == "fallback":  # unrelated unknown alerts on one target must not merge
            key = f"{sig.name}:{labels.get('alertname', '')}|{incident_identity(target)}"
        db.add_transition(key, event.status, now)
        if target.node:
            db.see_node(target.node, now)
        inc = db.open_incident_for(key)
        effects: list[_Effect] = []
        incident_id: int | None = None
        if event.status == "firing":
            if inc is None:
                incident_id, effects = self._open(event, sig, target, kind_known, key, now, node_labels)
            else:
                incident_id = int(inc["id"])
                effects = self._firing_again(inc, event, now)
        elif inc is not None:
            incident_id = int(inc["id"])
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
    ) -> tuple[int, list[_Effect]]:
        labels = dict(event.labels)
        alertname = labels.get("alertname", "")
        incident_id = self._db.insert_incident(
            {
                "key": key,
                "signature": sig.name,
                "fault_class": sig.fault_class,
                "alertname": alertname,
                "target_kind": target.kind,
                "target_node": target.node,
                "target_namespace": target.namespace,
                "target_pod": target.pod,
                "target_uuid": target.uuid,
                "loop_key": loop_identity(target),
                "state": "open",
                "firing_fps": _json([event.fingerprint]),
                "opened_at": now,
                "updated_at": now,
                "labels": _json(labels),
                "annotations": _json(dict(event.annotations)),
                "evidence_at": event.received_at.timestamp(),
            }
        )
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
        effects: list[_Effect] = []
        if sig.ladder.page_on_open:
            spent = self._page_budget_spent(now)
            if spent:
                self._entry(inc, "event", "page_skipped", f"informational page not sent: {spent}")
            else:
                effects += self._request_page(
                    incident_id, now, "informational page on open; the ladder continues"
                )
        if sig.ladder.act_after_seconds > 0:
            self._set(incident_id, next_at=now + sig.ladder.act_after_seconds)
            self._entry(
                inc,
                "event",
                "waiting",
                f"acting only if still firing after {sig.ladder.act_after_seconds:.0f} s",
            )
            return incident_id, effects
        rung, attempt = first_step(sig.ladder)
        return incident_id, effects + self._start(incident_id, rung, attempt, now)

    def _firing_again(self, inc: sqlite3.Row, event: AlertEvent, now: float) -> list[_Effect]:
        incident_id = int(inc["id"])
        fps = set(json.loads(inc["firing_fps"])) | {event.fingerprint}
        self._set(incident_id, firing_fps=_json(sorted(fps)), evidence_at=event.received_at.timestamp())
        if inc["held"]:
            self._entry(
                inc, "event", "evidence_renewed", "a fresh notification confirms the alert; continuing"
            )
            self._set(incident_id, held=0, **({"next_at": now} if inc["held"] == _HELD_DUE else {}))
        state = inc["state"]
        if state != "paged":
            flap = self._loops.flapping(inc["key"], now)
            if flap:
                self._conclude_rung(inc, "failed", flap.detail)
                return self._loop_page(incident_id, flap, now)
        if state == "cooldown":
            self._entry(inc, "event", "recurred", f"fault recurred within the cooldown after {inc['rung']}")
            blocked: frozenset[Rung] = frozenset({"migrate"}) if inc["rung"] == "migrate" else frozenset()
            return self._escalate(incident_id, now, f"{inc['rung']} did not hold (recurred)", blocked)
        if state in ("verifying", "acting") and inc["resolved_at"] is not None:
            self._entry(inc, "event", "firing", "alert fired again before verification completed")
            self._set(incident_id, resolved_at=None)
        return []

    def _resolved(self, inc: sqlite3.Row, event: AlertEvent, now: float) -> list[_Effect]:
        incident_id = int(inc["id"])
        fps = set(json.loads(inc["firing_fps"])) - {event.fingerprint}
        self._set(incident_id, firing_fps=_json(sorted(fps)))
        if fps:
            return []
        state = inc["state"]
        self._entry(inc, "event", "resolved", "alert resolved")
        if state in ("open", "retry_wait"):
            return self._close(incident_id, "self_resolved", now)
        if state == "acting":
            self._set(incident_id, resolved_at=now)
            return []
        if state == "verifying":
            return self._verified_or_check(incident_id, now)
        if state == "paged":
            return self._close(incident_id, "human", now)
        return []

    # ------------------------------------------------------------------ the ladder

    def _start(
        self,
        incident_id: int,
        rung: Rung,
        attempt: int,
        now: float,
        blocked: frozenset[Rung] = frozenset(),
        retry: bool = False,
    ) -> list[_Effect]:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        target = self._target(inc)
        if not retry:
            self._set(
                incident_id, rung=rung, attempt=attempt, rung_started_at=now, temp_retries=0, next_at=None
            )
            inc = self._row(incident_id)
        if rung == "page":
            if inc["reason"]:
                why = inc["reason"]
            elif sig.ladder.rungs == ("page",):
                why = f"no automated fix for this fault: {sig.reason}"
            else:
                why = "the ladder has no automated rung left"
            return self._page(incident_id, now, why)
        if rung == "restart":
            loop = self._loops.restart_loop(inc["loop_key"], now)
            if loop:
                self._record_loop(inc, loop, now)
                self._later(self.metrics.loops.inc)
                self._later(lambda: self.metrics.actions.labels(rung="restart", outcome="skipped").inc())
                self._entry(
                    inc, "action", "skipped", loop.detail, rung="restart", attempt=attempt, finished_at=now
                )
                self._set(incident_id, reason=loop.detail)
                self._conclude_rung(self._row(incident_id), "skipped", loop.detail)
                nxt, nxt_attempt = next_step(sig.ladder, "restart", attempt, blocked | {"restart"})
                return self._start(incident_id, nxt, nxt_attempt, now, blocked | {"restart"})
        common: dict[str, Any] = {
            "rung": rung,
            "attempt": attempt,
            "target_kind": target.kind,
            "loop_key": inc["loop_key"],
            "node": target.node,
        }
        if self.settings.dry_run:
            self._entry(
                inc, "action", "dry_run", f"dry run: would {rung} {target.key}", finished_at=now, **common
            )
            self._later(lambda: self.metrics.actions.labels(rung=rung, outcome="dry_run").inc())
            self._set(incident_id, state="verifying", next_at=now + sig.ladder.verify_window_seconds)
            return []
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
        reason = f"{inc['alertname']} ({sig.fault_class}, signature {sig.name}); attempt {attempt}"
        entry_id = self._entry(inc, "action", "started", f"{rung} {target.key}", **common)
        self._set(incident_id, state="acting", next_at=None, resolved_at=None)
        return [_Act(entry_id, incident_id, rung, target, reason)]

    def _escalate(
        self, incident_id: int, now: float, why: str, blocked: frozenset[Rung] = frozenset()
    ) -> list[_Effect]:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        self._conclude_rung(inc, "failed", why)
        rung, attempt = next_step(sig.ladder, inc["rung"], int(inc["attempt"]), blocked)
        self._entry(inc, "event", "escalated", f"{why}; next: {rung} (attempt {attempt})")
        self._set(incident_id, reason=why)
        return self._start(incident_id, rung, attempt, now, blocked)

    def _after_success(self, incident_id: int, rung: str, now: float) -> list[_Effect]:
        """What a rung's success leads to, per the signature's verification semantics: a page when a
        human must finish after a migrate; else a wait for the alert's resolution where that proves
        the rung worked, or straight to the cooldown (recurrence is the only evidence) where not."""
        inc = self._row(incident_id)
        sig = self._sig(inc)
        ladder = sig.ladder
        if rung == "migrate" and ladder.human_after_migrate:
            self._conclude_rung(inc, "success", "work moved away; a human must finish")
            why = (
                f"the work was moved off {incident_identity(self._target(inc))}, which still needs a "
                f"human: {ladder.human_after_migrate}"
            )
            self._set(incident_id, rung="page", attempt=1, rung_started_at=now, page_sticky=1)
            return self._page(incident_id, now, why)
        self._set(incident_id, state="verifying", next_at=now + ladder.verify_window_seconds)
        if not ladder.resolution_verifies_rung(rung):
            if sig.verify_promql and self.verifier is not None:
                return self._verified_or_check(incident_id, now)
            self._enter_cooldown(incident_id, now, by_resolution=False)
            return []
        if not json.loads(inc["firing_fps"]):
            return self._verified_or_check(incident_id, now)
        return []

    def _verified_or_check(self, incident_id: int, now: float) -> list[_Effect]:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        self._set(incident_id, resolved_at=now)
        if sig.verify_promql and self.verifier is not None:
            self._promql_last[incident_id] = now
            return [_CheckPromQL(incident_id, render_query(sig.verify_promql, json.loads(inc["labels"])))]
        self._enter_cooldown(incident_id, now)
        return []

    def _enter_cooldown(self, incident_id: int, now: float, by_resolution: bool = True) -> None:
        inc = self._row(incident_id)
        sig = self._sig(inc)
        cooldown = sig.ladder.cooldown_seconds
        if by_resolution:
            text = f"resolved after {inc['rung']}; watching {cooldown:.0f} s for recurrence"
        else:
            text = (
                f"{inc['rung']} done; this alert resolving would prove nothing, so it holds only if the "
                f"alert neither recurs nor still fires within {cooldown:.0f} s"
            )
        self._entry(inc, "event", "verified" if by_resolution else "watching", text)
        self._set(incident_id, state="cooldown", next_at=now + cooldown)

    def _page_budget_spent(self, now: float) -> str:
        """Why no further incident may page on its own now ("" while the page budget lasts)."""
        if self.settings.dry_run:
            return ""
        b = self.settings.budgets
        paged = self._db.paged_incidents_since(now - b.page_window_seconds)
        if paged < b.max_pages_per_window:
            return ""
        return (
            f"page budget spent: {paged} incidents paged within {b.page_window_seconds:.0f} s "
            f"(limit {b.max_pages_per_window})"
        )

    def _page(self, incident_id: int, now: float, reason: str) -> list[_Effect]:
        inc = self._row(incident_id)
        if self._safety.breaker_open():
            return self._join_group(incident_id, now, reason)
        spent = self._page_budget_spent(now)
        if spent:
            return self._join_summary(incident_id, now, reason, spent)
        self._set(
            incident_id,
            state="paged",
            rung="page",
            rung_started_at=inc["rung_started_at"] if inc["rung"] == "page" else now,
            reason=reason,
            paged=1,
            next_at=now + self.settings.paged_incident_max_age_seconds,
        )
        if self.settings.dry_run:
            self._entry(
                inc, "action", "dry_run", f"dry run: would page ({reason})", rung="page", finished_at=now
            )
            self._later(lambda: self.metrics.actions.labels(rung="page", outcome="dry_run").inc())
            self._conclude_rung(self._row(incident_id), "dry_run", reason)
            return []
        return self._request_page(incident_id, now, reason)

    def _request_page(self, incident_id: int, now: float, reason: str) -> list[_Effect]:
        inc = self._row(incident_id)
        if self.settings.dry_run:
            self._entry(
                inc, "action", "dry_run", f"dry run: would page ({reason})", rung="page", finished_at=now
            )
            return []
        self._entry(inc, "event", "page_requested", reason)
        # paged=1: whatever closes this incident later sends the matching resolve
        self._set(incident_id, page_pending=1, paged=1, page_next_at=now + _PAGE_INFLIGHT_SECONDS)
        return [self._page_effect(incident_id, resolved=False)]

    def _page_effect(self, incident_id: int, resolved: bool) -> _SendPage:
        inc = self._row(incident_id)
        entry_id = self._entry(
            inc, "action", "started", "resolve page" if resolved else "page", rung="page", attempt=1
        )
        return _SendPage(incident_id, entry_id, self._build_page(self._row(incident_id), resolved))

    def _build_page(self, inc: sqlite3.Row, resolved: bool) -> Page:
        sig = self._sig(inc)
        labels = json.loads(inc["labels"])
        annotations = json.loads(inc["annotations"])
        target = self._target(inc)
        runbook = (
            annotations.get("runbook_url")
            or sig.runbook_url
            or f"{self.settings.runbook_base_url.rstrip('/')}/{sig.fault_class}.md"
        )
        summary = annotations.get("summary") or inc["alertname"] or sig.fault_class
        return Page(
            dedup_key=f"gpupulse-incident-{inc['id']}",
            summary=f"{summary} on {incident_identity(target)}: {inc['reason'] or sig.reason}",
            severity=sig.page_severity or labels.get("severity", "") or "critical",
            fault_class=sig.fault_class,
            signature=sig.name,
            runbook_url=runbook,
            target=target,
            history=self._db.history(int(inc["id"])),
            resolved=resolved,
        )

    def _join_group(self, incident_id: int, now: float, why: str = "") -> list[_Effect]:
        inc = self._row(incident_id)
        breaker = self._safety.breaker()
        group = str(breaker.get("group", "breaker"))
        reason = f"breaker open: {breaker.get('reason', '')}"
        self._entry(
            inc, "event", "grouped", f"breaker open ({breaker.get('reason', '')}): joins grouped page {group}"
        )
        self._set(
            incident_id,
            state="paged",
            rung="page",
            rung_started_at=now,
            paged=1,
            page_group=group,
            group_sent=0,
            # a page's own reason (e.g. the reboot a drained node still needs) stays in front
            reason=f"{why}; {reason}" if why else reason,
            next_at=now + self.settings.paged_incident_max_age_seconds,
        )
        return []

    def _join_summary(self, incident_id: int, now: float, reason: str, spent: str) -> list[_Effect]:
        """Over the page budget: the incident joins its signature's summary page of this storm."""
        inc = self._row(incident_id)
        signature = str(inc["signature"])
        window = self.settings.budgets.page_window_seconds
        current = [
            st
            for st in self._db.states(SUMMARY).values()
            if st.get("signature") == signature and now - float(st.get("last_join_at", 0.0)) <= window
        ]
        if current:
            state = current[-1]
        else:  # the first incident over budget, or the last storm of this signature ended
            group = f"summary-{signature}-{int(now)}"
            state = {"group": group, "signature": signature, "started_at": now, "last_page_at": 0.0}
        state["last_join_at"] = now
        group = str(state["group"])
        self._db.set_state(SUMMARY + group, state)
        self._entry(inc, "event", "summarized", f"{spent}: joins summary page {group}")
        self._set(
            incident_id,
            state="paged",
            rung="page",
            rung_started_at=inc["rung_started_at"] if inc["rung"] == "page" else now,
            paged=1,
            page_group=group,
            group_sent=0,
            reason=reason,
            next_at=now + self.settings.paged_incident_max_age_seconds,
        )
        return []

    def _flush_summaries(self, now: float) -> list[_Effect]:
        """Send or update each summary page whose group grew (at most every group interval), and
        resolve it once every member incident closed."""
        out: list[_Effect] = []
        interval = self.settings.budgets.group_page_interval_seconds
        for key, state in self._db.states(SUMMARY).items():
            group = str(state["group"])
            last = float(state.get("last_page_at", 0.0))
            if self._db.open_group_members(group) == 0:
                if last:
                    members = self._db.group_members(group, unsent_only=False)
                    out.append(_SendGroupPage(group, self._summary_page(state, members, True), (), key))
                self._db.delete_state(key)
                continue
            if last and now < last + interval:
                continue
            unsent = self._db.group_members(group, unsent_only=True)
            if not unsent:
                continue
            for inc in unsent:
                self._set(int(inc["id"]), group_sent=1)
                self._entry(inc, "event", "group_page", f"included in summary page {group}")
            self._db.set_state(key, {**state, "last_page_at": now})
            members = self._db.group_members(group, unsent_only=False)
            page = self._summary_page(state, members, False)
            out.append(_SendGroupPage(group, page, tuple(int(m["id"]) for m in unsent), key))
        return out

    def _summary_page(self, state: Mapping[str, Any], members: Sequence[sqlite3.Row], resolved: bool) -> Page:
        signature = str(state["signature"])
        sig = self.library.get(signature) or unknown_signature("")
        b = self.settings.budgets
        targets = [incident_identity(self._target(m)) for m in members]
        first = ", ".join(targets[:_SUMMARY_TARGETS])
        more = f" and {len(targets) - _SUMMARY_TARGETS} more" if len(targets) > _SUMMARY_TARGETS else ""
        query = urlencode({"signature": signature, "state": "active"})
        link = f"{self.settings.external_url.rstrip('/')}/api/v1/incidents?{query}"
        since = datetime.fromtimestamp(float(state["started_at"]), tz=UTC).isoformat(timespec="seconds")
        summary = (
            f"{len(members)} incidents of {signature} ({sig.fault_class}) since {since}; the page budget "
            f"({b.max_pages_per_window} per {b.page_window_seconds:.0f} s) is spent, so they share this "
            f"page. First targets: {first}{more}. All of them: {link}"
        )
        history = [
            {
                "incident_id": int(m["id"]),
                "target": incident_identity(self._target(m)),
                "alertname": m["alertname"],
                "state": m["state"],
                "opened_at": m["opened_at"],
                "reason": m["reason"],
            }
            for m in members[:_SUMMARY_TARGETS]
        ]
        return Page(
            dedup_key=f"gpupulse-{state['group']}",
            summary=summary,
            severity=sig.page_severity or "critical",
            fault_class=sig.fault_class,
            signature=signature,
            runbook_url=sig.runbook_url
            or f"{self.settings.runbook_base_url.rstrip('/')}/{sig.fault_class}.md",
            target=self._target(members[0]) if members else Target(kind="node"),
            history=history,
            resolved=resolved,
        )

    def _loop_page(self, incident_id: int, verdict: LoopVerdict, now: float) -> list[_Effect]:
        inc = self._row(incident_id)
        self._record_loop(inc, verdict, now)
        if verdict.kind == "flapping":
            self._later(self.metrics.flapping.inc)
        self._set(incident_id, rung="page", attempt=1, rung_started_at=now)
        return self._page(incident_id, now, verdict.detail)

    def _record_loop(self, inc: sqlite3.Row, verdict: LoopVerdict, now: float) -> None:
        self._db.add_loop(inc["loop_key"], verdict.kind, int(inc["id"]), now, {"detail": verdict.detail})
        self._entry(inc, "event", verdict.kind, verdict.detail)

    def _close(self, incident_id: int, resolution: str, now: float, state: str = "closed") -> list[_Effect]:
        inc = self._row(incident_id)
        outcome = "success" if resolution == "automated" else resolution
        if inc["rung"] and inc["rung"] != "page":
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
        if inc["page_sticky"]:
            # the page says a human must still reset, reboot or replace: the alert resolving does not
            # mean that happened, so the page stays open until a human closes it in the pager
            self._entry(inc, "event", "page_left_open", "the page stays open: a human must finish the repair")
            return []
        if inc["paged"] and not inc["page_group"] and not self.settings.dry_run:
            return [self._page_effect(incident_id, resolved=True)]
        return []

    def _conclude_rung(self, inc: sqlite3.Row, outcome: str, detail: str) -> None:
        if not inc["rung"] or inc["rung_started_at"] is None:
            return
        start = float(inc["rung_started_at"])
        end = self.clock.time()
        attrs: dict[str, AttrValue] = {
            "gpupulse.rung": inc["rung"],
            "gpupulse.attempt": int(inc["attempt"]),
            "gpupulse.outcome": outcome,
            "gpupulse.detail": detail[:500],
        }
        trace_id, span_id, name = inc["trace_id"], inc["span_id"], f"rung {inc['rung']}"
        self._later(lambda: self.tracer.rung(trace_id, span_id, name, start, end, attrs))

    # ------------------------------------------------------------------ timers

    def _on_tick(self) -> list[_Effect]:
        now = self.clock.time()
        effects, self._deferred = self._deferred, []
        for inc in self._db.due_incidents(now):
            incident_id = int(inc["id"])
            state = inc["state"]
            sig = self._sig(inc)
            if inc["held"] and state != "paged":
                effects += self._held_due(inc, now)
                continue
            if state == "open":
                if json.loads(inc["firing_fps"]):
                    self._entry(inc, "event", "persistent", "still firing; starting the ladder")
                    rung, attempt = first_step(sig.ladder)
                    effects += self._start(incident_id, rung, attempt, now)
                else:
                    effects += self._close(incident_id, "self_resolved", now)
            elif state == "verifying":
                window = sig.ladder.verify_window_seconds
                why = f"{inc['rung']} not verified within {window:.0f} s"
                effects += self._escalate(incident_id, now, why)
            elif state == "cooldown":
                if json.loads(inc["firing_fps"]):  # only where a resolution could not verify the rung
                    effects += self._still_firing(inc, now)
                else:
                    effects += self._close(incident_id, "automated", now)
            elif state == "retry_wait":
                self._entry(inc, "event", "retry", f"retrying {inc['rung']} after a temporary failure")
                effects += self._start(incident_id, inc["rung"], int(inc["attempt"]), now, retry=True)
            elif state == "paged":
                effects += self._close(incident_id, "unresolved", now)
        for inc in self._db.pending_pages(now):
            self._set(int(inc["id"]), page_next_at=now + _PAGE_INFLIGHT_SECONDS)
            effects.append(self._page_effect(int(inc["id"]), resolved=False))
        effects += self._flush_group(now)
        effects += self._flush_summaries(now)
        effects += self._promql_rechecks(now)
        horizon = max(self.settings.loops.flap_window_seconds, 3600.0)
        self._db.prune(now - horizon, now - self.settings.handled_keys_retention_seconds)
        return effects

    def _still_firing(self, inc: sqlite3.Row, now: float) -> list[_Effect]:
        """The cooldown of an unverifiable rung ended with the alert still firing: it did not hold."""
        cooldown = self._sig(inc).ladder.cooldown_seconds
        why = f"{inc['rung']} did not hold: the alert still fires after the {cooldown:.0f} s cooldown"
        # as with a recurrence: after a migrate, only a human is left
        blocked: frozenset[Rung] = frozenset({"migrate"}) if inc["rung"] == "migrate" else frozenset()
        return self._escalate(int(inc["id"]), now, why, blocked)

    def _held_due(self, inc: sqlite3.Row, now: float) -> list[_Effect]:
        """A held incident's next step came due: it waits for a fresh notification, then gives up."""
        incident_id = int(inc["id"])
        if inc["held"] == _HELD_DUE:
            why = "no fresh notification confirmed the alert after the controller's gap"
            self._set(incident_id, reason=why)
            return self._close(incident_id, "unresolved", now)
        if inc["state"] == "cooldown" and not json.loads(inc["firing_fps"]):
            self._set(incident_id, held=0)  # closing on a quiet cooldown acts on nothing
            return self._close(incident_id, "automated", now)
        self._entry(
            inc,
            "event",
            "held",
            f"{inc['state']} step due, not taken on evidence from before the gap; waiting up to "
            f"{self.settings.paged_incident_max_age_seconds:.0f} s for a fresh notification",
        )
        self._set(incident_id, held=_HELD_DUE, next_at=now + self.settings.paged_incident_max_age_seconds)
        return []

    def _flush_group(self, now: float) -> list[_Effect]:
        breaker = self._safety.breaker()
        if not breaker.get("open"):
            return []
        group = str(breaker.get("group", ""))
        last = float(cast(float, breaker.get("last_group_page_at", 0.0)))
        if now < last + self.settings.budgets.group_page_interval_seconds:
            return []
        unsent = self._db.group_members(group, unsent_only=True)
        if not unsent:
            return []
        members = self._db.group_members(group, unsent_only=False)
        for inc in unsent:
            self._set(int(inc["id"]), group_sent=1)
            self._entry(inc, "event", "group_page", f"included in grouped page {group}")
        self._db.set_state(BREAKER, {**breaker, "last_group_page_at": now})
        history = [
            {
                "incident_id": int(m["id"]),
                "signature": m["signature"],
                "fault_class": m["fault_class"],
                "alertname": m["alertname"],
                "target": incident_identity(self._target(m)),
                "opened_at": m["opened_at"],
                # a member drained before the breaker opened says what a human must still do
                "reason": m["reason"],
            }
            for m in members
        ]
        page = Page(
            dedup_key=f"gpupulse-{group}",
            summary=(
                f"Remediation breaker open ({breaker.get('reason', '')}): {len(members)} incidents "
                "need a human; automation stopped until someone resets the breaker"
            ),
            severity="critical",
            fault_class="breaker",
            signature="safety-breaker",
            runbook_url=f"{self.settings.runbook_base_url.rstrip('/')}/remediation-breaker.md",
            target=Target(kind="node"),
            history=history,
        )
        return [_SendGroupPage(group, page, tuple(int(m["id"]) for m in unsent))]

    def _promql_rechecks(self, now: float) -> list[_Effect]:
        if self.verifier is None:
            return []
        out: list[_Effect] = []
        for inc in self._db.list_incidents("verifying", 10_000):
            if inc["resolved_at"] is None:
                continue
            sig = self._sig(inc)
            if not sig.verify_promql:
                self._enter_cooldown(int(inc["id"]), now)
                continue
            last = self._promql_last.get(int(inc["id"]), 0.0)
            if now - last >= self.settings.promql_recheck_seconds:
                self._promql_last[int(inc["id"])] = now
                out.append(
                    _CheckPromQL(int(inc["id"]), render_query(sig.verify_promql, json.loads(inc["labels"])))
                )
        return out

    # ------------------------------------------------------------------ effects

    async def _run_action(self, eff: _Act) -> None:
        started = time.monotonic()
        delay = 0.0
        details: Mapping[str, Any] = {}
        try:
            call = self.backend.restart if eff.rung == "restart" else self.backend.migrate
            result = await asyncio.wait_for(
                call(eff.target, eff.reason), self.settings.action_timeout_seconds
            )
            outcome = "success" if result.done else "failed"
            summary, details = result.summary, result.details
        except TemporaryError as exc:
            outcome, summary, delay = "temporary", str(exc), exc.delay_seconds
        except PermanentError as exc:
            outcome, summary = "failed", str(exc)
        except TimeoutError:
            outcome, summary, delay = (
                "temporary",
                f"timed out after {self.settings.action_timeout_seconds} s",
                5.0,
            )
        except Exception as exc:  # a backend bug must not stall the ladder: treat as a failed rung
            log.exception("backend %s raised on %s", getattr(self.backend, "name", "?"), eff.rung)
            outcome, summary = "failed", f"{type(exc).__name__}: {exc}"
        duration = time.monotonic() - started
        self.metrics.action_duration.labels(rung=eff.rung).observe(duration)
        await self._decide(lambda: self._on_action_done(eff, outcome, summary, details, delay))

    def _on_action_done(
        self, eff: _Act, outcome: str, summary: str, details: Mapping[str, Any], delay: float
    ) -> list[_Effect]:
        now = self.clock.time()
        entry = self._db.entry(eff.entry_id)
        if entry is None or entry["status"] != "started":
            return []
        self._db.finish_entry(eff.entry_id, outcome, now, summary, details)
        metric_outcome = "success" if outcome == "success" else "failed"
        self._later(lambda: self.metrics.actions.labels(rung=eff.rung, outcome=metric_outcome).inc())
        inc = self._row(eff.incident_id)
        if inc["state"] != "acting":
            return []
        if outcome == "success":
            return self._after_success(eff.incident_id, eff.rung, now)
        if outcome == "temporary" and int(inc["temp_retries"]) < self.settings.max_temporary_retries:
            self._set(
                eff.incident_id,
                state="retry_wait",
                temp_retries=int(inc["temp_retries"]) + 1,
                next_at=now + max(0.0, delay),
            )
            return []
        rung = eff.rung
        if not json.loads(inc["firing_fps"]):
            # the alert resolved while the failed action ran: nothing left to fix
            return self._close(eff.incident_id, "self_resolved", now)
        why = f"{rung} failed: {summary}"
        return self._escalate(eff.incident_id, now, why, frozenset({rung}))

    async def _run_page(self, eff: _SendPage) -> None:
        error = ""
        lock = self._page_locks.setdefault(eff.page.dedup_key, asyncio.Lock())
        try:
            async with lock:
                await self.pager.send(eff.page)
        except Exception as exc:  # any pager failure is retried from the tick; never lost
            log.warning("page %s failed: %s", eff.page.dedup_key, exc)
            error = f"{type(exc).__name__}: {exc}"
        if eff.page.resolved and not lock.locked():
            self._page_locks.pop(eff.page.dedup_key, None)
        await self._decide(lambda: self._on_page_done(eff, error))

    def _on_page_done(self, eff: _SendPage, error: str) -> list[_Effect]:
        now = self.clock.time()
        entry = self._db.entry(eff.entry_id)
        if entry is None or entry["status"] != "started":
            return []
        inc = self._row(eff.incident_id)
        status = "failed" if error else "success"
        summary = f"{'resolve page' if eff.page.resolved else 'page'} via {self.pager.name}"
        self._db.finish_entry(eff.entry_id, status, now, summary + (f": {error}" if error else ""), {})
        self._later(lambda: self.metrics.actions.labels(rung="page", outcome=status).inc())
        if eff.page.resolved:
            return []
        if error:
            self._set(eff.incident_id, page_next_at=now + self.settings.page_retry_seconds)
            return []
        self._set(eff.incident_id, page_pending=0)
        if inc["state"] == "paged":
            self._conclude_rung(self._row(eff.incident_id), "success", f"paged via {self.pager.name}")
        return []

    async def _run_group_page(self, eff: _SendGroupPage) -> None:
        error = ""
        try:
            await self.pager.send(eff.page)
        except Exception as exc:
            log.warning("grouped page %s failed: %s", eff.group, exc)
            error = f"{type(exc).__name__}: {exc}"
        await self._decide(lambda: self._on_group_page_done(eff, error))

    def _on_group_page_done(self, eff: _SendGroupPage, error: str) -> list[_Effect]:
        now = self.clock.time()
        status = "failed" if error else "success"
        self._later(lambda: self.metrics.actions.labels(rung="page", outcome=status).inc())
        for incident_id in eff.member_ids:
            inc = self._row(incident_id)
            self._entry(
                inc,
                "action",
                status,
                f"grouped page {eff.group} via {self.pager.name} {error}".strip(),
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

    async def _run_promql(self, eff: _CheckPromQL) -> None:
        assert self.verifier is not None
        try:
            healthy = await self.verifier.healthy(eff.query)
            detail = "healthy" if healthy else "not healthy yet"
        except VerifyError as exc:
            healthy, detail = False, str(exc)
        await self._decide(lambda: self._on_promql(eff, healthy, detail))

    def _on_promql(self, eff: _CheckPromQL, healthy: bool, detail: str) -> list[_Effect]:
        now = self.clock.time()
        inc = self._row(eff.incident_id)
        if inc["state"] != "verifying" or inc["resolved_at"] is None:
            return []
        self._entry(inc, "event", "promql", f"{eff.query}: {detail}")
        if healthy:
            self._enter_cooldown(eff.incident_id, now)
        return []


def build_engine(
    settings: EngineSettings,
    db_path: Path,
    metrics: RemediationMetrics,
    clock: Clock | None = None,
    backend: ActionBackend | None = None,
    pager: Pager | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    library: SignatureLibrary | None = None,
    node_labels: NodeLabels | None = None,
) -> Engine:
    """Load and validate the signatures, open the ledger tables and resume where the last run stopped.

    Raises ValueError (SignatureError is one) for invalid settings or signature files.
    """
    settings.validate()
    if settings.scope.node_selector and node_labels is None:
        raise ValueError(
            "scope.node_selector needs the labels of nodes, which only the Kubernetes backend reads"
        )
    lib = (
        library
        if library is not None
        else load_library(settings.signature_dirs, settings.include_builtin_signatures)
    )
    return RemediationEngine(
        settings=settings,
        db_path=db_path,
        metrics=metrics,
        library=lib,
        clock=clock or SystemClock(),
        backend=backend if backend is not None else _backend_from_settings(settings),
        pager=pager if pager is not None else _pager_from_settings(settings),
        tracer=IncidentTracer(tracer_provider, owned=False)
        if tracer_provider is not None
        else IncidentTracer(make_provider(settings.service_name, settings.otlp_traces_endpoint), owned=True),
        verifier=PromQLVerifier(settings.prometheus_url, settings.prometheus_timeout_seconds)
        if settings.prometheus_url
        else None,
        node_labels=node_labels,
    )


def _backend_from_settings(settings: EngineSettings) -> ActionBackend:
    if settings.backend == "local":
        from remediation.backends.local import LocalBackend

        return LocalBackend(settings.local_backend)
    if settings.backend == "kubernetes":
        raise ValueError(
            "backend 'kubernetes' must be built by the caller and passed to build_engine(backend=...)"
        )
    return NoBackend()


def _pager_from_settings(settings: EngineSettings) -> Pager:
    from remediation.backends.pager import pager_from_settings

    built = pager_from_settings(settings.pager)
    return built if built is not None else LogPager()
