"""The decision engine: alert in, ladder step out (restart -> verify -> migrate -> verify -> page).

Every decision runs as one SQLite transaction on a dedicated thread (so fsyncs never block the event
loop): read state, decide, record intent, mark the event's dedup key handled. Only after the commit
are the effects carried out (backend calls, pages, PromQL checks) as asyncio tasks; their outcomes
are recorded by another transaction. A crash between intent and outcome therefore leaves an action
`started` in the ledger; on start such an action is marked `interrupted` and its incident is
verified, never acted on again.

This module only orchestrates; the parts are:

    remediation/decide/       pure rules: (state, event, now) -> verdicts, pages, field values
    remediation/transitions/  the state machine over the ledger, one transaction per transition
    remediation/effects.py    what a decision asks for; remediation/runner.py carries it out
    remediation/operations.py the operator's reads and switches (the API's side)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from gpupulse.clock import Clock, SystemClock
from remediation.backends import LogPager, NoBackend
from remediation.diagnosis.diagnose import Diagnoser, DiagnosisSettings
from remediation.diagnosis.prom import PrometheusRangeClient
from remediation.drain import BoundaryWaiter, NoProgressSource, ProgressSource, PrometheusProgress
from remediation.effects import Effect
from remediation.ladder import target_from_labels
from remediation.ledger import Ledger, connect
from remediation.metrics import RemediationMetrics
from remediation.model import (
    ActionAudit,
    ActionBackend,
    AlertEvent,
    Engine,
    NodeLabels,
    Pager,
    ResumableBackend,
)
from remediation.operations import Operations
from remediation.replication import LedgerMirror, TrackedLedger
from remediation.runner import EffectRunner
from remediation.settings import EngineSettings
from remediation.signatures import SignatureLibrary, load_library
from remediation.tracing import IncidentTracer, make_provider
from remediation.transitions import Transitions
from remediation.verify import PromQLVerifier

log = logging.getLogger(__name__)


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
        diagnoser: Diagnoser | None = None,
        mirror: LedgerMirror | None = None,
        audit: ActionAudit | None = None,
        boundary: BoundaryWaiter | None = None,
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
        # cluster mode (docs/design/ha.md): the ledger is a cache written through to `mirror`
        self._mirror = mirror
        self._tracked: TrackedLedger | None = None
        if mirror is not None:
            self._tracked = TrackedLedger(connect(db_path, verify=True))
            self._db: Ledger = self._tracked
            self._ro: Ledger = self._tracked.sibling(connect(db_path))
        else:
            self._db = Ledger(connect(db_path, verify=True))  # decisions, on the executor thread only
            self._ro = Ledger(connect(db_path))  # sync API reads and the rare operator writes
        self._transitions = Transitions(
            settings,
            self._db,
            library,
            clock,
            metrics,
            tracer,
            verifying=verifier is not None,
            pager_name=pager.name,
            diagnosing=diagnoser is not None,
            # the Kubernetes backend counts a pool's cordons in the cluster; others cannot see them
            pools_from_ledger=backend.name != "kubernetes",
            resumable=backend.resumable if isinstance(backend, ResumableBackend) else None,
        )
        self._runner = EffectRunner(
            backend,
            pager,
            verifier,
            metrics,
            settings.action_timeout_seconds,
            self._decide,
            diagnoser,
            settings.diagnosis,
            may_act=mirror.may_act if mirror is not None else None,
            audit=audit,
            boundary=boundary,
            validation_timeout_seconds=settings.return_to_service_timeout_seconds,
            record_now=lambda fn: self._decide(fn, defer=False),
        )
        self._operations = Operations(settings, self._ro, library, clock, metrics)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpupulse-engine")
        self._lock = asyncio.Lock()
        self._closed = False
        self._broken: Exception | None = None  # a write-through that failed for good
        self._transitions.recover()

    # ------------------------------------------------------------------ Engine protocol: async

    async def handle(self, event: AlertEvent) -> None:
        """Process one accepted alert; idempotent on event.dedup_key."""
        node_labels = await self._labels_of_node(event)
        await self._decide(lambda t: t.on_event(event, node_labels))

    async def _labels_of_node(self, event: AlertEvent) -> Mapping[str, str] | None:
        """The Node labels the scope's node selector needs for this alert (read before the decision,
        which runs on a thread and must not wait on the network); a failure fails handle(), and the
        worker retries the alert."""
        if not self.settings.scope.node_selector or event.status != "firing" or self.node_labels is None:
            return None
        target, _ = target_from_labels(event.labels)
        if target.kind not in ("gpu", "node", "job") or not target.node:
            return None
        return await self.node_labels.labels(target.node)

    async def tick(self) -> None:
        """Advance timers: verification windows, cooldowns, retries, pending and grouped pages."""
        await self._decide(lambda t: t.on_tick())

    async def wait_idle(self) -> None:
        """Wait until every action, page and check started so far (and their follow-ups) finished."""
        await self._runner.wait_idle()

    async def aclose(self, grace_seconds: float = 5.0) -> None:
        """Stop: let in-flight work finish for up to grace_seconds, then cancel it.

        A cancelled action stays `started` in the ledger and is verified, not repeated, on the next start.
        """
        await self._runner.stop(grace_seconds)
        self._closed = True
        await self._runner.cancel()
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
        return self._operations.list_incidents(state, limit, signature)

    def get_incident(self, incident_id: int) -> Mapping[str, Any] | None:
        """One incident with its full ledger history."""
        return self._operations.get_incident(incident_id)

    def list_signatures(self) -> Sequence[Mapping[str, Any]]:
        """The loaded signature library."""
        return self._operations.list_signatures()

    def stats(self) -> Mapping[str, Any]:
        """Incident counts by resolution and the share handled without a human."""
        return self._operations.stats()

    def pause(self, by: str) -> Mapping[str, Any]:
        """Stop taking actions (new actions are blocked and their incidents page) until resume()."""
        return self._operations.pause(by)

    def resume(self, by: str) -> Mapping[str, Any]:
        """Allow actions again."""
        return self._operations.resume(by)

    def reset_breaker(self, by: str) -> Mapping[str, Any]:
        """A human closes the breaker; incidents already paged stay with humans."""
        return self._operations.reset_breaker(by)

    # ------------------------------------------------------------------ plumbing

    async def _decide(self, fn: Callable[[Transitions], list[Effect]], defer: bool = True) -> None:
        """Run one transition on the decision thread, then hand its effects to the runner. Without
        `defer` its write-through is never coalesced, even with no effects (an action's record of
        what it is about to change)."""
        if self._closed:
            raise RuntimeError("engine is closed")
        if self._broken is not None:
            raise self._broken
        async with self._lock:
            loop = asyncio.get_running_loop()
            if self._tracked is None or self._mirror is None:
                effects = await loop.run_in_executor(self._executor, self._transitions.transact, fn)
            else:
                effects = await self._decide_through(loop, fn, self._tracked, self._mirror, defer)
        self._runner.dispatch(effects)

    async def _decide_through(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[[Transitions], list[Effect]],
        tracked: TrackedLedger,
        mirror: LedgerMirror,
        defer: bool,
    ) -> list[Effect]:
        """Cluster mode: commit, write what changed through to the shared store, then (and only then)
        return the effects. A write that fails for good drops the effects and breaks the engine."""

        def transact() -> tuple[list[Effect], Any]:
            try:
                effects = self._transitions.transact(fn)
            finally:
                tracked.end_transaction()
            return effects, tracked.collect()

        effects, snapshot = await loop.run_in_executor(self._executor, transact)
        if snapshot:
            try:
                await mirror.write(snapshot, defer=defer and not effects)
            except Exception as exc:
                self._broken = exc
                raise
            tracked.written(snapshot)
        return effects


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
    mirror: LedgerMirror | None = None,
    audit: ActionAudit | None = None,
    progress: ProgressSource | None = None,
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
        diagnoser=diagnoser_from_settings(settings, clock or SystemClock()),
        mirror=mirror,
        audit=audit,
        boundary=boundary_waiter(settings, clock or SystemClock(), progress),
    )


def diagnoser_from_settings(settings: EngineSettings, clock: Clock) -> Diagnoser | None:
    """The diagnosis step when it is enabled and has a Prometheus to read (None otherwise: incidents
    then record "no diagnosis" and why, and the ladder runs as without diagnosis)."""
    d = settings.diagnosis
    url = settings.diagnosis_prometheus_url
    if not d.enabled or not url:
        return None
    return Diagnoser(
        PrometheusRangeClient(url, d.query_timeout_seconds),
        DiagnosisSettings(
            lookback_seconds=d.lookback_seconds,
            step_seconds=d.step_seconds,
            deadline_seconds=d.deadline_seconds,
        ),
        clock,
    )


def boundary_waiter(
    settings: EngineSettings, clock: Clock, progress: ProgressSource | None = None
) -> BoundaryWaiter:
    """What a training job's drain waits with: `progress` (tests), else the progress gauge from the
    diagnosis' Prometheus, else (none configured) a source that ends every wait at once, saying why."""
    d = settings.drain
    url = settings.diagnosis_prometheus_url
    if progress is None:
        progress = (
            PrometheusProgress(PrometheusRangeClient(url, d.query_timeout_seconds), d.progress_metric, clock)
            if url
            else NoProgressSource()
        )
    return BoundaryWaiter(progress, clock, d.poll_seconds)


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
