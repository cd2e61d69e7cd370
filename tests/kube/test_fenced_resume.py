"""An action a lapsed Lease fenced, or a lost leader left unconfirmed, is taken again by the next leader
where that is safe (issue 36, finding 4), on the fake API server with the real Kubernetes backend:
a pod restart records its pods' UIDs before the first delete, and taken again deletes only those UIDs,
or nothing; one ledger entry, so loops and budgets count it once. A Deployment rollout is not taken
again: it is verified, as before."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.kube.client import KubeClient
from remediation.kube.incidents import GROUP, INCIDENTS, VERSION, IncidentStore, IncidentStoreSettings
from remediation.ledger import Ledger, connect
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent
from remediation.replication import restore
from remediation.settings import EngineSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings
from tests.remediation.test_engine_support import LEAK, SCOPE, Rig, events, statuses

NS = "gpupulse"
GV = f"{GROUP}/{VERSION}"
POD = ("llm", LEAK["pod"])
KEY = f"{POD[0]}/{POD[1]}"


@dataclass
class Replicas:
    """Leaders in turn, each with a fresh local ledger rebuilt from the API server, the real backend."""

    tmp_path: Path
    client: KubeClient
    api: FakeKubeAPI
    backend_overrides: dict[str, Any] = field(default_factory=dict)
    clock: FakeClock = field(default_factory=FakeClock)
    pager: RecordingPager = field(default_factory=RecordingPager)
    leading: bool = True
    term: int = 0
    engine: RemediationEngine = field(init=False)
    store: IncidentStore = field(init=False)
    backend: KubernetesBackend = field(init=False)

    @property
    def local(self) -> Path:
        return self.tmp_path / f"replica-{self.term}"

    async def lead(self) -> None:
        self.leading = True
        self.store = IncidentStore(
            self.client,
            IncidentStoreSettings(NS, f"replica-{self.term}", term=self.term, write_deadline_seconds=2.0),
            may_act=lambda: self.leading,
            clock=self.clock,
        )
        db = self.local / "ledger.db"
        ledger = Ledger(connect(db))
        restore(ledger, await self.store.load())
        ledger.conn.close()
        self.backend = KubernetesBackend(
            self.client,
            backend_settings(identity=f"replica-{self.term}", **self.backend_overrides),
            StepClock(),
            may_act=lambda: self.leading,
        )
        self.engine = cast(
            RemediationEngine,
            build_engine(
                EngineSettings(scope=SCOPE),
                db,
                RemediationMetrics(),
                clock=self.clock,
                backend=self.backend,
                pager=self.pager,
                mirror=self.store,
            ),
        )

    async def next_leader(self) -> None:
        """The leader is gone (its work abandoned, its storage deleted); the next replica leads."""
        await self.engine.aclose(grace_seconds=0)
        shutil.rmtree(self.local)
        self.term += 1
        await self.lead()

    def event(self) -> AlertEvent:
        return Rig.event(cast(Rig, self), LEAK)

    def incident(self) -> dict[str, Any]:
        (obj,) = [o for (g, p, ns, _), o in self.api.objects.items() if (g, p, ns) == (GV, INCIDENTS, NS)]
        return cast(dict[str, Any], obj)

    def history(self) -> dict[str, Any]:
        (inc,) = self.engine.list_incidents()
        full = self.engine.get_incident(int(inc["id"]))
        assert full is not None
        return dict(full)

    def fence_after_next_write(self) -> None:
        """The Lease lapses while the next write-through is on its way: it lands, nothing after it runs
        (etcd down past the renew deadline, the "started" write answered once it is back)."""
        write = self.store.write

        async def write_then_lapse(snapshot: Any, defer: bool = False) -> None:
            await write(snapshot, defer)
            self.leading = False

        self.store.write = write_then_lapse  # type: ignore[method-assign]


@pytest.fixture
async def replicas(tmp_path: Path, kube_client: KubeClient, kube_api: FakeKubeAPI) -> AsyncIterator[Replicas]:
    kube_api.add_node(LEAK["node"])
    r = Replicas(tmp_path, kube_client, kube_api)
    yield r
    await r.engine.aclose(grace_seconds=0)


def _uid(api: FakeKubeAPI) -> str:
    return str(api.pods[POD]["metadata"]["uid"])


def _deletes(api: FakeKubeAPI) -> list[Any]:
    return [c.body for c in api.calls("DELETE", f"/namespaces/{POD[0]}/pods/{POD[1]}$")]


async def test_a_restart_fenced_before_it_ran_is_taken_by_the_next_leader_once(replicas: Replicas) -> None:
    api = replicas.api
    api.add_pod(*POD, LEAK["node"], owner=("ReplicaSet", "vllm-7d9f8b6c5d"), gpus=1)
    uid = _uid(api)
    await replicas.lead()
    replicas.fence_after_next_write()
    await replicas.engine.handle(replicas.event())
    await replicas.engine.wait_idle()
    assert _deletes(api) == []  # fenced: recorded as started, never run
    started = [e for e in replicas.incident()["status"]["entries"] if e["kind"] == "action"]
    assert [(e["rung"], e["status"]) for e in started] == [("restart", "started")]

    await replicas.next_leader()
    await replicas.engine.tick()
    await replicas.engine.wait_idle()
    # taken again, on the pod as it was: one delete, preconditioned on its UID
    assert api.deleted == [(KEY, uid, "delete")]
    (body,) = _deletes(api)
    assert body["preconditions"]["uid"] == uid
    full = replicas.history()
    # the same action, once: one entry, done, the incident verifying it (not escalated to migrate)
    assert statuses(full) == [("restart", "success")]
    assert "resumed" in events(full) and "escalated" not in events(full)
    assert full["state"] == "verifying"
    assert replicas.engine._db.count_loop_actions(full["loop_key"], "restart", 0.0) == 1


async def test_a_restart_that_deleted_before_its_leader_was_lost_deletes_nothing_again(
    replicas: Replicas,
) -> None:
    """A StatefulSet's replacement has the same name and a new UID: taken again by name it would be
    deleted; by the UID recorded before the first delete it is not."""
    api = replicas.api
    api.add_pod(*POD, LEAK["node"], owner=("StatefulSet", "vllm"), gpus=1)
    first_uid = _uid(api)
    await replicas.lead()
    delete_pod = replicas.client.delete_pod
    recorded: list[Any] = []

    async def delete_then_lost(*args: Any, **kw: Any) -> None:
        (entry,) = [e for e in replicas.incident()["status"]["entries"] if e["kind"] == "action"]
        recorded.append(json.loads(entry["details"])["prepared"])
        await delete_pod(*args, **kw)
        replicas.leading = False  # its outcome never reaches the cluster
        api.add_pod(*POD, LEAK["node"], owner=("StatefulSet", "vllm"), gpus=1)  # the replacement

    replicas.client.delete_pod = delete_then_lost  # type: ignore[method-assign]
    await replicas.engine.handle(replicas.event())
    await replicas.engine.wait_idle()
    replicas.client.delete_pod = delete_pod  # type: ignore[method-assign]
    # the UID was in the cluster before the delete went out
    assert recorded == [
        {"node": LEAK["node"], "pods": [{"namespace": POD[0], "name": POD[1], "uid": first_uid}]}
    ]
    replacement = _uid(api)
    assert replacement != first_uid

    await replicas.next_leader()
    await replicas.engine.tick()
    await replicas.engine.wait_idle()
    assert api.deleted == [(KEY, first_uid, "delete")]
    assert _uid(api) == replacement
    full = replicas.history()
    assert statuses(full) == [("restart", "success")]
    (action,) = [h for h in full["history"] if h["kind"] == "action"]
    assert "already replaced" in action["summary"]
    assert full["state"] == "verifying"


async def test_a_fenced_deployment_rollout_is_verified_not_taken_again(replicas: Replicas) -> None:
    replicas.backend_overrides["deployment_restart"] = "rollout_restart"
    api = replicas.api
    api.add_pod(*POD, LEAK["node"], owner=("ReplicaSet", "vllm-7d9f8b6c5d"), gpus=1)
    await replicas.lead()
    replicas.fence_after_next_write()
    await replicas.engine.handle(replicas.event())
    await replicas.engine.wait_idle()

    await replicas.next_leader()
    await replicas.engine.tick()
    await replicas.engine.wait_idle()
    assert _deletes(api) == [] and api.calls("PATCH", "/deployments/") == []
    full = replicas.history()
    assert statuses(full) == [("restart", "interrupted")]
    assert "resumed" not in events(full)
    assert full["state"] == "verifying"


async def test_after_a_gap_past_the_evidence_age_a_fenced_restart_is_held_not_taken_again(
    replicas: Replicas,
) -> None:
    """The last start is older than max_event_age (900 s): the next leader holds every open incident
    until a fresh notification, and takes nothing again meanwhile."""
    api = replicas.api
    api.add_pod(*POD, LEAK["node"], owner=("ReplicaSet", "vllm-7d9f8b6c5d"), gpus=1)
    await replicas.lead()
    replicas.clock.advance(1000)
    replicas.fence_after_next_write()
    await replicas.engine.handle(replicas.event())
    await replicas.engine.wait_idle()

    await replicas.next_leader()
    await replicas.engine.tick()
    await replicas.engine.wait_idle()
    assert _deletes(api) == []
    full = replicas.history()
    assert statuses(full) == [("restart", "interrupted")]
    assert "held" in events(full) and "resumed" not in events(full)
