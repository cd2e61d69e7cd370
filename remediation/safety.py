"""Safety rails: scope (namespaces, node selector, opt-in label), budgets and the breaker.

The breaker opens when an action would exceed a budget; from then on every incident pages as part
of one grouped page per burst, and only a human closes it (`reset_breaker`). Its state lives in the
ledger database, so a restart does not close it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from remediation.ledger import ACTION_RUNGS, REAL_ACTION_STATUSES, Ledger
from remediation.model import Target
from remediation.selector import parse_selector
from remediation.settings import BudgetSettings, ScopeSettings

BREAKER = "breaker"
PAUSE = "paused"
# why nothing touches a node with --scope.nodes=false (GPU and node targets, the migrate rung)
NODES_OFF = "node actions are off (--scope.nodes=false): nothing cordons a node or evicts its pods"
_EMPTY_SCOPE = (
    "the namespace scope is empty, which allows no workload (--scope.namespaces='*' allows every namespace)"
)


def in_scope(
    settings: ScopeSettings,
    target: Target,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    node_labels: Mapping[str, str] | None = None,
) -> str:
    """Empty string when the target may be acted on, else why not.

    node_labels are the labels of the target's Node (None when unknown); they are consulted only when
    a node selector is set and the target is a GPU or a node.
    """
    workload = target.kind in ("pod", "job")
    namespace = target.namespace or labels.get("namespace", "")
    if not workload and namespace in settings.routing_namespaces:
        namespace = ""  # stamped for routing (docs/helm.md), it names no workload
    # what the namespace scope means lives in ScopeSettings: empty = none, "*" = every namespace
    if namespace and not settings.allows_namespace(namespace):
        if not settings.namespaces:
            return f"namespace {namespace!r}: {_EMPTY_SCOPE}"
        return f"namespace {namespace!r} is not in the allowlist {list(settings.namespaces)}"
    if workload and not target.namespace and not settings.every_namespace:
        if not settings.namespaces:
            return f"{target.kind} target: {_EMPTY_SCOPE}"
        return f"{target.kind} target without a namespace while a namespace allowlist is configured"
    if not settings.nodes and target.kind in ("gpu", "node"):
        return f"{target.kind} target: {NODES_OFF}"
    # a job target names a node only when a migrate would cordon it
    if settings.node_selector and (target.kind in ("gpu", "node") or (target.kind == "job" and target.node)):
        if not target.node:
            return f"{target.kind} target without a node while a node selector is configured"
        if node_labels is None:
            return f"node {target.node!r} is unknown: node selector {settings.node_selector!r} cannot hold"
        if not parse_selector(settings.node_selector).matches(node_labels):
            return f"node {target.node!r} does not match the node selector {settings.node_selector!r}"
    if settings.opt_in_label:
        value = labels.get(settings.opt_in_label, annotations.get(settings.opt_in_label, ""))
        if value.lower() != "true":
            return f'target has not opted in ({settings.opt_in_label}="true" missing)'
    return ""


@dataclass(frozen=True)
class BudgetCheck:
    """Result of checking one planned action against the budgets."""

    exceeded: str = ""  # empty = within budget


class SafetyGate:
    """Budgets and breaker state over one Ledger."""

    def __init__(self, ledger: Ledger, budgets: BudgetSettings, cluster_node_count: int) -> None:
        self.ledger = ledger
        self.budgets = budgets
        self.cluster_node_count = cluster_node_count

    def breaker(self) -> dict[str, object]:
        return self.ledger.get_state(BREAKER)

    def breaker_open(self) -> bool:
        return bool(self.breaker().get("open"))

    def paused(self) -> bool:
        return bool(self.ledger.get_state(PAUSE).get("paused"))

    def paused_since(self) -> float:
        """When the current pause began; 0.0 while not paused."""
        state = self.ledger.get_state(PAUSE)
        return float(state.get("at") or 0.0) if state.get("paused") else 0.0

    def actions_in_flight(self) -> int:
        """Restart/migrate actions started and not yet finished (the concurrency budget's count)."""
        return self.ledger.count_actions(ACTION_RUNGS, 0.0, statuses=("started",))

    def actions_last_minute(self, now: float) -> int:
        """Restart/migrate actions started in the 60 s before `now` (the per-minute budget's count)."""
        # refused attempts (the server changed nothing) are not actions: REAL_ACTION_STATUSES leaves them out
        return self.ledger.count_actions(ACTION_RUNGS, now - 60.0, statuses=REAL_ACTION_STATUSES)

    def check(self, rung: str, target: Target, now: float) -> BudgetCheck:
        """Would starting this action exceed a budget? (call inside the deciding transaction)"""
        b = self.budgets
        running = self.actions_in_flight()
        if running + 1 > b.max_concurrent_actions:
            return BudgetCheck(f"concurrent actions {running + 1} > {b.max_concurrent_actions}")
        recent = self.actions_last_minute(now)
        if recent + 1 > b.max_actions_per_minute:
            return BudgetCheck(f"actions in the last minute {recent + 1} > {b.max_actions_per_minute}")
        # a job's migrate cordons its suspect node: it counts against the node budgets like any other
        if rung == "migrate" and target.kind in ("gpu", "node", "job") and target.node:
            nodes = self.ledger.migrated_nodes(now - b.migrate_window_seconds) | {target.node}
            if len(nodes) > b.max_nodes_migrated:
                return BudgetCheck(
                    f"nodes migrated within {b.migrate_window_seconds:.0f} s: "
                    f"{len(nodes)} > {b.max_nodes_migrated}"
                )
            known = self.cluster_node_count or self.ledger.known_nodes()
            if b.max_nodes_migrated_fraction > 0 and known:
                # at least one node may always move, or a small cluster could never migrate at all
                allowed = max(1, math.floor(b.max_nodes_migrated_fraction * known))
                if len(nodes) > allowed:
                    return BudgetCheck(
                        f"nodes migrated {len(nodes)} of {known} known > fraction "
                        f"{b.max_nodes_migrated_fraction} (allowed {allowed})"
                    )
        return BudgetCheck()

    def open_breaker(self, reason: str, now: float) -> str:
        """Open the breaker (idempotent); returns the group id pages of this burst share."""
        state = self.breaker()
        if state.get("open"):
            return str(state.get("group", ""))
        group = f"breaker-{int(now)}"
        self.ledger.set_state(
            BREAKER,
            {"open": True, "opened_at": now, "reason": reason, "group": group, "last_group_page_at": 0.0},
        )
        return group

    def close_breaker(self, by: str, now: float) -> None:
        state = self.breaker()
        self.ledger.set_state(
            BREAKER,
            {"open": False, "closed_at": now, "closed_by": by, "last_reason": state.get("reason", "")},
        )
