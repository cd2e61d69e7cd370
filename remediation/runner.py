"""The effect runner: carries out what a committed decision asked for and reports each outcome back.

Actions go to the backend (with a deadline), pages to the pager (one lock per page dedup key, so a
resolve never overtakes the trigger it resolves), checks to Prometheus. Every outcome is recorded by
another decision (`record`, which the engine runs on its decision thread); a failure here is logged
and left to the ledger, where the next start or tick picks it up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, cast

from remediation.decide.pages import with_diagnosis
from remediation.diagnosis.diagnose import Diagnoser
from remediation.diagnosis.types import (
    DIAGNOSIS_BUSY,
    DIAGNOSIS_FAILED,
    Diagnosis,
    OwnAction,
    no_diagnosis,
    own_actions,
)
from remediation.drain import BoundaryWaiter
from remediation.effects import (
    Act,
    Announce,
    CheckPromQL,
    Diagnose,
    Effect,
    MarkLemon,
    SendGroupPage,
    SendPage,
    Validate,
)
from remediation.errors import PermanentError, TemporaryError, VerifyError
from remediation.metrics import RemediationMetrics
from remediation.model import (
    ActionAudit,
    ActionBackend,
    ActionNotice,
    ActionPhase,
    ActionResult,
    LemonMarker,
    MigratePreview,
    Pager,
    ResumableBackend,
    ReturnToService,
    ValidationPhase,
)
from remediation.settings import EngineDiagnosisSettings
from remediation.transitions import Transitions
from remediation.verify import PromQLVerifier

log = logging.getLogger("remediation.engine")

# an audit record (a Kubernetes Event) is best effort: it never holds an action back for longer
AUDIT_TIMEOUT_SECONDS = 5.0

Record = Callable[[Callable[[Transitions], list[Effect]]], Awaitable[None]]


class EffectRunner:
    """Runs effects as asyncio tasks and hands their outcomes to `record`."""

    def __init__(
        self,
        backend: ActionBackend,
        pager: Pager,
        verifier: PromQLVerifier | None,
        metrics: RemediationMetrics,
        action_timeout_seconds: float,
        record: Record,
        diagnoser: Diagnoser | None = None,
        diagnosis: EngineDiagnosisSettings | None = None,
        may_act: Callable[[], bool] | None = None,
        audit: ActionAudit | None = None,
        boundary: BoundaryWaiter | None = None,
        validation_timeout_seconds: float = 3600.0,
        record_now: Record | None = None,
    ) -> None:
        self.backend = backend
        self.boundary = boundary
        self.audit = audit
        self.pager = pager
        self.verifier = verifier
        self.metrics = metrics
        self.action_timeout_seconds = action_timeout_seconds
        self.validation_timeout_seconds = validation_timeout_seconds
        self._record = record
        # a record the shared store must hold before the effect goes on (never coalesced)
        self._record_now = record_now or record
        self.diagnoser = diagnoser
        self.diagnosis = diagnosis or EngineDiagnosisSettings()
        self._diagnosis_gate = asyncio.Semaphore(self.diagnosis.max_concurrent)
        self._diagnoses_waiting = 0
        # the fencing rule (cluster mode): checked before every effect; a fenced effect is not run and
        # stays `started` / pending in the shared ledger, for the next leader to verify
        self._may_act = may_act
        self._tasks: set[asyncio.Task[None]] = set()
        # one lock per page dedup key: a resolve never overtakes the trigger it resolves
        self._page_locks: dict[str, asyncio.Lock] = {}

    async def wait_idle(self) -> None:
        """Wait until every effect started so far (and their follow-ups) finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self, grace_seconds: float) -> None:
        """Let in-flight effects finish for up to grace_seconds, then cancel them."""
        if self._tasks and grace_seconds > 0:
            await asyncio.wait(list(self._tasks), timeout=grace_seconds)

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def fenced(self) -> bool:
        """True when this replica may no longer carry out effects."""
        return self._may_act is not None and not self._may_act()

    def dispatch(self, effects: Sequence[Effect]) -> None:
        for eff in effects:
            coro: Coroutine[Any, Any, None]
            if isinstance(eff, Act):
                coro = self._run_action(eff)
            elif isinstance(eff, SendPage):
                coro = self._run_page(eff)
            elif isinstance(eff, SendGroupPage):
                coro = self._run_group_page(eff)
            elif isinstance(eff, Diagnose):
                coro = self._run_diagnose(eff)
            elif isinstance(eff, Announce):
                coro = self._run_announce(eff)
            elif isinstance(eff, Validate):
                coro = self._run_validate(eff)
            elif isinstance(eff, MarkLemon):
                coro = self._mark_lemon(eff)
            else:
                coro = self._run_promql(eff)
            task = asyncio.ensure_future(self._unless_fenced(eff, coro))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the ledger still says `started`/`page_pending`: the next start or tick picks it up
            log.error("engine effect failed", exc_info=task.exception())

    async def _unless_fenced(self, eff: Effect, coro: Coroutine[Any, Any, None]) -> None:
        # checked as each effect starts, not at dispatch: the lease may lapse in between
        if self.fenced():
            coro.close()
            log.warning("fenced: %s not run; the next leader verifies it", type(eff).__name__)
            return
        await coro

    async def _announce(self, eff: Act, phase: ActionPhase, summary: str) -> None:
        await self._tell(ActionNotice(eff.target, eff.rung, phase, eff.incident_id, eff.signature, summary))

    async def _tell(self, notice: ActionNotice) -> None:
        if self.audit is None:
            return
        try:
            await asyncio.wait_for(self.audit.announce(notice), AUDIT_TIMEOUT_SECONDS)
        except Exception as exc:  # the audit trail must never stop or fail an action
            what = f"{notice.rung} {notice.phase} of incident {notice.incident_id}"
            log.warning("could not record the %s: %s", what, exc)

    async def _wait_for_boundary(self, eff: Act) -> bool:
        """A training job's drain waits for its next step first (remediation/drain.py); False when
        this replica was fenced meanwhile (the action then stays waiting, for the next leader)."""
        if eff.boundary_wait_seconds <= 0 or self.boundary is None:
            return True
        await self._record(lambda t: t.on_boundary_wait(eff))
        outcome = await self.boundary.wait(eff.target, eff.decided_at, eff.boundary_wait_seconds)
        if self.fenced():
            # the wait can outlast the lease: left waiting in the ledger, the next leader resumes it
            log.warning("fenced while waiting for a checkpoint: the next leader resumes the %s", eff.rung)
            return False
        await self._record(lambda t: t.on_boundary_done(eff, outcome))
        return True

    async def _run_announce(self, eff: Announce) -> None:
        """Tell the audit trail about a dry-run rung; a dry-run migrate may leave a preview
        (remediation/kube/quarantine.py), recorded with its incident."""
        await self._tell(
            ActionNotice(eff.target, eff.rung, "dry_run", eff.incident_id, eff.signature, eff.summary)
        )
        if eff.rung != "migrate" or not hasattr(self.backend, "preview_migrate"):
            return
        preview = cast(MigratePreview, self.backend)
        try:
            found = await asyncio.wait_for(
                preview.preview_migrate(eff.target, eff.summary), self.action_timeout_seconds
            )
        except Exception as exc:  # a preview is best effort: the dry run is recorded either way
            log.warning("dry-run preview of incident %s failed: %s", eff.incident_id, exc)
            return
        if found is not None:
            await self._record(lambda t: t.on_preview(eff, found.summary, found.details))

    async def _run_validate(self, eff: Validate) -> None:
        """Test a quarantined GPU through the backend; its verdict goes back to the transitions."""
        delay = 0.0
        details: Mapping[str, Any] = {}
        outcome: ValidationPhase
        try:
            if not hasattr(self.backend, "return_to_service"):
                raise PermanentError(f"backend {getattr(self.backend, 'name', '?')} cannot validate a GPU")
            backend = cast(ReturnToService, self.backend)
            call = backend.return_to_service(eff.target, eff.fault_class, eff.incident_id, eff.attempt)
            result = await asyncio.wait_for(call, self.validation_timeout_seconds)
            outcome = "passed" if result.done else "failed"
            summary, details = result.summary, result.details
        except TemporaryError as exc:
            outcome, summary, delay = "temporary", str(exc), exc.delay_seconds
        except PermanentError as exc:
            outcome, summary = "failed", str(exc)
            details = {"left": exc.left} if exc.left else {}
        except TimeoutError:
            outcome, summary = "temporary", f"no verdict within {self.validation_timeout_seconds:.0f} s"
            delay = 60.0
        except Exception as exc:  # a backend bug must not return a GPU: it counts as a fail
            log.exception("backend %s raised on validation", getattr(self.backend, "name", "?"))
            outcome, summary = "failed", f"{type(exc).__name__}: {exc}"
        await self._record(lambda t: t.on_validated(eff, outcome, summary, details, delay))

    async def _mark_lemon(self, eff: MarkLemon) -> None:
        if not isinstance(self.backend, LemonMarker) or not eff.node:
            return  # the lemon mark in the ledger is the only one this backend has
        try:
            await asyncio.wait_for(
                self.backend.mark_lemon(eff.node, eff.uuids, eff.detail), self.action_timeout_seconds
            )
        except Exception as exc:  # the page still goes out; the next start marks it again
            log.error("could not label lemon node %s (incident %d): %s", eff.node, eff.incident_id, exc)
            return
        await self._record(lambda t: t.on_lemon_marked(eff))

    async def _run_action(self, eff: Act) -> None:
        if not await self._wait_for_boundary(eff):
            return
        await self._announce(eff, "started", eff.reason)
        started = time.monotonic()
        delay = 0.0
        details: Mapping[str, Any] = {}
        outcome: ActionPhase
        try:
            result = await asyncio.wait_for(self._call(eff), self.action_timeout_seconds)
            outcome = "success" if result.done else "failed"
            summary, details = result.summary, result.details
        except TemporaryError as exc:
            # "refused" (the server changed nothing) is kept out of loop and budget counts
            outcome = "refused" if exc.nothing_changed else "temporary"
            summary, delay = str(exc), exc.delay_seconds
            details = {"left": exc.left} if exc.left else {}
        except PermanentError as exc:
            outcome, summary = "failed", str(exc)
            details = {"left": exc.left} if exc.left else {}
        except TimeoutError:
            outcome, summary, delay = (
                "temporary",
                f"timed out after {self.action_timeout_seconds} s",
                5.0,
            )
        except Exception as exc:  # a backend bug must not stall the ladder: treat as a failed rung
            log.exception("backend %s raised on %s", getattr(self.backend, "name", "?"), eff.rung)
            outcome, summary = "failed", f"{type(exc).__name__}: {exc}"
        duration = time.monotonic() - started
        self.metrics.action_duration.labels(rung=eff.rung).observe(duration)
        await self._announce(eff, outcome, summary)
        await self._record(lambda t: t.on_action_done(eff, outcome, summary, details, delay))

    def _call(self, eff: Act) -> Awaitable[ActionResult]:
        backend = self.backend
        if isinstance(backend, ResumableBackend) and backend.resumable(eff.rung, eff.target):

            async def prepare(details: Mapping[str, Any]) -> None:
                await self._record_now(lambda t: t.on_action_prepared(eff, details))

            return backend.act(eff.rung, eff.target, eff.reason, eff.prepared, prepare)
        call = backend.restart if eff.rung == "restart" else backend.migrate
        return call(eff.target, eff.reason)

    async def _diagnose(
        self, labels: Mapping[str, str], fired_at: float, own: Sequence[OwnAction] = ()
    ) -> Diagnosis:
        """One diagnosis, at most `max_concurrent` at once; past `max_queued` waiting, none at all
        (a storm of incidents must not turn into a storm of queries)."""
        assert self.diagnoser is not None
        now = time.time()
        if self._diagnoses_waiting >= self.diagnosis.max_queued:
            return no_diagnosis(
                DIAGNOSIS_BUSY,
                f"{self._diagnoses_waiting} diagnoses already queued (--diagnosis.max-queued)",
                window_start=now,
                window_end=now,
                computed_at=now,
            )
        self._diagnoses_waiting += 1
        try:
            async with self._diagnosis_gate:
                return await self.diagnoser.diagnose(labels, fired_at, own)
        except Exception as exc:  # a bug in the diagnosis must never stop a page or an action
            log.exception("diagnosis failed")
            return no_diagnosis(
                DIAGNOSIS_FAILED,
                f"the diagnosis failed: {type(exc).__name__}: {exc}",
                window_start=now,
                window_end=now,
                computed_at=now,
            )
        finally:
            self._diagnoses_waiting -= 1

    async def _run_diagnose(self, eff: Diagnose) -> None:
        found = await self._diagnose(eff.labels, eff.fired_at)
        await self._record(lambda t: t.on_diagnosis(eff.incident_id, eff.trigger, found))

    async def _run_page(self, eff: SendPage) -> None:
        error = ""
        page = eff.page
        if eff.labels is not None and self.diagnoser is not None and not page.resolved:
            # refreshed before it pages: what changed is read again now, and recorded; what the
            # incident's own actions did (our restart's new process) is never named its cause
            found = await self._diagnose(eff.labels, eff.fired_at, own_actions(page.history))
            await self._record(lambda t: t.on_diagnosis(eff.incident_id, "page", found))
            page = with_diagnosis(page, found, self.diagnosis.dashboard_url, eff.labels)
        lock = self._page_locks.setdefault(page.dedup_key, asyncio.Lock())
        try:
            async with lock:
                await self.pager.send(page)
        except Exception as exc:  # any pager failure is retried from the tick; never lost
            log.warning("page %s failed: %s", eff.page.dedup_key, exc)
            error = f"{type(exc).__name__}: {exc}"
        if eff.page.resolved and not lock.locked():
            self._page_locks.pop(eff.page.dedup_key, None)
        await self._record(lambda t: t.on_page_done(eff, error))

    async def _run_group_page(self, eff: SendGroupPage) -> None:
        error = ""
        try:
            await self.pager.send(eff.page)
        except Exception as exc:
            log.warning("grouped page %s failed: %s", eff.group, exc)
            error = f"{type(exc).__name__}: {exc}"
        await self._record(lambda t: t.on_group_page_done(eff, error))

    async def _run_promql(self, eff: CheckPromQL) -> None:
        assert self.verifier is not None
        try:
            healthy = await self.verifier.healthy(eff.query)
            detail = "healthy" if healthy else "not healthy yet"
        except VerifyError as exc:
            healthy, detail = False, str(exc)
        await self._record(lambda t: t.on_promql(eff, healthy, detail))
