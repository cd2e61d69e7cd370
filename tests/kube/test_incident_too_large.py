"""An incident too large for etcd never takes the controller down (issue 36, finding 2): annotations
are cut before storage, and a status the server still refuses for its size is written bare (row and
counts), so the inbox's replay of the same alert cannot crash-loop the controller."""

from __future__ import annotations

import json
from typing import Any

from remediation.kube.client import KubeClient
from remediation.kube.incidents import (
    ANNOTATIONS_MAX_BYTES,
    CUT_KEY,
    GROUP,
    INCIDENTS,
    MAX_ALERTS_KEPT,
    VERSION,
    IncidentStore,
    IncidentStoreSettings,
    cut_annotations,
)
from remediation.replication import IncidentSnapshot, Snapshot
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI

NS = "gpupulse"


def _row(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "id": 1,
        "key": "XidCritical:node-a/GPU-1",
        "signature": "xid",
        "alertname": "XidCritical",
        "target_kind": "gpu",
        "target_node": "node-a",
        "target_uuid": "GPU-1",
        "state": "acting",
        "annotations": json.dumps(annotations),
    }


def _store(client: KubeClient) -> IncidentStore:
    return IncidentStore(client, IncidentStoreSettings(NS, "replica-a"), lambda: True, FakeClock())


async def _status(client: KubeClient) -> dict[str, Any]:
    obj = await client.get_custom_object(GROUP, VERSION, NS, INCIDENTS, "incident-1")
    return dict(obj["status"])


async def test_an_alert_with_megabytes_of_annotations_is_stored_cut(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    # what the crash loop began with: one description that escapes to ~1.7 MB
    huge = {"description": '"<x>"' * 350_000, "summary": "GPU fell off the bus", "runbook_url": "r"}
    store = _store(kube_client)
    await store.write(Snapshot((IncidentSnapshot(1, _row(huge), [], [], [], []),), None))
    status = await _status(kube_client)
    stored = json.loads(status["row"]["annotations"])
    assert len(status["row"]["annotations"].encode()) <= ANNOTATIONS_MAX_BYTES
    assert stored["summary"] == "GPU fell off the bus" and stored["runbook_url"] == "r"
    assert stored["description"].startswith('"<x>"') and CUT_KEY in stored
    assert status["omitted"]["annotationBytes"] > 1_600_000
    assert store.lost is None


def test_small_annotations_are_left_as_they_are() -> None:
    row = _row({"summary": "s", "description": "d" * 1000})
    assert cut_annotations(row) == (row, 0)


async def test_a_status_the_server_refuses_for_its_size_is_written_bare_not_lost(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    too_large = "etcdserver: request is too large"
    kube_api.fail("PUT", r"/gpuincidents/incident-1/status$", 500, "", message=too_large)
    alerts = [{"fingerprint": f"fp{i}", "starts": 0.0, "status": "firing", "at": float(i)} for i in range(3)]
    entries = [{"id": i, "kind": "event", "text": "e"} for i in range(5)]
    store = _store(kube_client)
    inc = IncidentSnapshot(1, _row({"summary": "s"}), entries, [{"key": "k"}], alerts, [])
    await store.write(Snapshot((inc,), None))
    status = await _status(kube_client)
    assert status["row"]["id"] == 1 and status["state"] == "acting"
    assert "entries" not in status and "alerts" not in status
    assert status["omitted"] == {"entries": 5, "handled": 1, "alerts": 3, "diagnoses": 0, "bare": True}
    assert store.counts.bare == 1 and store.lost is None


def _storm(n: int) -> IncidentSnapshot:
    fps = [f"{i:016x}" for i in range(n)]
    alerts = [
        {"fingerprint": fp, "starts": 0.0, "status": "firing", "at": float(i)} for i, fp in enumerate(fps)
    ]
    row = {**_row({"summary": "s"}), "firing_fps": json.dumps(fps)}
    return IncidentSnapshot(1, row, [], [], alerts, [])


async def test_a_storm_keeps_the_newest_alerts_and_counts_the_rest_so_the_status_stays_bounded(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    store = _store(kube_client)
    sizes = []
    for n in (MAX_ALERTS_KEPT, 1_000, 5_000):
        await store.write(Snapshot((_storm(n),), None))
        status = await _status(kube_client)
        sizes.append(len(json.dumps(status).encode()))
        assert sorted(a["at"] for a in status["alerts"]) == [float(i) for i in range(n - MAX_ALERTS_KEPT, n)]
        fps = json.loads(status["row"]["firing_fps"])
        assert fps == [f"{i:016x}" for i in range(n - MAX_ALERTS_KEPT, n)], "those of the newest alerts"
        assert status.get("omitted", {}).get("alerts", 0) == n - MAX_ALERTS_KEPT
        assert status.get("omitted", {}).get("firingFingerprints", 0) == n - MAX_ALERTS_KEPT
    assert max(sizes) < 1.05 * min(sizes), sizes  # the counts and longer numbers only
    assert store.counts.trimmed == 0


async def _others(kube_client: KubeClient, status: dict[str, Any] | None) -> dict[str, Any]:
    """incident-1 naming another target, as an earlier leader left it (with a status, or without)."""
    spec = {
        "schemaVersion": 1,
        "id": 1,
        "key": "other",
        "signature": "x",
        "alertname": "A",
        "target": "pod:n/a/b",
    }
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuIncident", "metadata": {"name": "incident-1"}}
    made = await kube_client.create_custom_object(GROUP, VERSION, NS, INCIDENTS, {**body, "spec": spec})
    if status is not None:
        meta = {"name": "incident-1", "resourceVersion": made["metadata"]["resourceVersion"]}
        await kube_client.replace_custom_object_status(
            GROUP, VERSION, NS, INCIDENTS, "incident-1", {**body, "metadata": meta, "status": status}
        )
    return spec


async def test_a_status_is_never_written_onto_another_incidents_object(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    theirs = {"state": "acting", "row": {"id": 1, "key": "other"}, "writer": {"holder": "x", "term": 0}}
    spec = await _others(kube_client, theirs)
    store = _store(kube_client)
    await store.write(Snapshot((IncidentSnapshot(1, _row({"summary": "s"}), [], [], [], []),), None))
    obj = await kube_client.get_custom_object(GROUP, VERSION, NS, INCIDENTS, "incident-1")
    assert obj["spec"] == spec and obj["status"]["row"] == theirs["row"], "left as it was"
    assert store.counts.foreign == 1 and store.counts.status_writes == 0 and store.lost is None


async def test_a_failed_creates_leftover_whose_id_is_reused_is_replaced_not_written_onto(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    await _others(kube_client, None)  # its first status write never landed: no decision behind it
    store = _store(kube_client)
    await store.write(Snapshot((IncidentSnapshot(1, _row({"summary": "s"}), [], [], [], []),), None))
    obj = await kube_client.get_custom_object(GROUP, VERSION, NS, INCIDENTS, "incident-1")
    assert obj["spec"]["key"] == "XidCritical:node-a/GPU-1" and obj["status"]["row"]["id"] == 1
    assert store.counts.foreign == 0 and store.counts.deletes == 1 and store.counts.status_writes == 1


async def test_an_object_read_back_with_our_spec_is_written(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    first = _store(kube_client)
    await first.write(Snapshot((IncidentSnapshot(1, _row({"summary": "s"}), [], [], [], []),), None))
    second = _store(kube_client)
    await second.load()
    await second.write(
        Snapshot((IncidentSnapshot(1, {**_row({}), "state": "closed"}, [], [], [], []),), None)
    )
    assert (await _status(kube_client))["state"] == "closed" and second.counts.foreign == 0


def _alert_only(n: int, state: str = "acting") -> IncidentSnapshot:
    alerts = [{"fingerprint": f"fp{n}", "starts": 0.0, "status": "firing", "at": float(n)}]
    return IncidentSnapshot(1, {**_row({}), "state": state}, [], [], alerts, [])


async def test_a_storm_of_decisions_without_effects_is_one_status_write_per_interval(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    clock = FakeClock()
    settings = IncidentStoreSettings(NS, "replica-a", status_interval_seconds=2.0)
    store = IncidentStore(kube_client, settings, lambda: True, clock)
    await store.write(Snapshot((_alert_only(0),), None), defer=True)  # the first write goes through
    for n in range(1, 200):
        clock.advance(0.005)
        await store.write(Snapshot((_alert_only(n),), None), defer=True)
    assert store.counts.status_writes == 1 and store.counts.deferred == 199
    await store.flush(clock.monotonic())
    assert store.counts.status_writes == 1, "the interval is not over yet"
    clock.advance(2.0)
    await store.flush(clock.monotonic())
    assert store.counts.status_writes == 2
    assert (await _status(kube_client))["alerts"][0]["fingerprint"] == "fp199", "the newest snapshot"


async def test_a_decision_with_effects_or_a_new_state_is_written_through_at_once(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    clock = FakeClock()
    settings = IncidentStoreSettings(NS, "replica-a", status_interval_seconds=2.0)
    store = IncidentStore(kube_client, settings, lambda: True, clock)
    await store.write(Snapshot((_alert_only(0),), None), defer=True)
    await store.write(Snapshot((_alert_only(1),), None), defer=True)
    await store.write(Snapshot((_alert_only(2, state="resolved"),), None), defer=True)  # a new state
    assert store.counts.status_writes == 2 and (await _status(kube_client))["state"] == "resolved"
    await store.write(Snapshot((_alert_only(3, state="resolved"),), None), defer=True)
    await store.write(Snapshot((), None))  # effects: everything deferred goes first
    assert store.counts.status_writes == 3
    assert (await _status(kube_client))["alerts"][0]["fingerprint"] == "fp3"
