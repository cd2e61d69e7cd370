"""Cluster mode: a GPU's quarantine recorded by one leader counts for the next. The history rides the
switches (GpuRemediationState) on the in-process API server; the new leader's ledger is rebuilt from
the cluster alone, and the second quarantine of the GPU makes it a lemon that pages for RMA."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import cast

from remediation.engine import RemediationEngine, build_engine
from remediation.kube.client import KubeClient
from remediation.kube.incidents import IncidentStore, IncidentStoreSettings
from remediation.ledger import Ledger, connect
from remediation.metrics import RemediationMetrics
from remediation.replication import restore
from remediation.settings import EngineSettings, LemonSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.remediation.test_engine_support import SCOPE, XID_RESET, Rig, ScriptedBackend

NS = "gpupulse"
SETTINGS = EngineSettings(scope=SCOPE, lemons=LemonSettings(quarantines=2, window_seconds=7 * 86400))


async def _lead(
    client: KubeClient, local: Path, term: int, clock: FakeClock, pager: RecordingPager
) -> RemediationEngine:
    store = IncidentStore(
        client,
        IncidentStoreSettings(NS, f"replica-{term}", term=term, write_deadline_seconds=2.0),
        may_act=lambda: True,
        clock=clock,
    )
    ledger = Ledger(connect(local / "ledger.db"))
    restore(ledger, await store.load())
    ledger.conn.close()
    engine = build_engine(
        SETTINGS,
        local / "ledger.db",
        RemediationMetrics(),
        clock=clock,
        backend=ScriptedBackend(),
        pager=pager,
        mirror=store,
    )
    return cast(RemediationEngine, engine)


class _Events:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock


async def test_a_quarantine_before_a_leader_change_counts_toward_a_lemon_after_it(
    tmp_path: Path, kube_client: KubeClient, kube_api: FakeKubeAPI
) -> None:
    clock, pager = FakeClock(), RecordingPager()
    events = cast(Rig, _Events(clock))  # Rig.event reads only the clock
    labels = {**XID_RESET, "serial": "1652021001234"}
    first_local = tmp_path / "replica-0"
    engine = await _lead(kube_client, first_local, 0, clock, pager)
    first = Rig.event(events, labels)
    await engine.handle(first)
    await engine.wait_idle()
    await engine.handle(replace(first, status="resolved", received_at=clock.utcnow()))
    clock.advance(3 * 3600)
    await engine.tick()
    await engine.wait_idle()
    await engine.aclose(grace_seconds=0)
    shutil.rmtree(first_local)  # the leader's node is gone, its ledger with it
    engine = await _lead(kube_client, tmp_path / "replica-1", 1, clock, pager)
    try:
        assert not [p for p in pager.pages if "needs RMA" in p.summary]
        await engine.handle(Rig.event(events, labels))
        await engine.wait_idle()
    finally:
        await engine.aclose(grace_seconds=0)
    (rma,) = [p for p in pager.pages if "needs RMA" in p.summary]
    assert "GPU GPU-bbbb (serial 1652021001234) on node node-b quarantined 2 times" in rma.summary
