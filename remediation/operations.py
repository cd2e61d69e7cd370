"""The operator's side of the engine: incident and signature reads, statistics, pause/resume, breaker reset.

These run on the event loop over their own read connection (the decisions own the other one); the
rare operator writes are single short transactions. remediation/api.py serves them over HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpupulse.clock import Clock
from remediation.ledger import Ledger
from remediation.lemons import LemonBook
from remediation.metrics import RemediationMetrics
from remediation.safety import BREAKER, PAUSE, SafetyGate
from remediation.settings import EngineSettings
from remediation.signatures import SignatureLibrary

log = logging.getLogger("remediation.engine")

# the kill switch's own audit trail: a ledger state, so cluster mode replicates it with the switches
SWITCH_LOG = "switch_log"
SWITCH_LOG_KEEP = 50


class Operations:
    """What an operator reads and switches (the sync half of remediation.model.Engine)."""

    def __init__(
        self,
        settings: EngineSettings,
        ledger: Ledger,
        library: SignatureLibrary,
        clock: Clock,
        metrics: RemediationMetrics,
    ) -> None:
        self.settings = settings
        self.library = library
        self.clock = clock
        self.metrics = metrics
        self._ro = ledger

    def list_incidents(
        self, state: str | None = None, limit: int = 100, signature: str | None = None
    ) -> Sequence[Mapping[str, Any]]:
        """Incidents, newest first; state filters one state ("active": all open ones), signature one
        signature (the link a summary page carries)."""
        rows = self._ro.list_incidents(state, max(1, min(limit, 10_000)), signature)
        latest = self._ro.latest_diagnoses([r.id for r in rows])
        out = []
        for r in rows:
            d = r.to_dict()
            rec = latest.get(r.id)
            d["diagnosis"] = diagnosis_brief(rec.to_dict()) if rec is not None else None
            out.append(d)
        return out

    def get_incident(self, incident_id: int) -> Mapping[str, Any] | None:
        """One incident with its full ledger history, its latest diagnosis with all its evidence, and
        the headline of every earlier one."""
        row = self._ro.incident(incident_id)
        if row is None:
            return None
        out = row.to_dict()
        out["history"] = self._ro.history(incident_id)
        diagnoses = self._ro.diagnoses(incident_id)
        out["diagnosis"] = diagnoses[-1].to_dict() if diagnoses else None
        out["diagnoses"] = [diagnosis_brief(d.to_dict()) for d in diagnoses]
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
            "loops_detected": self._ro.count_loops(),
            # alerts recorded and never acted on (out_of_order, expired, too_old)
            "stale_alerts": self._ro.stale_counts(),
            "breaker": breaker or {"open": False},
            "actions": self._actions(),
            "paused": self._ro.get_state(PAUSE) or {"paused": False},
            "switch_log": self.switch_log()[:10],
            # GPUs and nodes kept out for RMA (docs/design/lemons.md)
            "lemons": LemonBook(self._ro, self.settings.lemons).lemons(),
            "dry_run": self.settings.dry_run,
            "pager": self.settings.pager.kind,
            "signatures": len(self.library),
        }

    def _actions(self) -> dict[str, int]:
        """Actions in flight and started in the last minute, beside the budgets they count against."""
        b = self.settings.budgets
        gate = SafetyGate(self._ro, b, self.settings.cluster_node_count)
        return {
            "in_flight": gate.actions_in_flight(),
            "max_concurrent": b.max_concurrent_actions,
            "last_minute": gate.actions_last_minute(self.clock.time()),
            "max_per_minute": b.max_actions_per_minute,
        }

    def pause(self, by: str) -> Mapping[str, Any]:
        """Stop taking actions (new actions are blocked and their incidents page) until resume(). A
        controller already paused stays paused by whoever paused it first, since then."""
        with self._ro.transaction():
            changed = not self._ro.get_state(PAUSE).get("paused")
            if changed:
                self._ro.set_state(PAUSE, {"paused": True, "by": by, "at": self.clock.time()})
            self._log_switch("pause", by, changed)
        self.metrics.paused.set(1)
        self.metrics.paused_since.set(float(self._ro.get_state(PAUSE).get("at") or 0.0))
        log.warning("remediation paused by %s%s", by, "" if changed else " (it already was)")
        return self._switched(changed)

    def resume(self, by: str) -> Mapping[str, Any]:
        """Allow actions again (an open breaker still blocks them)."""
        with self._ro.transaction():
            changed = bool(self._ro.get_state(PAUSE).get("paused"))
            if changed:
                self._ro.set_state(PAUSE, {"paused": False, "by": by, "at": self.clock.time()})
            self._log_switch("resume", by, changed)
        self.metrics.paused.set(0)
        self.metrics.paused_since.set(0)
        log.warning("remediation resumed by %s%s", by, "" if changed else " (it was not paused)")
        return self._switched(changed)

    def reset_breaker(self, by: str) -> Mapping[str, Any]:
        """A human closes the breaker; incidents already paged stay with humans (a pause still blocks
        actions)."""
        with self._ro.transaction():
            gate = SafetyGate(self._ro, self.settings.budgets, self.settings.cluster_node_count)
            changed = bool(gate.breaker().get("open"))
            if changed:
                gate.close_breaker(by, self.clock.time())
            self._log_switch("breaker_reset", by, changed)
        self.metrics.breaker_open.set(0)
        log.warning("remediation breaker reset by %s%s", by, "" if changed else " (it was not open)")
        return self._switched(changed)

    def switch_log(self) -> list[dict[str, Any]]:
        """Who paused, resumed or reset the breaker, when and why: the newest SWITCH_LOG_KEEP, newest
        first (a change that found the switch already so has changed: false)."""
        return list(reversed(self._ro.get_state(SWITCH_LOG).get("entries") or []))

    def _log_switch(self, action: str, by: str, changed: bool) -> None:
        entries = list(self._ro.get_state(SWITCH_LOG).get("entries") or [])
        entries.append({"at": self.clock.time(), "action": action, "by": by, "changed": changed})
        self._ro.set_state(SWITCH_LOG, {"entries": entries[-SWITCH_LOG_KEEP:]})

    def _switched(self, changed: bool) -> Mapping[str, Any]:
        """What an operator's switch answers: whether it changed anything and the state it left."""
        return {
            "changed": changed,
            "paused": self._ro.get_state(PAUSE) or {"paused": False},
            "breaker": self._ro.get_state(BREAKER) or {"open": False},
        }


_BRIEF = (
    "at",
    "trigger",
    "status",
    "headline",
    "top_cause",
    "top_layer",
    "confident",
    "reason_code",
    "reason",
)


def diagnosis_brief(d: Mapping[str, Any]) -> dict[str, Any]:
    """A diagnosis without its evidence: what a list shows."""
    return {k: d.get(k) for k in _BRIEF}
