"""Small failover proof: two `serve` replicas, the leader SIGKILLed mid-drain, the follower finishes alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.proofs import failover

pytestmark = pytest.mark.integration


def test_follower_takes_over_within_the_lease_and_repeats_no_action(tmp_path: Path) -> None:
    res = failover.run(tmp_path, lease=3, renew=2.0, retry=0.5, verify=2)
    assert res.writes_before.count("PATCH /api/v1/nodes/gpu-1") == 1
    assert res.evictions_refused >= 1 and res.pod_still_there
    assert 0 < res.takeover_seconds <= 3 + 1.0
    assert (res.holder, res.transitions) == ("replica-b", 1)
    assert res.writes_after == []
    assert res.migrate_rows == ["interrupted"]
    assert len(res.pages) == 1
    assert all(ok is not False for _, _, ok in res.checks())
