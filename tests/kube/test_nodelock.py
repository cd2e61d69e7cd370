"""The per-node Lease: two actions (or two replicas) never touch one node at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import TemporaryError
from remediation.kube.client import KubeClient
from remediation.kube.nodelock import node_lease_name
from remediation.kube.timing import micro_time
from remediation.model import Target
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import GatedClock, StepClock, backend_settings

Make = Callable[..., KubernetesBackend]


async def test_second_replica_is_refused_while_the_first_holds_the_node(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_pod("ml", "llm-0", "gpu-1", owner=("StatefulSet", "llm"), labels={"app": "llm"}, gpus=1)
    kube_api.add_pod("ml", "embed-0", "gpu-1", owner=("StatefulSet", "embed"))  # no GPU: not drained
    pdb = kube_api.add_pdb("ml", "llm-pdb", {"app": "llm"}, disruptions_allowed=0)
    clock_a = GatedClock()
    a = KubernetesBackend(kube_client, backend_settings(identity="replica-a"), clock_a)
    b = KubernetesBackend(kube_client, backend_settings(identity="replica-b"), StepClock())

    draining = asyncio.create_task(a.migrate(Target(kind="node", node="gpu-1"), "xid 79"))
    await asyncio.wait_for(clock_a.waiting.wait(), 5)  # A holds the Lease and is backing off on the PDB
    lease = kube_api.leases[("gpupulse", "gpupulse-node-gpu-1")]
    assert lease["spec"]["holderIdentity"].startswith("replica-a/")
    with pytest.raises(TemporaryError, match="locked by replica-a/"):
        await b.restart(Target(kind="pod", namespace="ml", pod="embed-0"), "xid 13")
    assert ("ml", "embed-0") in kube_api.pods

    pdb["status"]["disruptionsAllowed"] = 1
    clock_a.gate.set()
    await asyncio.wait_for(draining, 5)
    assert "holderIdentity" not in kube_api.leases[("gpupulse", "gpupulse-node-gpu-1")]["spec"]  # released
    kube_api.add_pod("ml", "web-0", "gpu-1", owner=("StatefulSet", "web"))
    await b.restart(Target(kind="pod", namespace="ml", pod="web-0"), "xid 13")
    assert kube_api.deleted[-1][0] == "ml/web-0"


async def test_a_lease_left_by_a_dead_holder_is_taken_after_it_expires(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    kube_api.add_node("gpu-1")
    stale = clock.utcnow() - timedelta(seconds=61)
    kube_api.leases[("gpupulse", "gpupulse-node-gpu-1")] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpupulse-node-gpu-1", "namespace": "gpupulse", "resourceVersion": "7"},
        "spec": {
            "holderIdentity": "crashed-replica/1",
            "leaseDurationSeconds": 60,
            "renewTime": micro_time(stale),
            "leaseTransitions": 2,
        },
    }
    await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True
    assert kube_api.leases[("gpupulse", "gpupulse-node-gpu-1")]["spec"]["leaseTransitions"] == 3


async def test_a_live_lease_of_another_holder_blocks_without_touching_the_node(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.leases[("gpupulse", "gpupulse-node-gpu-1")] = {
        "metadata": {"name": "gpupulse-node-gpu-1", "namespace": "gpupulse", "resourceVersion": "7"},
        "spec": {
            "holderIdentity": "replica-b/1",
            "leaseDurationSeconds": 60,
            "renewTime": micro_time(clock.utcnow()),
        },
    }
    with pytest.raises(TemporaryError, match="replica-b/1") as err:
        await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert 1.0 <= err.value.delay_seconds <= 60.0
    assert kube_api.calls("PATCH", "/nodes/") == []


def test_lease_names_stay_valid_object_names() -> None:
    assert node_lease_name("gpu-1") == "gpupulse-node-gpu-1"
    long = node_lease_name("n" * 260)
    assert len(long) <= 253
    assert long != node_lease_name("n" * 259)


async def test_a_release_the_server_throttles_is_retried_until_it_lands(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    from remediation.kube.lease import LeaseStore
    from remediation.kube.nodelock import NodeLock

    clock = StepClock()
    lock = NodeLock(LeaseStore(kube_client, "gpupulse"), "replica-a", clock, duration_seconds=900)
    name = node_lease_name("gpu-1")
    async with lock.hold("gpu-1"):
        # API Priority and Fairness refuses the release three times (text body, Retry-After: 2)
        kube_api.throttle("PUT", rf"/leases/{name}$", retry_after="2", times=3)
    await lock.drain()
    # before: tried once, and the node stayed locked for the lease's 900 s
    assert "holderIdentity" not in kube_api.leases[("gpupulse", name)]["spec"]
    assert len(kube_api.calls("PUT", rf"/leases/{name}$")) == 4
    # each retry no sooner than the server's Retry-After, the first after the inline try too (it
    # came 0.01 s after the refusal, as the real API server's audit log showed)
    assert [s for s in clock.sleeps if s >= 2.0] == [2.0, 2.0, 2.0]


async def test_a_release_still_refused_when_the_lease_would_expire_gives_up(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    from remediation.kube.lease import LeaseStore
    from remediation.kube.nodelock import NodeLock

    clock = StepClock()
    lock = NodeLock(LeaseStore(kube_client, "gpupulse"), "replica-a", clock, duration_seconds=10)
    name = node_lease_name("gpu-2")
    async with lock.hold("gpu-2"):
        kube_api.throttle("PUT", rf"/leases/{name}$", retry_after="3", times=100)
    await lock.drain()
    puts = len(kube_api.calls("PUT", rf"/leases/{name}$"))
    assert puts == 4  # one inline, then 3 s apart within the 10 s the Lease still had: no storm
    assert sum(clock.sleeps) <= 10
