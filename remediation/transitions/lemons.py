"""Lemon and pool transitions: a quarantine written to the fault history (and a lemon paged for RMA),
and a migrate refused because it would take too much of a pool out at once."""

from __future__ import annotations

from remediation.capacity import nodes_taken_out, pool_refusal
from remediation.effects import Effect, MarkLemon
from remediation.lemons import Lemon, Quarantine
from remediation.model import Rung, Target
from remediation.records import Incident
from remediation.transitions.paging import PagingTransitions


class LemonTransitions(PagingTransitions):
    """What the ladder asks when a migrate is about to start and after one cordoned a node."""

    def _pool_refusal(self, rung: Rung, target: Target, now: float) -> str:
        """Why this migrate would take too much of its pool out ("" when it would not). Only where the
        backend cannot count the cluster's cordons itself (the Kubernetes backend does, before it
        writes), or is not called (a dry run): there the controller's own migrates within the node
        budgets' window are what is out."""
        if not (self.pools_from_ledger or self.settings.dry_run) or rung != "migrate" or not target.node:
            return ""
        if target.kind not in ("gpu", "node", "job"):
            return ""
        pools = self.settings.pools
        if pools.allowed_out(1) is None:
            return ""
        total = self.settings.cluster_node_count or self._db.known_nodes()
        out = nodes_taken_out(self._db, now - self.settings.budgets.migrate_window_seconds)
        return pool_refusal(pools, "", total, out, target.node)

    def _record_quarantine(self, inc: Incident, now: float) -> list[Lemon]:
        """A migrate cordoned the target's node: add it to the GPU's and node's fault history."""
        target = inc.target
        if self.settings.lemons.quarantines <= 0 or not target.node:
            return []
        if target.kind not in ("gpu", "node", "job"):
            return []
        sig = self._sig(inc)
        serial = inc.labels.get(self.settings.lemons.serial_label, "")
        quarantine = Quarantine(now, inc.id, sig.name, sig.fault_class, target.node, target.uuid, serial)
        return self._lemons.record(quarantine, now)

    def _lemon_marks(self) -> list[Effect]:
        """Marks decided but never confirmed (the controller stopped, or the label could not be
        written): sent again on start, by the new leader in cluster mode."""
        return [
            MarkLemon(0, node, tuple(sorted(uuids)), " and ".join(whys))
            for node, (uuids, whys) in sorted(self._lemons.unmarked().items())
        ]

    def on_lemon_marked(self, eff: MarkLemon) -> list[Effect]:
        """The backend marked the node: remember it, so a restart does not mark it again."""
        self._lemons.marked(eff.node, self.clock.time())
        return []

    def _keep_lemon_out(self, incident_id: int, now: float, lemons: list[Lemon]) -> list[Effect]:
        """The quarantine made a lemon: mark it (the node's label), then page once for RMA; the page
        stays open until a human closes it, as the repair is theirs."""
        inc = self._row(incident_id)
        window = self.settings.lemons.window_seconds
        what = " and ".join(lemon.describe(window) for lemon in lemons)
        why = (
            f"lemon, needs RMA: {what}; it stays out of service, never returned automatically, "
            "until a human removes the gpupulse.io/lemon label"
        )
        self._conclude_rung(inc, "success", "node quarantined; a lemon: kept out")
        self._entry(inc, "event", "lemon", why)
        self._set(incident_id, rung="page", attempt=1, rung_started_at=now, page_sticky=1)
        uuids = tuple(sorted({q.uuid for lemon in lemons for q in lemon.history if q.uuid}))
        mark = MarkLemon(incident_id, inc.target.node, uuids, what)
        return [mark, *self._page(incident_id, now, why)]
