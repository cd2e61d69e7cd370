"""Cluster mode: the ledger written through to GpuIncident objects on the in-process API server (real
client on top). A replica's node is lost (engine dropped, its SQLite files deleted); the next leader
rebuilds from the cluster, verifies the action that was in flight and repeats nothing."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

from remediation.engine import RemediationEngine, build_engine
from remediation.errors import Fenced, ReplicationLost
from remediation.kube.client import KubeClient
from remediation.kube.incidents import (
    GROUP,
    INCIDENTS,
    VERSION,
    IncidentStore,
    IncidentStoreSettings,
    incident_name,
)
from remediation.ledger import Ledger, connect
from remediation.metrics import RemediationMetrics
from remediation.replication import restore
from remediation.settings import EngineSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.remediation.test_engine_support import LEAK, SCOPE, Rig, ScriptedBackend, statuses

NS = "gpupulse"
GV = f"{GROUP}/{VERSION}"


@dataclass
class ClusterRig:
    """Replicas in turn: each leads with a fresh local ledger rebuilt from the API server."""

    tmp_path: Path
    client: KubeClient
    api: FakeKubeAPI
    clock: FakeClock = field(default_factory=FakeClock)
    backend: ScriptedBackend = field(default_factory=ScriptedBackend)
    pager: RecordingPager = field(default_factory=RecordingPager)
    leading: bool = True
    term: int = 0
    status_interval_seconds: float = 0.0  # coalescing of decisions with no effects (off unless set)
    engine: RemediationEngine = field(init=False)
    store: IncidentStore = field(init=False)

    @property
    def local(self) -> Path:
        return self.tmp_path / f"replica-{self.term}"

    async def lead(self) -> RemediationEngine:
        """Become leader: rebuild the local ledger from the cluster, then build the engine on it."""
        self.store = IncidentStore(
            self.client,
            IncidentStoreSettings(
                NS,
                f"replica-{self.term}",
                term=self.term,
                write_deadline_seconds=2.0,
                status_interval_seconds=self.status_interval_seconds,
            ),
            may_act=lambda: self.leading,
            clock=self.clock,
        )
        snapshot = await self.store.load()
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
                pager=self.pager,
                mirror=self.store,
            ),
        )
        return self.engine

    async def lose_node(self) -> None:
        """The leader's node is gone: work abandoned, local storage deleted; the next replica leads."""
        await self.engine.aclose(grace_seconds=0)
        shutil.rmtree(self.local)
        self.term += 1
        self.backend = ScriptedBackend()
        await self.lead()

    def objects(self) -> dict[str, dict[str, Any]]:
        return {n: o for (g, p, ns, n), o in self.api.objects.items() if (g, p, ns) == (GV, INCIDENTS, NS)}

    def event(self, labels: dict[str, str], status: str = "firing") -> Any:
        return Rig.event(cast(Rig, self), labels, status)


@pytest.fixture
async def rig(tmp_path: Path, kube_client: KubeClient, kube_api: FakeKubeAPI) -> AsyncIterator[ClusterRig]:
    r = ClusterRig(tmp_path, kube_client, kube_api)
    await r.lead()
    yield r
    await r.engine.aclose(grace_seconds=0)


async def test_incident_is_an_object_with_printed_fields(rig: ClusterRig) -> None:
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    ((name, obj),) = rig.objects().items()
    assert name == incident_name(1)
    assert obj["spec"]["signature"] and obj["spec"]["target"] == "pod:node-a/llm/vllm-7d9f8b6c5d-x2x4z"
    assert obj["status"]["state"] == "verifying" and obj["status"]["rung"] == "restart"
    assert obj["status"]["writer"] == {"holder": "replica-0", "term": 0}
    assert [(e["rung"], e["status"]) for e in obj["status"]["entries"] if e["kind"] == "action"] == [
        ("restart", "success")
    ]


async def test_intent_is_in_the_cluster_before_the_action_runs(rig: ClusterRig) -> None:
    seen: list[list[tuple[str, str]]] = []
    act = rig.backend._act

    async def checking(rung: str, target: Any) -> Any:
        obj = rig.objects()[incident_name(1)]
        seen.append([(e["rung"], e["status"]) for e in obj["status"]["entries"] if e["kind"] == "action"])
        return await act(rung, target)

    rig.backend._act = checking  # type: ignore[method-assign]
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    assert seen == [[("restart", "started")]]


async def test_node_lost_during_action_new_leader_verifies_and_repeats_nothing(rig: ClusterRig) -> None:
    rig.backend.gate = asyncio.Event()  # the restart never reports back: the node dies first
    ev = rig.event(LEAK)
    await rig.engine.handle(ev)
    await rig.backend.entered.wait()
    first = rig.backend
    await rig.lose_node()
    await rig.engine.tick()  # recovery's writes go out with the first decision
    (inc,) = rig.engine.list_incidents()
    full = rig.engine.get_incident(int(inc["id"]))
    assert full is not None and full["state"] == "verifying"
    assert statuses(full) == [("restart", "interrupted")]
    await rig.engine.handle(ev)  # the new leader's own inbox holds the same alert
    rig.clock.advance(10)
    await rig.engine.tick()
    await rig.engine.wait_idle()
    assert first.rungs == ["restart"] and rig.backend.calls == []
    assert rig.objects()[incident_name(1)]["status"]["writer"]["term"] == 1


async def test_redelivered_alert_after_takeover_opens_nothing_new(rig: ClusterRig) -> None:
    ev = rig.event(LEAK)
    await rig.engine.handle(ev)
    await rig.engine.wait_idle()
    resolved = replace(ev, status="resolved")
    await rig.engine.handle(resolved)
    rig.clock.advance(901)
    await rig.engine.tick()
    await rig.engine.wait_idle()
    assert rig.objects()[incident_name(1)]["status"]["state"] == "closed"
    await rig.lose_node()
    now = rig.clock.utcnow()  # the survivor received them just now: fresh, so only dedup stops them
    for e in (ev, resolved, ev):  # the survivor's inbox replays what the old leader already handled
        await rig.engine.handle(replace(e, received_at=now))
    await rig.engine.wait_idle()
    assert len(rig.engine.list_incidents()) == 1 and len(rig.objects()) == 1
    assert rig.backend.calls == []


async def test_api_errors_and_a_lost_answer_are_retried(rig: ClusterRig) -> None:
    rig.api.fail("PUT", r"/gpuincidents/.*/status$", 503, "ServiceUnavailable", times=2)
    rig.api.fail("POST", r"/gpuincidents$", 429, "TooManyRequests", times=1)
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    assert rig.backend.rungs == ["restart"]
    assert rig.store.counts.retries == 3
    assert rig.objects()[incident_name(1)]["status"]["state"] == "verifying"


async def test_a_throttled_status_write_waits_the_retry_after_of_the_header(rig: ClusterRig) -> None:
    # API Priority and Fairness: 429, text/plain, "Retry-After: 1"; before, re-sent after 0.05 s
    rig.api.throttle("PUT", r"/gpuincidents/.*/status$", retry_after="1", times=2)
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    assert rig.backend.rungs == ["restart"]
    assert rig.store.counts.retries == 2
    assert [s for s in rig.clock.sleeps if s >= 1.0][:2] == [1.0, 1.0]
    assert rig.objects()[incident_name(1)]["status"]["state"] == "verifying"


async def test_conflict_with_an_older_term_is_retried_on_the_new_version(rig: ClusterRig) -> None:
    ev = rig.event(LEAK)
    await rig.engine.handle(ev)
    await rig.engine.wait_idle()
    key = (GV, INCIDENTS, NS, incident_name(1))
    rig.api.objects[key]["metadata"]["resourceVersion"] = rig.api.next_rv()  # someone wrote meanwhile
    await rig.engine.handle(replace(ev, status="resolved"))
    await rig.engine.wait_idle()
    assert rig.store.counts.conflicts == 1
    local = rig.engine.get_incident(1)
    assert local is not None and local["state"] != "verifying"
    assert rig.objects()[incident_name(1)]["status"]["state"] == local["state"]


async def test_conflict_with_a_newer_term_fences_this_replica(rig: ClusterRig) -> None:
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    key = (GV, INCIDENTS, NS, incident_name(1))
    obj = rig.api.objects[key]
    obj["status"]["writer"] = {"holder": "replica-9", "term": 9}
    obj["metadata"]["resourceVersion"] = rig.api.next_rv()
    other = rig.event({**LEAK, "pod": "vllm-other"})
    with pytest.raises(Fenced):
        await rig.engine.handle(rig.event(LEAK, "resolved"))
    with pytest.raises(Fenced):  # a fenced engine decides nothing more
        await rig.engine.handle(other)
    assert rig.backend.rungs == ["restart"]


async def test_write_that_cannot_be_made_drops_the_effects(rig: ClusterRig) -> None:
    rig.api.fail("POST", r"/gpuincidents$", 500, "InternalError", times=1000)
    with pytest.raises(ReplicationLost):
        await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    assert rig.backend.calls == []


async def test_partitioned_leader_stops_acting(rig: ClusterRig) -> None:
    rig.leading = False  # renewals failed past the renew deadline: the lease may be someone else's
    with pytest.raises(Fenced):
        await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    assert rig.backend.calls == [] and rig.objects() == {}


async def test_fenced_between_decision_and_action_does_not_act(rig: ClusterRig) -> None:
    store_write = rig.store.write

    async def write_then_partition(snapshot: Any, defer: bool = False) -> None:
        await store_write(snapshot, defer)
        rig.leading = False  # the lease lapses right after the intent landed

    rig.store.write = write_then_partition  # type: ignore[method-assign]
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    assert rig.backend.calls == []
    obj = rig.objects()[incident_name(1)]
    assert [(e["rung"], e["status"]) for e in obj["status"]["entries"] if e["kind"] == "action"] == [
        ("restart", "started")
    ]


async def test_fenced_after_dispatch_before_the_action_starts_does_not_act(rig: ClusterRig) -> None:
    runner = rig.engine._runner
    dispatch = runner.dispatch

    def dispatch_then_partition(effects: Any) -> None:
        dispatch(effects)
        rig.leading = False  # the action's task has not run yet

    runner.dispatch = dispatch_then_partition  # type: ignore[method-assign]
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    assert rig.backend.calls == []


async def test_prune_deletes_old_and_surplus_closed_incidents_never_open_ones(rig: ClusterRig) -> None:
    for i in range(4):
        ev = rig.event({**LEAK, "pod": f"vllm-{i}"})
        await rig.engine.handle(ev)
        await rig.engine.wait_idle()
        if i < 3:
            await rig.engine.handle(replace(ev, status="resolved"))
            rig.clock.advance(901)
            await rig.engine.tick()
            await rig.engine.wait_idle()
    states = {n: o["status"]["state"] for n, o in rig.objects().items()}
    assert sorted(states.values()).count("closed") == 3, states
    deleted = await rig.store.prune(rig.clock.time(), retention_seconds=10**9, keep=1)
    assert deleted == 2
    assert set(rig.objects()) == {incident_name(3), incident_name(4)}
    assert await rig.store.prune(rig.clock.time() + 10**10, retention_seconds=10, keep=5) == 1
    assert set(rig.objects()) == {incident_name(4)}


async def test_objects_of_a_newer_schema_are_read_without_their_unknown_fields(rig: ClusterRig) -> None:
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    obj = rig.api.objects[(GV, INCIDENTS, NS, incident_name(1))]
    obj["spec"]["schemaVersion"] = 2
    obj["status"]["row"]["diagnosis_from_the_future"] = "x"
    await rig.lose_node()
    (inc,) = rig.engine.list_incidents()
    assert inc["state"] == "verifying" and "diagnosis_from_the_future" not in inc


async def test_api_writes_per_incident_lifecycle(rig: ClusterRig) -> None:
    """Fire, restart, resolve, cool down, close: one create plus one status write per decision."""
    ev = rig.event(LEAK)
    await rig.engine.handle(ev)
    await rig.engine.wait_idle()
    await rig.engine.handle(replace(ev, status="resolved"))
    await rig.engine.wait_idle()
    rig.clock.advance(901)
    await rig.engine.tick()
    await rig.engine.wait_idle()
    assert rig.objects()[incident_name(1)]["status"]["state"] == "closed"
    creates = rig.api.calls("POST", r"/gpuincidents$")
    puts = rig.api.calls("PUT", r"/gpuincidents/incident-1/status$")
    print(f"API writes for one incident lifecycle: {len(creates)} create + {len(puts)} status writes")
    assert len(creates) == 1 and 1 <= len(puts) <= 6


async def test_diagnoses_survive_a_takeover(rig: ClusterRig) -> None:
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    before = rig.engine.get_incident(1)
    assert before is not None and before.get("diagnosis")  # "no diagnosis" and why is one too
    await rig.lose_node()
    after = rig.engine.get_incident(1)
    assert after is not None and after["diagnosis"] == before["diagnosis"]


async def test_a_new_leader_retries_a_load_the_server_is_not_ready_for(rig: ClusterRig) -> None:
    """kube-apiserver answers 429 "storage is (re)initializing" while a CRD's storage starts, and 5xx
    while etcd recovers: the next leader waits it out and rebuilds, it does not exit."""
    await rig.engine.handle(rig.event(LEAK))
    await rig.engine.wait_idle()
    path = rf"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{INCIDENTS}$"
    rig.api.fail("GET", path, 429, "TooManyRequests", times=2, message="storage is (re)initializing")
    rig.api.fail("GET", path, 503, "ServiceUnavailable")
    await rig.lose_node()
    assert rig.store.counts.retries == 3
    assert [inc.id for inc in (await rig.store.load()).incidents] == [1]


async def test_a_load_retried_past_the_lease_is_fenced(rig: ClusterRig) -> None:
    path = rf"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{INCIDENTS}$"
    rig.api.fail("GET", path, 429, "TooManyRequests", times=1000)

    def lease_lost(method: str, request_path: str) -> None:  # the lease ends while the server refuses
        if method == "GET" and request_path.endswith(f"/{INCIDENTS}"):
            rig.leading = False

    rig.api.before.append(lease_lost)
    asked = len(rig.api.calls("GET", path))
    with pytest.raises(Fenced):
        await rig.store.load()
    assert len(rig.api.calls("GET", path)) == asked + 1  # refused once, then not asked again


async def test_with_coalescing_on_the_intent_is_still_written_through_before_the_action(
    tmp_path: Path, kube_client: KubeClient, kube_api: FakeKubeAPI
) -> None:
    rig = ClusterRig(tmp_path, kube_client, kube_api, status_interval_seconds=60.0)
    await rig.lead()
    flags: list[bool] = []
    store_write = rig.store.write

    async def recording(snapshot: Any, defer: bool = False) -> None:
        flags.append(defer)
        await store_write(snapshot, defer)

    rig.store.write = recording  # type: ignore[method-assign]
    seen: list[list[tuple[str, str]]] = []
    act = rig.backend._act

    async def checking(rung: str, target: Any) -> Any:
        obj = rig.objects()[incident_name(1)]
        seen.append([(e["rung"], e["status"]) for e in obj["status"]["entries"] if e["kind"] == "action"])
        return await act(rung, target)

    rig.backend._act = checking  # type: ignore[method-assign]
    try:
        await rig.engine.handle(rig.event(LEAK))
        await rig.engine.wait_idle()
    finally:
        await rig.engine.aclose(grace_seconds=0)
    assert seen == [[("restart", "started")]], "the intent was in the cluster when the action ran"
    assert flags and flags[0] is False, "the decision with an effect is not coalesced"
    assert rig.objects()[incident_name(1)]["status"]["state"] == "verifying"
