"""What every transition shares: the ledger of the decision thread, settings, signatures, the clock.

A transition reads the incident's state from the ledger, asks remediation/decide for the verdict,
writes what changed and returns the effects to run after the commit. `transact` runs one of them as
one SQLite transaction; metrics and spans queued with `_later` go out only once it is durable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpupulse.clock import Clock
from remediation.effects import Effect
from remediation.ledger import Ledger
from remediation.lemons import LemonBook
from remediation.loops import LoopDetector, LoopVerdict
from remediation.metrics import RemediationMetrics
from remediation.model import Rung, Target
from remediation.records import Incident
from remediation.safety import SafetyGate
from remediation.settings import EngineSettings
from remediation.signatures import Signature, SignatureLibrary, unknown_signature
from remediation.tracing import AttrValue, IncidentTracer

T = TypeVar("T", bound="TransitionsBase")


class TransitionsBase:
    """The state every transition reads and the helpers that write it (one thread uses one)."""

    def __init__(
        self,
        settings: EngineSettings,
        db: Ledger,
        library: SignatureLibrary,
        clock: Clock,
        metrics: RemediationMetrics,
        tracer: IncidentTracer,
        *,
        verifying: bool,
        pager_name: str,
        diagnosing: bool = False,
        pools_from_ledger: bool = True,
        resumable: Callable[[Rung, Target], bool] | None = None,
    ) -> None:
        self.settings = settings
        self.library = library
        self.clock = clock
        self.metrics = metrics
        self.tracer = tracer
        # whether a PromQL verifier is configured (signatures' verify_promql are checked only then)
        self.verifying = verifying
        self.pager_name = pager_name
        # whether a Prometheus is there to diagnose from (settings.diagnosis.enabled and a URL)
        self.diagnosing = diagnosing
        # which rungs the backend may take again when a leader left them unconfirmed (recover())
        self.resumable = resumable or (lambda rung, target: False)
        self._db = db
        self._loops = LoopDetector(db, settings.loops)
        self._safety = SafetyGate(db, settings.budgets, settings.cluster_node_count)
        self._lemons = LemonBook(db, settings.lemons)
        # whether pool budgets count the controller's own migrates (the backend cannot see cordons)
        self.pools_from_ledger = pools_from_ledger
        self._post: list[Callable[[], None]] = []
        self._promql_last: dict[int, float] = {}
        # effects decided at start (recovery), sent with the first tick, when there is an event loop
        self._deferred: list[Effect] = []

    def transact(self: T, fn: Callable[[T], list[Effect]]) -> list[Effect]:
        """Run one transition as one transaction; its metrics and spans follow the commit."""
        self._post = []
        with self._db.transaction():
            effects = fn(self)
        post, self._post = self._post, []
        for callback in post:  # metrics and spans only after the decision is durable
            callback()
        self.metrics.incidents_open.set(self._db.count_open())
        return effects

    def _later(self, fn: Callable[[], None]) -> None:
        self._post.append(fn)

    def _sig(self, inc: Incident) -> Signature:
        sig = self.library.get(inc.signature)
        return sig if sig is not None else unknown_signature(inc.fault_class)

    def _entry(self, inc: Incident, kind: str, status: str, summary: str, **kw: Any) -> int:
        return self._db.add_entry(inc.id, self.clock.time(), kind, status, summary, **kw)

    def _set(self, incident_id: int, **fields: Any) -> None:
        self._db.update_incident(incident_id, updated_at=self.clock.time(), **fields)

    def _row(self, incident_id: int) -> Incident:
        row = self._db.incident(incident_id)
        assert row is not None, incident_id
        return row

    def _record_loop(self, inc: Incident, verdict: LoopVerdict, now: float) -> None:
        self._db.add_loop(inc.loop_key, verdict.kind, inc.id, now, {"detail": verdict.detail})
        self._entry(inc, "event", verdict.kind, verdict.detail)

    def _conclude_rung(self, inc: Incident, outcome: str, detail: str) -> None:
        if not inc.rung or inc.rung_started_at is None:
            return
        start = inc.rung_started_at
        end = self.clock.time()
        attrs: dict[str, AttrValue] = {
            "gpupulse.rung": inc.rung,
            "gpupulse.attempt": inc.attempt,
            "gpupulse.outcome": outcome,
            "gpupulse.detail": detail[:500],
        }
        trace_id, span_id, name = inc.trace_id, inc.span_id, f"rung {inc.rung}"
        self._later(lambda: self.tracer.rung(trace_id, span_id, name, start, end, attrs))
