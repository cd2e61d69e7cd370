"""Cluster mode under a network partition between the leader and the API server (a cuttable TCP
proxy in front of the in-process API server, the real client and elector on top): the old leader
stops acting before the new one starts (the fencing rule), and an alert neither lost nor acted on twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from remediation.engine import RemediationEngine, build_engine
from remediation.errors import ReplicationLost
from remediation.kube.client import KubeClient, KubeClientSettings
from remediation.kube.incidents import IncidentStore, IncidentStoreSettings
from remediation.kube.leader import LeaderElectionSettings, LeaderElector
from remediation.ledger import Ledger, connect
from remediation.metrics import RemediationMetrics
from remediation.replication import restore
from remediation.settings import EngineSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.fakes.tcp_proxy import CuttableProxy
from tests.remediation.test_engine_support import LEAK, SCOPE, Rig, ScriptedBackend

DURATION, RENEW, RETRY = 2, 1.2, 0.2
NS = "gpupulse"


def _kubeconfig(path: Path, url: str, token: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@dataclass
class Replica:
    """One controller: elector, write-through store and engine on its own local ledger."""

    name: str
    client: KubeClient
    local: Path
    clock: FakeClock
    backend: ScriptedBackend = field(default_factory=ScriptedBackend)
    engine: RemediationEngine | None = None
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    stopped_at: float = 0.0
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.elector = LeaderElector(
            self.client,
            LeaderElectionSettings(
                namespace=NS,
                identity=self.name,
                lease_duration_seconds=DURATION,
                renew_deadline_seconds=RENEW,
                retry_period_seconds=RETRY,
                release_on_cancel=False,
            ),
        )

    async def _lead(self) -> None:
        store = IncidentStore(
            self.client,
            IncidentStoreSettings(NS, self.name, term=self.elector.term, write_deadline_seconds=RENEW),
            may_act=lambda: self.elector.is_leader,
        )
        snapshot = await store.load()
        db = self.local / "ledger.db"
        ledger = Ledger(connect(db))
        restore(ledger, snapshot)
        ledger.conn.close()
        self.engine = cast(
            RemediationEngine,
            build_engine(
                EngineSettings(scope=SCOPE),
                db,
                RemediationMetrics(),
                clock=self.clock,
                backend=self.backend,
                pager=RecordingPager(),
                mirror=store,
            ),
        )
        self.started_at = time.monotonic()
        self.leading.set()
        await asyncio.Event().wait()  # lead until the elector cancels us; the engine is left as it is

    async def _stopped(self) -> None:
        self.stopped_at = time.monotonic()
        self.leading.clear()

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self._lead, self._stopped))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.engine is not None:
            with contextlib.suppress(Exception):
                await self.engine.aclose(grace_seconds=0)


@pytest.fixture
async def proxy(kube_api: FakeKubeAPI) -> AsyncIterator[CuttableProxy]:
    p = CuttableProxy(kube_api.url)
    await p.start()
    yield p
    await p.stop()


async def test_partitioned_leader_stops_before_the_new_one_starts_and_nothing_is_done_twice(
    kube_api: FakeKubeAPI, proxy: CuttableProxy, tmp_path: Path
) -> None:
    settings = dict(request_timeout_seconds=1.0)
    client_a = await KubeClient.connect(
        KubeClientSettings(str(_kubeconfig(tmp_path / "kc-a", proxy.url, kube_api.token)), **settings)
    )
    client_b = await KubeClient.connect(
        KubeClientSettings(str(_kubeconfig(tmp_path / "kc-b", kube_api.url, kube_api.token)), **settings)
    )
    clock = FakeClock()
    a = Replica("replica-a", client_a, tmp_path / "a", clock)
    b = Replica("replica-b", client_b, tmp_path / "b", clock)
    rig = cast(Rig, a)  # Rig.event only reads .clock
    try:
        a.start()
        await asyncio.wait_for(a.leading.wait(), 10)
        b.start()
        first = Rig.event(rig, LEAK)
        assert a.engine is not None
        await a.engine.handle(first)
        await a.engine.wait_idle()
        assert a.backend.rungs == ["restart"]

        proxy.cut()
        cut_at = time.monotonic()
        second = Rig.event(rig, {**LEAK, "pod": "vllm-second"})
        with pytest.raises(ReplicationLost):  # its intent cannot reach the cluster: no effect, no ack
            await a.engine.handle(second)
        await asyncio.wait_for(b.leading.wait(), DURATION * 4)
        assert a.stopped_at, "the partitioned leader never stopped leading"
        # the fencing rule: the old leader stopped within its renew deadline, before the new one started
        assert a.stopped_at < b.started_at
        assert a.stopped_at - cut_at <= RENEW + RETRY + 0.5
        assert b.started_at - cut_at >= DURATION - RETRY

        assert b.engine is not None
        for event in (first, second):  # the survivor's own inbox holds both alerts (fan-out)
            await b.engine.handle(event)
        await b.engine.wait_idle()
        assert a.backend.rungs == ["restart"]  # nothing more from the old leader
        assert (
            b.backend.calls == [("restart", b.backend.calls[0][1])]
            and b.backend.calls[0][1].pod == "vllm-second"
        )

        proxy.heal()  # the old leader comes back: it campaigns, sees the new holder, stays a follower
        await asyncio.sleep(DURATION)
        assert not a.elector.is_leader and not a.leading.is_set()
        assert len(a.backend.calls) == 1
    finally:
        await a.stop()
        await b.stop()
        await client_a.close()
        await client_b.close()
