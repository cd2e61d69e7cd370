"""minHealthy per pool (remediation/capacity.py): a migrate that would take more of a pool out than its
unavailable budget allows is refused and pages instead of acting."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.capacity import WOULD_EXCEED, pool_refusal
from remediation.settings import BudgetSettings, EngineSettings, PoolSettings
from tests.remediation.test_engine_support import XID_RESET, Rig, ScriptedBackend, engine_settings, statuses

TEN_NODES = [f"n{i}" for i in range(10)]


@pytest.mark.parametrize(
    ("max_unavailable", "total", "allowed"),
    [
        ("10%", 10, 1),
        ("10%", 19, 1),
        ("10%", 20, 2),
        ("10%", 9, 0),
        ("25%", 8, 2),
        ("3", 10, 3),
        ("", 10, None),
    ],
)
def test_the_share_rounds_down(max_unavailable: str, total: int, allowed: int | None) -> None:
    assert PoolSettings(max_unavailable=max_unavailable).allowed_out(total) == allowed


@pytest.mark.parametrize("bad", ["ten", "110%", "-1", "5%%"])
def test_a_budget_that_cannot_be_read_is_refused_at_start(bad: str) -> None:
    with pytest.raises(ValueError, match=r"pools\.max_unavailable"):
        EngineSettings(pools=PoolSettings(max_unavailable=bad)).validate()


def test_ten_nodes_at_ten_percent_let_one_out_and_refuse_the_second() -> None:
    pools = PoolSettings(max_unavailable="10%")
    assert pool_refusal(pools, "a100", 10, set(), "n0") == ""
    why = pool_refusal(pools, "a100", 10, {"n0"}, "n1")
    assert why.startswith(f"migrate of n1 {WOULD_EXCEED}: pool 'a100' has 10 nodes, 1 out already (n0)")
    assert "at most 1 may be out at once (max_unavailable 10%)" in why
    # a node already out costs nothing more: its second fault may still be acted on
    assert pool_refusal(pools, "a100", 10, {"n0"}, "n0") == ""


async def test_engine_refuses_the_second_migrate_of_a_ten_node_pool_and_pages(tmp_path: Path) -> None:
    settings = engine_settings(
        pools=PoolSettings(max_unavailable="10%"),
        cluster_node_count=10,
        budgets=BudgetSettings(max_nodes_migrated=100, max_nodes_migrated_fraction=0),
    )
    rig = Rig(tmp_path, settings)
    rig.build()
    try:
        await rig.fire({**XID_RESET, "node": "n0", "uuid": "GPU-n0"})
        await rig.fire({**XID_RESET, "node": "n1", "uuid": "GPU-n1"})
        assert [t.node for _, t in rig.backend.calls] == ["n0"]
        second = next(i for i in rig.incidents() if i["target"]["node"] == "n1")
        inc = rig.engine.get_incident(int(second["id"]))
        assert inc is not None
        assert ("migrate", "refused") in statuses(inc)
        assert inc["state"] == "paged"
        (page,) = [p for p in rig.pager.pages if p.target.node == "n1"]
        assert WOULD_EXCEED in page.summary
        assert not rig.engine.stats()["breaker"].get("open")  # a refusal, not a tripped breaker
    finally:
        await rig.engine.aclose()


class KubernetesNamed(ScriptedBackend):
    name = "kubernetes"  # the backend that counts the cluster's cordons itself, when it is called


@pytest.mark.parametrize("backend", [ScriptedBackend, KubernetesNamed])
async def test_dry_run_counts_what_it_would_have_done(tmp_path: Path, backend: type[ScriptedBackend]) -> None:
    settings = engine_settings(
        dry_run=True,
        pools=PoolSettings(max_unavailable="1"),
        cluster_node_count=10,
        budgets=BudgetSettings(max_nodes_migrated=100, max_nodes_migrated_fraction=0),
    )
    rig = Rig(tmp_path, settings, backend=backend())
    rig.build()
    try:
        await rig.fire({**XID_RESET, "node": "n0", "uuid": "GPU-n0"})
        await rig.fire({**XID_RESET, "node": "n1", "uuid": "GPU-n1"})
        by_node = {i["target"]["node"]: rig.engine.get_incident(int(i["id"])) for i in rig.incidents()}
        assert ("migrate", "dry_run") in statuses(by_node["n0"] or {})
        assert ("migrate", "refused") in statuses(by_node["n1"] or {})
        assert rig.backend.calls == [] and rig.pager.pages == []
    finally:
        await rig.engine.aclose()
