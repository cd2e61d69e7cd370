"""The budgets and the breaker of remediation/safety.py, asked directly over a real ledger.

test_safety.py drives the same rules through the engine; here each budget is checked at its edge,
with the reason the breaker records (an operator reads it in the API and the grouped page).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from remediation.ledger import Ledger, connect
from remediation.model import Target
from remediation.safety import SafetyGate
from remediation.settings import BudgetSettings

NOW = 1_780_000_000.0
GPU = Target("gpu", "n1", uuid="GPU-1")
POD = Target("pod", "n1", "llm", "vllm-0")


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    conn = connect(tmp_path / "ledger.db")
    yield Ledger(conn)
    conn.close()


def _gate(ledger: Ledger, cluster_node_count: int = 0, **budgets: Any) -> SafetyGate:
    """A gate with the fraction budget off unless asked for."""
    settings = BudgetSettings(**{"max_nodes_migrated_fraction": 0.0, **budgets})
    return SafetyGate(ledger, settings, cluster_node_count)


def _action(ledger: Ledger, rung: str, at: float, status: str = "success", target: Target = POD) -> None:
    with ledger.transaction():
        ledger.add_entry(1, at, "action", status, rung, rung=rung, target_kind=target.kind, node=target.node)


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_concurrent_actions_may_reach_the_limit_and_not_pass_it(ledger: Ledger, limit: int) -> None:
    gate = _gate(ledger, max_concurrent_actions=limit, max_actions_per_minute=100)
    for i in range(limit - 1):
        _action(ledger, "restart", NOW - 7200 - i, status="started")  # old but still running
    _action(ledger, "restart", NOW - 5, status="success")  # finished: no longer concurrent
    assert gate.check("restart", POD, NOW).exceeded == ""
    _action(ledger, "migrate", NOW - 1, status="started")
    assert gate.check("restart", POD, NOW).exceeded == f"concurrent actions {limit + 1} > {limit}"


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_actions_per_minute_may_reach_the_limit_and_not_pass_it(ledger: Ledger, limit: int) -> None:
    gate = _gate(ledger, max_actions_per_minute=limit, max_concurrent_actions=100)
    for i in range(limit - 1):
        _action(ledger, "restart", NOW - i, status=("success", "failed", "temporary", "interrupted")[i % 4])
    _action(ledger, "restart", NOW - 60.001)  # just over a minute old: forgotten
    assert gate.check("restart", POD, NOW).exceeded == ""
    _action(ledger, "migrate", NOW - 60.0)  # exactly a minute old: still counts
    assert gate.check("restart", POD, NOW).exceeded == f"actions in the last minute {limit + 1} > {limit}"


def test_only_migrations_of_gpu_and_node_targets_count_against_the_nodes_budget(ledger: Ledger) -> None:
    gate = _gate(ledger, max_nodes_migrated=1)
    _action(ledger, "migrate", NOW - 10, target=Target("node", "n0"))
    assert gate.check("restart", GPU, NOW).exceeded == ""  # a restart moves nothing off a node
    assert gate.check("migrate", POD, NOW).exceeded == ""  # a pod is rescheduled, its node stays
    assert gate.check("migrate", Target("gpu", ""), NOW).exceeded == ""  # no node to count
    assert gate.check("migrate", Target("node", "n0"), NOW).exceeded == ""  # the same node again
    assert gate.check("migrate", GPU, NOW).exceeded == "nodes migrated within 3600 s: 2 > 1"


@pytest.mark.parametrize(("age", "counted"), [(3600.0, True), (3600.001, False)])
def test_the_nodes_budget_forgets_migrations_older_than_its_window(
    ledger: Ledger, age: float, counted: bool
) -> None:
    gate = _gate(ledger, max_nodes_migrated=1, migrate_window_seconds=3600)
    _action(ledger, "migrate", NOW - age, target=Target("gpu", "n0", uuid="GPU-0"))
    assert bool(gate.check("migrate", GPU, NOW).exceeded) is counted


def test_a_node_already_migrated_still_counts_when_the_budget_is_overspent(ledger: Ledger) -> None:
    # two nodes moved under an earlier, larger budget: with the limit now 1 even n1 may not move again
    gate = _gate(ledger, max_nodes_migrated=1)
    for node in ("n1", "n2"):
        _action(ledger, "migrate", NOW - 10, target=Target("node", node))
    assert gate.check("migrate", GPU, NOW).exceeded == "nodes migrated within 3600 s: 2 > 1"


@pytest.mark.parametrize(
    ("fraction", "known", "allowed"), [(0.2, 3, 1), (0.2, 10, 2), (0.5, 9, 4), (1.0, 2, 2)]
)
def test_the_fraction_budget_allows_at_least_one_node(
    ledger: Ledger, fraction: float, known: int, allowed: int
) -> None:
    gate = _gate(ledger, known, max_nodes_migrated=100, max_nodes_migrated_fraction=fraction)
    for i in range(allowed - 1):
        _action(ledger, "migrate", NOW - 10, target=Target("node", f"m{i}"))
    assert gate.check("migrate", GPU, NOW).exceeded == ""
    _action(ledger, "migrate", NOW - 10, target=Target("node", "last"))
    assert gate.check("migrate", GPU, NOW).exceeded == (
        f"nodes migrated {allowed + 1} of {known} known > fraction {fraction} (allowed {allowed})"
    )


def test_without_a_cluster_size_the_fraction_counts_the_nodes_seen_in_alerts(ledger: Ledger) -> None:
    gate = _gate(ledger, 0, max_nodes_migrated=100, max_nodes_migrated_fraction=0.5)
    assert gate.check("migrate", GPU, NOW).exceeded == ""  # no node known: the fraction cannot apply
    _action(ledger, "migrate", NOW - 10, target=Target("node", "n0"))
    with ledger.transaction():
        for i in range(4):
            ledger.see_node(f"n{i}", NOW)
    assert gate.check("migrate", GPU, NOW).exceeded == ""  # 2 of 4
    _action(ledger, "migrate", NOW - 10, target=Target("node", "n2"))
    assert "nodes migrated 3 of 4 known" in gate.check("migrate", GPU, NOW).exceeded


def test_the_breaker_opens_once_per_burst_and_remembers_who_closed_it(ledger: Ledger) -> None:
    gate = _gate(ledger)
    assert not gate.breaker_open()
    with ledger.transaction():
        group = gate.open_breaker("concurrent actions 5 > 4", NOW + 0.9)
        assert gate.open_breaker("another budget", NOW + 30) == group == f"breaker-{int(NOW)}"
    assert gate.breaker_open()
    assert gate.breaker()["reason"] == "concurrent actions 5 > 4"
    assert gate.breaker()["opened_at"] == NOW + 0.9
    with ledger.transaction():
        gate.close_breaker("alice", NOW + 60)
    assert not gate.breaker_open()
    assert gate.breaker() == {
        "open": False,
        "closed_at": NOW + 60,
        "closed_by": "alice",
        "last_reason": "concurrent actions 5 > 4",
    }
