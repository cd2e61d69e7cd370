"""Two controller replicas, one ledger, one leader Lease: the leader dies mid-ladder, the follower
finishes the incident without repeating the action and the deposed leader writes nothing more."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.kube.client import KubeClient, KubeClientSettings
from remediation.kube.leader import LeaderElectionSettings, LeaderElector
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent
from remediation.settings import EngineSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import GatedClock, StepClock, backend_settings

DURATION, RENEW, RETRY = 2, 1.2, 0.2
XID_RESET = {
    "alertname": "GPUXidResetRequired",
    "severity": "critical",
    "layer": "hardware",
    "fault_class": "xid_reset",
    "xid": "48",
    "target_kind": "gpu",
    "node": "gpu-1",
    "uuid": "GPU-bbbb",
    "gpu": "1",
}


@dataclass
class Replica:
    """One controller process: its own API connection, elector, backend and engine on the shared DB."""

    name: str
    client: KubeClient
    db_path: Path
    engine_clock: FakeClock
    backend_clock: StepClock
    pager: RecordingPager = field(default_factory=RecordingPager)
    engine: RemediationEngine | None = None
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.elector = LeaderElector(
            self.client,
            LeaderElectionSettings(
                namespace="gpupulse",
                identity=self.name,
                lease_duration_seconds=DURATION,
                renew_deadline_seconds=RENEW,
                retry_period_seconds=RETRY,
                release_on_cancel=False,  # a killed process says no goodbye
            ),
        )
        self.backend = KubernetesBackend(
            self.client,
            backend_settings(identity=self.name),
            self.backend_clock,
            may_act=lambda: self.elector.is_leader,
        )

    async def _lead(self) -> None:
        # build_engine recovers the shared ledger: what the old leader started is verified, not redone
        self.engine = cast(
            RemediationEngine,
            build_engine(
                EngineSettings(),
                self.db_path,
                RemediationMetrics(),
                clock=self.engine_clock,
                backend=self.backend,
                pager=self.pager,
            ),
        )
        self.leading.set()
        await asyncio.Event().wait()

    async def _stopped(self) -> None:
        self.leading.clear()

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self._lead, self._stopped))

    async def kill(self) -> None:
        """The elector dies; the engine and its in-flight action are left as they are (frozen process)."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def _event(clock: FakeClock) -> AlertEvent:
    now = clock.utcnow()
    return AlertEvent(
        fingerprint="fp-xid48",
        status="firing",
        labels=dict(XID_RESET),
        annotations={},
        starts_at=datetime.fromtimestamp(clock.time() - 60, tz=UTC),
        ends_at=None,
        generator_url="http://prometheus/graph",
        receiver="gpupulse",
        group_key="{}:{}",
        received_at=now,
    )


@pytest.fixture
async def clients(kube_api: FakeKubeAPI, tmp_path: Path) -> AsyncIterator[list[KubeClient]]:
    config = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    made = [await KubeClient.connect(KubeClientSettings(kubeconfig_path=str(config))) for _ in range(2)]
    yield made
    for c in made:
        await c.close()


async def test_leader_killed_mid_migrate_follower_finishes_without_repeating(
    kube_api: FakeKubeAPI, clients: list[KubeClient], tmp_path: Path
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_pod(
        "ml", "trainer-0", "gpu-1", owner=("StatefulSet", "trainer"), labels={"app": "t"}, gpus=8
    )
    pdb = kube_api.add_pdb("ml", "trainer-pdb", {"app": "t"}, disruptions_allowed=0)
    db = tmp_path / "ledger.db"
    engine_clock = FakeClock()
    a_clock = GatedClock()  # A's eviction backoff blocks until the test opens the gate
    a = Replica("replica-a", clients[0], db, engine_clock, a_clock)
    b = Replica("replica-b", clients[1], db, engine_clock, StepClock())
    a.start()
    await asyncio.wait_for(a.leading.wait(), 5)
    b.start()

    # A handles the alert: migrate starts, cordons, and is stuck in PDB backoff mid-ladder
    assert a.engine is not None
    await a.engine.handle(_event(engine_clock))
    await asyncio.wait_for(a_clock.waiting.wait(), 5)
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True
    node_patches = len(kube_api.calls("PATCH", "/nodes/"))
    evictions = len(kube_api.calls("POST", "/eviction"))
    assert not b.leading.is_set()

    killed_at = time.monotonic()
    await a.kill()
    await asyncio.wait_for(b.leading.wait(), DURATION + 2 * RETRY + 1.0)
    assert time.monotonic() - killed_at <= DURATION + 2 * RETRY + 0.5
    assert b.engine is not None
    # recorded by A and never confirmed: B takes it again (a migrate is idempotent) with its first
    # tick, once; A's frozen try still holds the node's Lease, so B's is refused before any write and
    # the migrate is verified instead, not repeated; the GPU needs a reset whatever the drain did, so
    # B pages
    await b.engine.tick()
    await b.engine.wait_idle()
    assert len(kube_api.calls("PATCH", "/nodes/")) == node_patches
    (incident,) = b.engine.list_incidents()
    full = b.engine.get_incident(int(incident["id"]))
    assert full is not None
    actions = [h for h in full["history"] if h["kind"] == "action"]
    assert (actions[0]["rung"], actions[0]["status"]) == ("migrate", "interrupted")
    assert "locked by replica-a/" in actions[0]["summary"]
    assert full["state"] == "paged"

    # the deposed leader's action wakes up (the budget now allows it) and must not write anything
    pdb["status"]["disruptionsAllowed"] = 1
    a_clock.gate.set()
    await asyncio.wait_for(a.engine.wait_idle(), 5)
    assert ("ml", "trainer-0") in kube_api.pods
    assert len(kube_api.calls("POST", "/eviction")) == evictions
    assert len(kube_api.calls("PATCH", "/nodes/")) == node_patches

    # B carries the incident on: the page for the GPU reset, never a second migrate
    await b.engine.tick()
    await b.engine.wait_idle()
    after = b.engine.get_incident(int(incident["id"]))
    assert after is not None and after["state"] == "paged"
    assert [h["rung"] for h in after["history"] if h["kind"] == "action"] == ["migrate", "page"]
    assert len(b.pager.firing) == 1
    assert "reset the GPU" in b.pager.firing[0].summary
    engine_clock.advance(601)
    await b.engine.tick()
    await b.engine.wait_idle()
    assert len(b.pager.firing) == 1
    assert len(kube_api.calls("POST", "/eviction")) == evictions
    assert (
        kube_api.leases[("gpupulse", "gpupulse-remediation-leader")]["spec"]["holderIdentity"] == "replica-b"
    )

    await b.kill()
    await b.engine.aclose()
    await a.engine.aclose()
