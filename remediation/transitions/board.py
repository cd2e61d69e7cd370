"""The on-call board read from the ledger: open incidents (the newest, capped), the latest actions,
and what each safety budget still allows; a handful of bounded queries, however many incidents.
The engine publishes the result to RemediationMetrics.board once per tick."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from remediation.ledger import Ledger
from remediation.metrics import BoardSnapshot, OpenIncident, RecentAction
from remediation.model import Target
from remediation.records import Incident, LedgerEntry
from remediation.safety import SafetyGate
from remediation.settings import BudgetSettings

# A storm of thousands of incidents must not become thousands of series: the newest this many open
# incidents are listed one by one, the rest only counted. A table of a hundred rows is already more
# than an on-call reads; the incidents API lists them all.
MAX_OPEN_INCIDENTS = 100
RECENT_ACTIONS = 20


def target_text(target: Target) -> str:
    """The target as an on-call names it: namespace/pod, namespace/job, node/GPU UUID or node."""
    if target.kind == "pod":
        return f"{target.namespace}/{target.pod}"
    if target.kind == "job":
        return f"{target.namespace}/{target.training_job}"
    if target.kind == "gpu":
        return f"{target.node}/{target.uuid}" if target.node else target.uuid
    return target.node


def budgets_left(
    budgets: BudgetSettings,
    *,
    in_flight: int,
    last_minute: int,
    nodes_migrated: int,
    paged: int,
    paged_by_signature: dict[str, int],
    signatures: Iterable[str],
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """(global budgets left, pages left per signature) from the counts the safety gate reads."""
    pages_left = max(0, budgets.max_pages_per_window - paged)
    overall = (
        ("concurrent_actions", max(0, budgets.max_concurrent_actions - in_flight)),
        ("actions_per_minute", max(0, budgets.max_actions_per_minute - last_minute)),
        ("nodes_migrated", max(0, budgets.max_nodes_migrated - nodes_migrated)),
        ("pages_per_window", pages_left),
    )
    names = sorted(set(signatures) | set(paged_by_signature))
    per_signature = tuple(
        (name, min(pages_left, max(0, budgets.max_pages_per_signature - paged_by_signature.get(name, 0))))
        for name in names
    )
    return overall, per_signature


def _open_row(inc: Incident) -> OpenIncident:
    return OpenIncident(
        inc.id, inc.signature, inc.target.kind, target_text(inc.target), inc.state, inc.rung, inc.opened_at
    )


def _actions(entries: Sequence[LedgerEntry], incidents: dict[int, Incident]) -> tuple[RecentAction, ...]:
    out: dict[tuple[int, str, str], RecentAction] = {}
    for e in entries:  # newest first: a repeated (incident, rung, outcome) keeps its latest end
        inc = incidents.get(e.incident_id)
        if inc is None or (e.incident_id, e.rung, e.status) in out:
            continue
        ended = e.finished_at if e.finished_at is not None else e.at
        out[(e.incident_id, e.rung, e.status)] = RecentAction(
            inc.id, inc.signature, inc.target.kind, target_text(inc.target), e.rung, e.status, ended
        )
    return tuple(out.values())


def read_board(
    db: Ledger,
    safety: SafetyGate,
    signatures: Iterable[str],
    now: float,
    max_open_incidents: int = MAX_OPEN_INCIDENTS,
    recent_actions: int = RECENT_ACTIONS,
) -> BoardSnapshot:
    """The board as the ledger holds it at `now` (a handful of bounded queries, however many incidents)."""
    total = db.count_open()
    listed = db.newest_open_incidents(max_open_incidents)
    entries = db.recent_actions(recent_actions)
    incidents = {inc.id: inc for inc in listed}
    for e in entries:
        if e.incident_id not in incidents:
            found = db.incident(e.incident_id)
            if found is not None:
                incidents[found.id] = found
    b = safety.budgets
    since = now - b.page_window_seconds
    overall, per_signature = budgets_left(
        b,
        in_flight=safety.actions_in_flight(),
        last_minute=safety.actions_last_minute(now),
        nodes_migrated=len(db.migrated_nodes(now - b.migrate_window_seconds)),
        paged=db.paged_incidents_since(since),
        paged_by_signature=db.paged_incidents_by_signature_since(since),
        signatures=signatures,
    )
    return BoardSnapshot(
        open_incidents=tuple(_open_row(inc) for inc in listed),
        unlisted=max(0, total - len(listed)),
        actions=_actions(entries, incidents),
        budgets=overall,
        signature_pages=per_signature,
        ready=True,
    )
