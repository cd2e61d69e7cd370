"""Behaviours written once and run against both API servers: our in-process fake
(tests/fakes/kube_api.py) and the real kube-apiserver and kube-controller-manager
(tests/kube/realapi.py, the chart's controller RBAC). Where both can run a behaviour they must agree,
so a test that only the fake can run (a partition, a lost answer) rests on a fake shown to answer as
the real server does everywhere else.

Each world offers the same few verbs (a namespace, a node, a Deployment's pod, a budget, a JobSet
gang) and a controller `KubeClient`; the real world waits for its controllers (ReplicaSet, disruption,
Job, garbage collector), the fake has them done at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

import pytest

from gpupulse.clock import SystemClock
from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import KubeConflict, KubeInvalid, KubeNotFound, KubeTooManyRequests, PermanentError
from remediation.kube.client import KubeClient, KubeClientSettings
from remediation.kube.incidents import MAX_STATUS_BYTES, IncidentStore, IncidentStoreSettings
from remediation.kube.lease import LeaseRecord, LeaseStore
from remediation.model import Target
from remediation.replication import IncidentSnapshot, Snapshot
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import backend_settings
from tests.kube.realapi import (
    JSON,
    KubeHTTPError,
    RealCluster,
    add_node,
    ensure_namespace,
    is_ready,
    pods_in,
    real_cluster,
)
from tests.kube.test_real_apiserver import CONTROLLER_NS, chart, controller_token, deployment, kubeconfig
from tests.kube.test_real_gang import child_job, container_spec, training_crds

# fixtures imported so that pytest finds them here (the real world asks for them by name)
__all__ = ["chart", "controller_token", "kubeconfig", "real_cluster", "training_crds"]

pytestmark = [pytest.mark.timeout(300)]
REAL = [
    pytest.mark.real_apiserver,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.xdist_group("real_cluster"),
]
WORLDS = [pytest.param("fake", id="fake"), pytest.param("real", id="real", marks=REAL)]
INCIDENTS = ("remediation.gpupulse.io", "v1", "gpuincidents")
# how kube-apiserver 1.37 words a UID precondition that fails, for a delete and an eviction alike
OTHER_UID = r"the UID in the precondition \(0b6f5e0c-\S+\) does not match the UID in record"


class World(Protocol):
    """What a shared behaviour needs of an API server, whichever it is."""

    name: str
    client: KubeClient

    def namespace(self) -> str: ...
    def node(self) -> str: ...
    def deployment_pod(self, namespace: str, node: str) -> JSON: ...
    def budget(self, namespace: str, min_available: int) -> None: ...
    def pod(self, namespace: str, name: str) -> JSON | None: ...
    def replicaset(self, namespace: str, name: str) -> JSON | None: ...
    def jobset(self, namespace: str, name: str, nodes: list[str], label: str = "") -> JSON: ...
    def child_jobs(self, namespace: str) -> list[JSON]: ...
    def jobset_object(self, namespace: str, name: str) -> JSON | None: ...
    def pods(self, namespace: str) -> list[JSON]: ...


@dataclass
class FakeWorld:
    """The in-process fake: state seeded directly, its controllers' work done at once."""

    api: FakeKubeAPI
    client: KubeClient
    name: str = "fake"
    _n: int = 0

    def _unique(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._n}"

    def namespace(self) -> str:
        return self._unique("ns")

    def node(self) -> str:
        return str(self.api.add_node(self._unique("gpu"))["metadata"]["name"])

    def deployment_pod(self, namespace: str, node: str) -> JSON:
        self.api.add_deployment(namespace, "vllm")
        self.api.add_replicaset(namespace, "vllm-5d8f", "vllm")
        rs = self.api.replicasets[(namespace, "vllm-5d8f")]
        return self.api.add_pod(
            namespace, "vllm-5d8f-x1", node, labels={"app": "vllm"}, gpus=1, controller=rs
        )

    def budget(self, namespace: str, min_available: int) -> None:
        healthy = sum(1 for (ns, _), p in self.api.pods.items() if ns == namespace)
        pdb = self.api.add_pdb(namespace, "vllm", {"app": "vllm"}, max(0, healthy - min_available))
        pdb["spec"]["minAvailable"] = min_available

    def pod(self, namespace: str, name: str) -> JSON | None:
        return self.api.pods.get((namespace, name))

    def replicaset(self, namespace: str, name: str) -> JSON | None:
        return self.api.replicasets.get((namespace, name))

    def jobset(self, namespace: str, name: str, nodes: list[str], label: str = "") -> JSON:
        js = self.api.add_object("jobset.x-k8s.io/v1alpha2", "jobsets", namespace, name)
        for i, node in enumerate(nodes):
            job = child_job(namespace, js, i, node, label)
            child = self.api.add_object(
                "batch/v1", "jobs", namespace, job["metadata"]["name"],
                spec=job["spec"], labels=job["metadata"]["labels"], controller=js,
            )  # fmt: skip
            for index in range(2):  # the Job controller's pods, one per completion index
                self.api.add_pod(namespace, f"{job['metadata']['name']}-{index}-x", node, controller=child)
        return js

    def child_jobs(self, namespace: str) -> list[JSON]:
        return [j for j in self.api.objects_of("batch/v1", "jobs") if j["metadata"]["namespace"] == namespace]

    def jobset_object(self, namespace: str, name: str) -> JSON | None:
        return self.api.objects.get(("jobset.x-k8s.io/v1alpha2", "jobsets", namespace, name))

    def pods(self, namespace: str) -> list[JSON]:
        return [p for (ns, _), p in self.api.pods.items() if ns == namespace]


@dataclass
class RealWorld:
    """The real control plane: objects created as an admin, the controller acting with the chart's
    ServiceAccount; every setup step waits for the controllers that finish it."""

    cluster: RealCluster
    client: KubeClient
    name: str = "real"
    made: list[str] = field(default_factory=list)  # paths deleted afterwards

    def namespace(self) -> str:
        ns = self.cluster.unique("shared")
        ensure_namespace(self.cluster.kube, ns)
        self.made.append(f"/api/v1/namespaces/{ns}")
        return ns

    def node(self) -> str:
        name = self.cluster.unique("gpu")
        add_node(self.cluster.kube, name)
        self.made.append(f"/api/v1/nodes/{name}")
        return name

    def deployment_pod(self, namespace: str, node: str) -> JSON:
        body = deployment(namespace, "vllm")
        body["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        self.cluster.kube.apply(body)
        _wait(lambda: len([p for p in self.pods(namespace) if is_ready(p)]) == 1, "the Deployment's pod")
        (pod,) = [p for p in self.pods(namespace) if is_ready(p)]
        return pod

    def budget(self, namespace: str, min_available: int) -> None:
        kube = self.cluster.kube
        selector = {"matchLabels": {"app": "vllm"}}
        kube.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "vllm", "namespace": namespace},
                    "spec": {"minAvailable": min_available, "selector": selector}})  # fmt: skip
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/vllm"

        def computed() -> bool:
            out = kube.get(path)
            status = out.get("status") or {}
            return (
                status.get("observedGeneration") == out["metadata"]["generation"]
                and "currentHealthy" in status
            )

        _wait(computed, "the disruption controller to compute the budget")

    def _maybe(self, path: str) -> JSON | None:
        try:
            return self.cluster.kube.get(path)
        except KubeHTTPError as e:
            if e.status == 404:
                return None
            raise

    def pod(self, namespace: str, name: str) -> JSON | None:
        return self._maybe(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def replicaset(self, namespace: str, name: str) -> JSON | None:
        return self._maybe(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{name}")

    def jobset(self, namespace: str, name: str, nodes: list[str], label: str = "") -> JSON:
        kube = self.cluster.kube
        running = sum(map(is_ready, self.pods(namespace)))
        template = {"spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2,
                             "template": {"spec": container_spec(nodes[0])}}}  # fmt: skip
        js = kube.post(
            f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets",
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"replicatedJobs": [{"name": "workers", "replicas": len(nodes), "template": template}]}},
        )  # fmt: skip
        for i, node in enumerate(nodes):
            kube.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", child_job(namespace, js, i, node, label))
        want = running + 2 * len(nodes)
        _wait(lambda: sum(map(is_ready, self.pods(namespace))) == want, "the gang's ranks running")
        return js

    def child_jobs(self, namespace: str) -> list[JSON]:
        return list(self.cluster.kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs").get("items") or [])

    def jobset_object(self, namespace: str, name: str) -> JSON | None:
        return self._maybe(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets/{name}")

    def pods(self, namespace: str) -> list[JSON]:
        return pods_in(self.cluster.kube, namespace)


def _wait(predicate: Callable[[], bool], what: str, within_seconds: float = 60.0) -> None:
    """Setup in the real world: ask the server until `predicate` holds."""
    deadline = time.monotonic() + within_seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {within_seconds} s waiting for {what}"
        time.sleep(0.1)


async def eventually(predicate: Callable[[], bool], what: str, within_seconds: float = 60.0) -> None:
    """Wait for an outcome without blocking the loop (the fake serves on it): at once on the fake,
    when its controllers have acted on the real server."""
    deadline = time.monotonic() + within_seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {within_seconds} s waiting for {what}"
        await asyncio.sleep(0.05)


@dataclass(frozen=True)
class Where:
    """Which world a test runs in; for the real one, the control plane and the controller's kubeconfig."""

    name: str
    cluster: RealCluster | None = None
    kubeconfig: Path | None = None


@pytest.fixture(params=WORLDS)
def where(request: pytest.FixtureRequest) -> Where:
    """Resolved outside the event loop: the real world's fixtures render the chart with helm-sdkpy,
    which runs a loop of its own."""
    if request.param == "fake":
        return Where("fake")
    if "jobset_crd" in request.fixturenames:
        request.getfixturevalue("training_crds")
    # the chart's controller ServiceAccount, its RBAC and CRDs applied
    return Where("real", request.getfixturevalue("real_cluster"), request.getfixturevalue("kubeconfig"))


@pytest.fixture
async def world(where: Where, tmp_path: Path) -> AsyncIterator[World]:
    """The fake, or the real control plane (started once per session) with the chart's RBAC."""
    if where.cluster is None or where.kubeconfig is None:
        api = FakeKubeAPI()
        await api.start()
        config = api.write_kubeconfig(tmp_path / "kubeconfig")
        async with await KubeClient.connect(KubeClientSettings(kubeconfig_path=str(config))) as client:
            yield FakeWorld(api, client)
        await api.stop()
        return
    cluster = where.cluster
    async with await KubeClient.connect(KubeClientSettings(kubeconfig_path=str(where.kubeconfig))) as client:
        real = RealWorld(cluster, client)
        try:
            yield real
        finally:
            for path in reversed(real.made):
                with contextlib.suppress(KubeHTTPError):
                    cluster.kube.delete(path)


@pytest.fixture
def jobset_crd() -> None:
    """Asks `where` for the JobSet CRD on a real server (the fake serves JobSets without one)."""


def backend(world: World) -> KubernetesBackend:
    return KubernetesBackend(
        world.client, backend_settings(namespace=CONTROLLER_NS, identity="ctl-0"), SystemClock()
    )


@contextlib.contextmanager
def unchanged(world: World, namespace: str, pod: JSON) -> Iterator[None]:
    """The pod is still there, the same one, afterwards."""
    yield
    now = world.pod(namespace, pod["metadata"]["name"])
    assert now is not None and now["metadata"]["uid"] == pod["metadata"]["uid"]
    assert not now["metadata"].get("deletionTimestamp")


async def test_restart_deletes_the_replicasets_pod_by_uid_and_leaves_its_owner(world: World) -> None:
    ns, node = world.namespace(), world.node()
    pod = world.deployment_pod(ns, node)
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    rs = pod["metadata"]["ownerReferences"][0]["name"]
    result = await backend(world).restart(Target(kind="pod", node=node, namespace=ns, pod=name), "leak")
    assert result.done and result.details["node"] == node
    await eventually(
        lambda: (world.pod(ns, name) or {}).get("metadata", {}).get("uid") != uid, "the pod gone"
    )
    assert world.replicaset(ns, rs) is not None, "the owner stays (it brings the pod back)"
    # hostile: the pod is gone by the time the alert arrives
    with pytest.raises(PermanentError, match="no longer exists"):
        await backend(world).restart(Target(kind="pod", node=node, namespace=ns, pod="vllm-gone"), "leak")


async def test_an_eviction_the_budget_forbids_is_a_429_that_leaves_the_pod(world: World) -> None:
    ns, node = world.namespace(), world.node()
    pod = world.deployment_pod(ns, node)
    world.budget(ns, min_available=1)
    with unchanged(world, ns, pod), pytest.raises(KubeTooManyRequests) as refused:
        await world.client.evict_pod(ns, pod["metadata"]["name"], pod["metadata"]["uid"])
    assert refused.value.status == 429
    assert "disruption budget" in refused.value.message


async def test_an_eviction_the_budget_allows_removes_the_pod(world: World) -> None:
    ns, node = world.namespace(), world.node()
    pod = world.deployment_pod(ns, node)
    world.budget(ns, min_available=0)
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    await world.client.evict_pod(ns, name, uid)
    await eventually(
        lambda: (world.pod(ns, name) or {}).get("metadata", {}).get("uid") != uid, "the pod gone"
    )


async def test_a_write_for_another_uid_or_a_stale_version_is_a_409(world: World) -> None:
    """Deletes and evictions with another pod's UID, a node patch and a status write at an old
    resourceVersion: 409, and nothing changed. A custom resource's update without a resourceVersion is
    refused (422), never applied unconditionally."""
    ns, node = world.namespace(), world.node()
    pod = world.deployment_pod(ns, node)
    name = pod["metadata"]["name"]
    stranger = "0b6f5e0c-0000-4000-8000-000000000000"
    with unchanged(world, ns, pod):
        with pytest.raises(KubeConflict, match=OTHER_UID):
            await world.client.delete_pod(ns, name, stranger)
        with pytest.raises(KubeConflict, match=OTHER_UID):
            await world.client.evict_pod(ns, name, stranger)
    read = await world.client.get_node(node)
    old = read["metadata"]["resourceVersion"]
    await world.client.patch_node(
        node, {"metadata": {"resourceVersion": old, "labels": {"gpupulse.io/t": "1"}}}
    )
    with pytest.raises(KubeConflict):
        await world.client.patch_node(
            node, {"metadata": {"resourceVersion": old}, "spec": {"unschedulable": True}}
        )
    assert not (await world.client.get_node(node))["spec"].get("unschedulable")

    group, version, plural = INCIDENTS
    incident = f"shared-{world.name}-{ns}"
    body = {"apiVersion": f"{group}/{version}", "kind": "GpuIncident", "metadata": {"name": incident},
            "spec": {"schemaVersion": 1, "id": 1}}  # fmt: skip
    created = await world.client.create_custom_object(group, version, CONTROLLER_NS, plural, body)
    try:
        version_read = created["metadata"]["resourceVersion"]
        first = {**body, "metadata": {"name": incident, "resourceVersion": version_read},
                 "status": {"entries": [{"kind": "note", "text": "first"}]}}  # fmt: skip
        written = await world.client.replace_custom_object_status(
            group, version, CONTROLLER_NS, plural, incident, first
        )
        assert written["status"]["entries"] == [{"kind": "note", "text": "first"}]
        again = {**first, "status": {"entries": [{"kind": "note", "text": "second"}]}}
        with pytest.raises(KubeConflict):
            await world.client.replace_custom_object_status(
                group, version, CONTROLLER_NS, plural, incident, again
            )
        unconditional = {**again, "metadata": {"name": incident}}
        with pytest.raises(KubeInvalid, match="resourceVersion"):
            await world.client.replace_custom_object_status(
                group, version, CONTROLLER_NS, plural, incident, unconditional
            )
        kept = await world.client.get_custom_object(group, version, CONTROLLER_NS, plural, incident)
        assert kept["status"]["entries"] == [{"kind": "note", "text": "first"}]
    finally:
        await world.client.delete_custom_object(group, version, CONTROLLER_NS, plural, incident)


async def test_a_lease_changes_hands_only_by_compare_and_swap(world: World) -> None:
    """Leader election's primitives: one create wins, a swap at an old resourceVersion loses, the
    taker's MicroTimes come back to the microsecond, and the old holder learns it lost on its renew."""
    store = LeaseStore(world.client, CONTROLLER_NS)
    name = f"shared-{world.name}-{world.namespace()}"
    now = datetime.now(UTC).replace(microsecond=123456)
    mine = LeaseRecord("a", 15, now, now, 0)
    held = await store.create(name, mine)
    with pytest.raises(KubeConflict):
        await store.create(name, replace(mine, holder_identity="b"))
    renewed = await store.swap(name, replace(held, renew_time=now + timedelta(seconds=2)))
    assert renewed.resource_version != held.resource_version
    with pytest.raises(KubeConflict):  # b saw the first version: its swap loses
        await store.swap(name, replace(held, holder_identity="b"))
    seen = await store.get(name)
    assert seen is not None and seen.holder_identity == "a"
    later = now + timedelta(seconds=18)
    assert not seen.expired_at(now + timedelta(seconds=3)) and seen.expired_at(later)
    taken = await store.swap(
        name, replace(seen, holder_identity="b", acquire_time=later, renew_time=later, lease_transitions=1)
    )
    with pytest.raises(KubeConflict):  # a renews from what it last wrote, and learns it lost
        await store.swap(name, replace(renewed, renew_time=later))
    final = await store.get(name)
    assert final == taken
    assert final.holder_identity == "b" and final.lease_transitions == 1
    assert final.renew_time == later and final.acquire_time == later


async def test_a_gang_restart_takes_every_child_job_of_the_jobset_and_only_those(
    world: World, jobset_crd: None
) -> None:
    ns = world.namespace()
    nodes = [world.node(), world.node()]
    js = world.jobset(ns, "llama", nodes)
    # a Job with llama's label that another JobSet controls (as after a name was reused): not the gang
    other = world.jobset(ns, "llama-before", nodes[:1], label="llama")
    result = await backend(world).restart(
        Target(kind="job", namespace=ns, training_job_kind="JobSet.jobset.x-k8s.io", training_job="llama"),
        "hang",
    )
    assert result.details["deleted"] == [f"{ns}/llama-workers-0", f"{ns}/llama-workers-1"]

    def gang_gone() -> bool:
        names = {j["metadata"]["name"] for j in world.child_jobs(ns)}
        return names == {"llama-before-workers-0"}

    await eventually(gang_gone, "llama's child Jobs gone")
    await eventually(lambda: all(p["metadata"]["name"].startswith("llama-before") for p in world.pods(ns)),
                     "llama's ranks gone")  # fmt: skip
    assert world.pods(ns), "the other JobSet's ranks stay"
    for kept in (js, other):
        obj = world.jobset_object(ns, kept["metadata"]["name"])
        assert obj is not None and obj["metadata"]["uid"] == kept["metadata"]["uid"]
    with pytest.raises(PermanentError, match="no longer exists"):
        await backend(world).restart(
            Target(kind="job", namespace=ns, training_job_kind="JobSet.jobset.x-k8s.io", training_job="gone"),
            "hang",
        )


def _incident_body(name: str, rv: str, entries: int) -> JSON:
    return {
        "apiVersion": "remediation.gpupulse.io/v1",
        "kind": "GpuIncident",
        "metadata": {"name": name, "resourceVersion": rv},
        "status": {"entries": [{"kind": "note", "text": "x" * 1000} for _ in range(entries)]},
    }


# aiohttp warns before sending any body over 1 MiB in one piece; sending one is the point here
@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
async def test_an_object_past_etcds_or_the_servers_limit_is_refused_as_invalid(world: World) -> None:
    """About 1.7 MB: etcd refuses (500, no reason); about 3.3 MB: the API server refuses the body
    (413). Both are KubeInvalid: the same write fails every time, so it is not retried."""
    group, version, plural = INCIDENTS
    name = f"shared-large-{world.name}-{world.namespace()}"
    body = {"apiVersion": f"{group}/{version}", "kind": "GpuIncident", "metadata": {"name": name},
            "spec": {"schemaVersion": 1, "id": 1}}  # fmt: skip
    created = await world.client.create_custom_object(group, version, CONTROLLER_NS, plural, body)
    rv = created["metadata"]["resourceVersion"]
    try:
        seen = []
        for entries in (1700, 3200):
            with pytest.raises(KubeInvalid) as refused:
                await world.client.replace_custom_object_status(
                    group, version, CONTROLLER_NS, plural, name, _incident_body(name, rv, entries)
                )
            seen.append(refused.value.status)
        assert seen == [500, 413]
        # just below the bound the store keeps a status to: stored
        await world.client.replace_custom_object_status(
            group, version, CONTROLLER_NS, plural, name, _incident_body(name, rv, MAX_STATUS_BYTES // 1030)
        )
    finally:
        await world.client.delete_custom_object(group, version, CONTROLLER_NS, plural, name)


@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
async def test_an_incident_whose_history_outgrows_etcd_is_written_without_its_oldest_entries(
    world: World,
) -> None:
    """200 ledger entries of 10 kB each (2 MB, past etcd's 1.5 MiB): the store leaves out the oldest
    entries until the status fits, and the write is accepted, where it used to be refused on every
    write by every later leader. The newest entry, the row and the newest diagnosis stay."""
    # an object name of this test's own in the controller's namespace, which every test shares
    incident_id = 900_000 + int(world.namespace().rsplit("-", 1)[1])
    store = IncidentStore(
        world.client, IncidentStoreSettings(namespace=CONTROLLER_NS, identity="ctl-0"), may_act=lambda: True
    )
    row = {"id": incident_id, "key": "k", "state": "open", "signature": "gpu-memory-leak"}
    entries = [{"id": i, "kind": "note", "summary": f"entry {i}", "text": "x" * 10_000} for i in range(200)]
    diagnoses = [{"id": i, "headline": "d", "evidence": "y" * 20_000} for i in range(3)]
    handled = [{"key": f"h{i}", "at": 200 - i} for i in range(200)]
    snapshot = Snapshot((IncidentSnapshot(incident_id, row, entries, handled, [], diagnoses),), None)
    group, version, plural = INCIDENTS
    name = f"incident-{incident_id}"
    try:
        await store.write(snapshot)
        stored = await world.client.get_custom_object(group, version, CONTROLLER_NS, plural, name)
    finally:
        with contextlib.suppress(KubeNotFound):
            await world.client.delete_custom_object(group, version, CONTROLLER_NS, plural, name)
    status = stored["status"]
    kept = [e["id"] for e in status["entries"]]
    assert 0 < len(kept) < 200 and kept == list(range(200 - len(kept), 200)), "the newest, in order"
    assert status["row"] == row and status["diagnoses"] == diagnoses and status["handled"] == handled
    assert len(json.dumps(status).encode()) <= MAX_STATUS_BYTES + 200  # the writer field on top
    assert store.counts.trimmed == 1
