"""Small cluster-mode proofs (bench/proofs/ha.py): the leader's node lost (SIGKILL, storage deleted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.proofs import ha

pytestmark = pytest.mark.integration


def test_node_lost_during_an_action_the_new_leader_verifies_and_repeats_nothing(tmp_path: Path) -> None:
    res = ha.run("action", tmp_path, lease=3, renew=2.0, retry=0.5)
    assert res.action_writes_before.count("PATCH /api/v1/nodes/gpu-1") == 1
    assert res.action_writes_after == []
    assert res.migrate_statuses == ["interrupted"]
    assert res.pages == 1
    assert 0 < res.takeover_seconds <= 3 + 2 * 0.5
    assert all(ok is not False for _, _, ok in res.checks())


def test_node_lost_during_an_alert_stream_loses_no_accepted_alert(tmp_path: Path) -> None:
    res = ha.run("stream", tmp_path, lease=3, renew=2.0, retry=0.5, alerts=400, batch=20)
    assert res.accepted == res.sent == 400
    assert res.lost == [] and res.duplicated == []
    assert res.incidents == 400
    assert all(ok is not False for _, _, ok in res.checks())


def test_without_the_fan_out_a_lost_leader_loses_alerts(tmp_path: Path) -> None:
    """The proof can fail: alerts sent only to the leader die with its node's storage."""
    res = ha.run("stream", tmp_path, lease=3, renew=2.0, retry=0.5, alerts=400, batch=20, fan_out=False)
    assert res.lost
