"""Small crash proof: SIGKILL `serve` while alerts stream in; nothing acknowledged is lost or repeated."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.proofs import crash

pytestmark = pytest.mark.integration


def test_sigkills_during_a_stream_lose_nothing_and_repeat_no_restart(tmp_path: Path) -> None:
    res = crash.run(alerts=400, kills=3, seed=7, workdir=tmp_path, concurrency=4)
    assert len(res.kills) == 3
    assert res.acked == 400
    assert (res.inbox_rows, res.inbox_duplicates, res.inbox_unprocessed) == (400, 0, 0)
    assert res.handled_keys == 400 and res.incidents == 400
    # every restart command that ran is one the ledger recorded, and no pod was restarted twice
    assert res.repeated_targets == 0 and res.untracked_actions == 0
    assert sum(res.ledger_actions.values()) == 400
    assert res.action_lines <= 400
    assert all(ok is not False for _, _, ok in res.checks())


def test_sigkills_with_the_kubernetes_backend_delete_no_pod_twice(tmp_path: Path) -> None:
    res = crash.run(alerts=300, kills=2, seed=5, workdir=tmp_path, concurrency=4, backend="kubernetes")
    assert res.acked == 300 and res.inbox_unprocessed == 0 and res.handled_keys == 300
    # one DELETE (with the UID precondition) at most per pod; a restart a kill left unconfirmed is taken
    # again by the next start, which reads its pod once more and deletes it only while its UID holds
    assert res.repeated_targets == 0 and res.pod_reads_max <= 2
    assert 0 < res.action_lines <= 300 and res.untracked_actions == 0
    assert all(ok is not False for _, _, ok in res.checks())
