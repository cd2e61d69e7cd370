"""Small storm proof: many nodes fire XID 79 at once; the node budget holds, the drained nodes page for
their reboot and the rest page as one group."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.proofs import storm

pytestmark = pytest.mark.integration


def test_xid79_storm_stays_within_the_node_budget_and_pages_once_as_a_group(tmp_path: Path) -> None:
    res = storm.run(nodes=500, firing_count=60, seconds=3.0, seed=3, workdir=tmp_path, wait_full_group=False)
    assert res.acked == 60 and res.incidents == 60
    assert 0 < len(res.nodes_patched) <= 3
    assert res.migrate_actions <= 3
    keys = {p["dedup_key"] for p in res.pages}
    group = {k for k in keys if k.startswith("gpupulse-breaker")}
    assert len(group) == 1
    # a drained node still needs its reboot: it pages alone, or in the group once the breaker opened
    alone = keys - group
    assert len(alone) <= len(res.nodes_patched)
    assert all(k.startswith("gpupulse-incident-") for k in alone)
    assert res.grouped == 60 - len(alone)
    assert res.rss_peak - res.rss_before < 200 * storm.MIB
