"""Two releases in one namespace share nothing (issue 23): each has its own leader Lease, and its
GpuIncident and GpuRemediationState objects are labelled and named by its instance, so neither
reads, prunes nor overwrites the other's. A named instance adopts the unlabelled objects of an
earlier version once. Run against the fake and the real API server (the chart's controller RBAC)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from remediation.errors import ConfigError, Fenced, KubeNotFound
from remediation.kube.client import KubeClient
from remediation.kube.incidents import (
    GROUP,
    INCIDENTS,
    INSTANCE_LABEL,
    SWITCHES,
    SWITCHES_NAME,
    VERSION,
    IncidentStore,
    IncidentStoreSettings,
    incident_name,
    instance_selector,
    switches_name,
)
from remediation.kube.leader import LeaderElectionSettings, LeaderElector
from remediation.replication import IncidentSnapshot, Snapshot
from tests.kube.test_real_apiserver import CONTROLLER_NS
from tests.kube.test_shared_behaviour import (
    World,
    chart,
    controller_token,
    eventually,
    kubeconfig,
    real_cluster,
    training_crds,
    where,
    world,
)
from tests.remediation.test_cli_kube import NO_AUTH, _settings

# fixtures imported so that pytest finds them here (the real world asks for them by name)
__all__ = ["chart", "controller_token", "kubeconfig", "real_cluster", "training_crds", "where", "world"]

pytestmark = [pytest.mark.timeout(300)]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _store(client: KubeClient, instance: str, may_act: Callable[[], bool] = lambda: True) -> IncidentStore:
    return IncidentStore(
        client, IncidentStoreSettings(namespace=CONTROLLER_NS, identity="ctl-0", instance=instance), may_act
    )


def _incident(incident_id: int, state: str = "open") -> IncidentSnapshot:
    row = {"id": incident_id, "key": f"k{incident_id}", "state": state, "signature": "gpu-memory-leak"}
    if state == "closed":
        row["closed_at"] = 1.0
    return IncidentSnapshot(incident_id, row, [], [], [], [])


async def _objects(client: KubeClient, selector: str) -> dict[str, dict[str, Any]]:
    objs = await client.list_custom_objects(GROUP, VERSION, CONTROLLER_NS, INCIDENTS, label_selector=selector)
    return {str(o["metadata"]["name"]): o for o in objs}


async def _delete(client: KubeClient, plural: str, name: str) -> None:
    with contextlib.suppress(KubeNotFound):
        await client.delete_custom_object(GROUP, VERSION, CONTROLLER_NS, plural, name)


@pytest.fixture
async def instances(world: World) -> AsyncIterator[list[str]]:
    """Instance names of this test's own; every object of theirs is deleted afterwards (the real
    server's controller namespace is shared by every test)."""
    made: list[str] = []
    yield made
    for instance in made:
        for name in await _objects(world.client, instance_selector(instance)):
            await _delete(world.client, INCIDENTS, name)
        await _delete(world.client, SWITCHES, switches_name(instance))


def _ids(snapshot: Snapshot) -> set[int]:
    return {i.id for i in snapshot.incidents}


async def test_two_instances_in_one_namespace_see_none_of_each_others_objects(
    world: World, instances: list[str]
) -> None:
    a, b = _unique("alpha-gpupulse"), _unique("beta-gpupulse")
    instances += [a, b]
    store_a, store_b = _store(world.client, a), _store(world.client, b)
    await store_a.load()
    await store_b.load()
    # ids of this test's own: both instances adopt whatever unlabelled objects the namespace holds
    base = 800_000 + uuid.uuid4().int % 90_000
    await store_a.write(Snapshot((_incident(base), _incident(base + 2, "closed")), {"pause": {"by": "a"}}))
    await store_b.write(
        Snapshot((_incident(base + 1), _incident(base + 3, "closed")), {"pause": {"by": "b"}})
    )

    seen_a, seen_b = await _store(world.client, a).load(), await _store(world.client, b).load()
    assert {base, base + 2} <= _ids(seen_a) and not {base + 1, base + 3} & _ids(seen_a)
    assert {base + 1, base + 3} <= _ids(seen_b) and not {base, base + 2} & _ids(seen_b)
    assert seen_a.switches == {"pause": {"by": "a"}} and seen_b.switches == {"pause": {"by": "b"}}
    # named and labelled by the instance
    objs = await _objects(world.client, instance_selector(a))
    assert (
        incident_name(base, a) in objs
        and objs[incident_name(base, a)]["metadata"]["labels"][INSTANCE_LABEL] == a
    )
    # hostile: the unnamed instance (a controller of today's names) reads neither
    unnamed = await _store(world.client, "").load()
    assert not {base, base + 1, base + 2, base + 3} & _ids(unnamed)
    # hostile: pruning every closed incident of one instance leaves the other's alone
    assert await store_a.prune(now=10.0, retention_seconds=0.0, keep=0) >= 1
    assert base + 3 in _ids(await _store(world.client, b).load())
    assert base + 2 not in _ids(await _store(world.client, a).load())


async def test_a_named_instance_adopts_the_unlabelled_objects_once(
    world: World, instances: list[str]
) -> None:
    inst = _unique("upgraded-gpupulse")
    instances.append(inst)
    legacy = _store(world.client, "")
    base = 890_000 + uuid.uuid4().int % 9_000
    try:
        had_switches = await world.client.get_custom_object(
            GROUP, VERSION, CONTROLLER_NS, SWITCHES, SWITCHES_NAME
        )
    except KubeNotFound:
        had_switches = None
    try:
        await legacy.load()
        await legacy.write(Snapshot((_incident(base), _incident(base + 1)), {"pause": {"by": "old"}}))

        # hostile: the upgrade's first leader is deposed after one copy; the next one finishes
        writes = 0

        def one_write() -> bool:
            nonlocal writes
            writes += 1
            return writes <= 1  # the first copy lands, the second is fenced

        with pytest.raises(Fenced):
            await _store(world.client, inst, one_write).load()
        store = _store(world.client, inst)
        first = await store.load()
        assert {base, base + 1} <= _ids(first) and store.adopted >= 2
        assert first.switches == {"pause": {"by": "old"}}
        objs = await _objects(world.client, instance_selector(inst))
        assert {incident_name(base, inst), incident_name(base + 1, inst)} <= set(objs)
        # the originals stay, unread by the instance from now on: adopted once, not again
        await legacy.write(Snapshot((_incident(base + 2),), {"pause": {"by": "old, later"}}))
        again = _store(world.client, inst)
        second = await again.load()
        assert again.adopted == 0 and base + 2 not in _ids(second) and {base, base + 1} <= _ids(second)
        assert second.switches == {"pause": {"by": "old"}}
    finally:
        for i in range(3):
            await _delete(world.client, INCIDENTS, incident_name(base + i))
        if had_switches is None:
            await _delete(world.client, SWITCHES, SWITCHES_NAME)


async def test_each_release_elects_its_own_leader_on_its_own_lease(world: World) -> None:
    """Leases named per release (the chart's `<fullname>-controller-leader`) lead side by side; two
    replicas of one release on one Lease do not (what two releases did before, sharing the default)."""
    leading: dict[str, asyncio.Event] = {}

    def elector(lease: str, identity: str) -> LeaderElector:
        leading[identity] = asyncio.Event()
        settings = LeaderElectionSettings(
            namespace=CONTROLLER_NS,
            identity=identity,
            lease_name=lease,
            lease_duration_seconds=15,
            renew_deadline_seconds=10,
            retry_period_seconds=0.2,
        )
        return LeaderElector(world.client, settings)

    async def lead(identity: str) -> None:
        leading[identity].set()
        await asyncio.Event().wait()

    async def stopped() -> None:
        return None

    alpha = _unique("alpha-gpupulse-controller-leader")
    beta = _unique("beta-gpupulse-controller-leader")
    electors = [elector(alpha, "alpha-0"), elector(beta, "beta-0"), elector(alpha, "alpha-1")]
    tasks = [
        asyncio.create_task(e.run(lambda i=e.identity: lead(i), stopped))  # type: ignore[misc]
        for e in electors
    ]
    try:
        await asyncio.wait_for(leading["beta-0"].wait(), 30)
        await asyncio.wait_for(
            asyncio.wait(
                [
                    asyncio.ensure_future(leading["alpha-0"].wait()),
                    asyncio.ensure_future(leading["alpha-1"].wait()),
                ],
                return_when=asyncio.FIRST_COMPLETED,
            ),
            30,
        )
        first, second = (electors[0], electors[2]) if electors[0].is_leader else (electors[2], electors[0])
        assert first.is_leader and electors[1].is_leader, "one leader per release, at once"

        await eventually(
            lambda: second.observed_holder == first.identity, "the other replica seeing the leader"
        )
        assert not second.is_leader, "one Lease, one leader"
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_rolling_upgrade_from_the_shared_lease_never_has_two_leaders(world: World) -> None:
    """The chart renamed the leader Lease per release. During a rolling upgrade the old version's
    replica campaigns on the old shared name only: the new one (`--kube.legacy-lease-name`) does not lead
    while a replica of its release holds the old Lease, leads once it is given up, then holds it so a
    late old replica follows; another release's holder of the old Lease blocks nobody."""
    legacy = _unique("gpupulse-remediation-leader")  # the old default, unique: the namespace is shared
    leading: dict[str, asyncio.Event] = {}

    def elector(identity: str, lease: str, prefix: str | None = None) -> LeaderElector:
        leading[identity] = asyncio.Event()
        settings = LeaderElectionSettings(
            namespace=CONTROLLER_NS,
            identity=identity,
            lease_name=lease,
            lease_duration_seconds=15,
            renew_deadline_seconds=10,
            retry_period_seconds=0.2,
            legacy_lease_name=legacy if prefix is not None else "",
            legacy_holder_prefix=prefix or "",
        )
        return LeaderElector(world.client, settings)

    async def lead(identity: str) -> None:
        leading[identity].set()
        await asyncio.Event().wait()

    async def stopped() -> None:
        return None

    tasks: dict[str, asyncio.Task[None]] = {}

    def start(e: LeaderElector) -> None:
        tasks[e.identity] = asyncio.create_task(e.run(lambda i=e.identity: lead(i), stopped))  # type: ignore[misc]

    async def stop(identity: str) -> None:
        tasks[identity].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks.pop(identity)

    async def renewals(lease: str) -> AsyncIterator[str]:
        seen = ""
        while True:
            renew = str((await world.client.get_lease(CONTROLLER_NS, lease))["spec"].get("renewTime") or "")
            if renew and renew != seen:
                seen = renew
                yield renew
            await asyncio.sleep(0.05)

    alpha_lease = _unique("alpha-gpupulse-controller-leader")
    old = elector("alpha-gpupulse-controller-5d8f-old", legacy)  # the old version: the shared name only
    new = elector("alpha-gpupulse-controller-7c4b-new", alpha_lease, prefix="alpha-gpupulse-controller-")
    beta = elector("beta-gpupulse-controller-0", _unique("beta-gpupulse-controller-leader"),
                   prefix="beta-gpupulse-controller-")  # fmt: skip
    try:
        start(old)
        await asyncio.wait_for(leading[old.identity].wait(), 30)
        start(new)
        start(beta)
        await eventually(lambda: False if tasks[new.identity].done() else new.observed_holder == new.identity,
                         "the new replica holding its own Lease")  # fmt: skip
        # two writes of its own Lease: the old Lease was read after the first, and it still does not lead
        written = renewals(alpha_lease)
        await asyncio.wait_for(anext(written), 10)
        await asyncio.wait_for(anext(written), 10)
        assert not new.is_leader and not leading[new.identity].is_set(), "led beside the old version"
        await asyncio.wait_for(leading[beta.identity].wait(), 30)  # another release's old holder: no wait
        assert beta.is_leader and old.is_leader

        await stop(old.identity)  # the rollout replaces it (a clean stop gives the Lease up)
        await asyncio.wait_for(leading[new.identity].wait(), 30)
        # the old Lease, given up, is taken by whichever new-version leader tried first
        holder = (await world.client.get_lease(CONTROLLER_NS, legacy))["spec"]["holderIdentity"]
        assert holder in (new.identity, beta.identity), "a new-version leader holds the old Lease"

        late = elector("alpha-gpupulse-controller-5d8f-late", legacy)  # an old replica still starting
        start(late)
        await eventually(lambda: late.observed_holder == holder, "the late old replica seeing the holder")
        assert not late.is_leader and not leading[late.identity].is_set() and new.is_leader
    finally:
        for identity in list(tasks):
            await stop(identity)


def test_a_legacy_lease_named_like_the_lease_is_refused() -> None:
    with pytest.raises(ValueError, match="legacy Lease name must differ"):
        LeaderElectionSettings(namespace="ns", identity="a", lease_name="x", legacy_lease_name="x")
    env = {"POD_NAMESPACE": "gpupulse", "POD_NAME": "ctl-0"}
    with pytest.raises(ConfigError, match=r"--kube\.legacy-lease-name must differ"):
        _settings([*NO_AUTH, "--kube.lease-name=x", "--kube.legacy-lease-name=x"], env)
    named = _settings([*NO_AUTH, "--kube.legacy-lease-name=old", "--kube.legacy-lease-holder-prefix=p-"], env)
    assert (named.kube.legacy_lease_name, named.kube.legacy_lease_holder_prefix) == ("old", "p-")


def test_kube_instance_flag_reaches_the_settings_and_refuses_bad_names() -> None:
    env = {"POD_NAMESPACE": "gpupulse", "POD_NAME": "ctl-0"}
    assert _settings(NO_AUTH, env).kube.instance == ""
    named = _settings([*NO_AUTH, "--kube.instance=pulse-gpupulse", "--kube.lease-name=pulse-leader"], env)
    assert (named.kube.instance, named.kube.lease_name) == ("pulse-gpupulse", "pulse-leader")
    for bad in ("Pulse", "-pulse", "pulse_1", "p" * 64, "a=b", "controller"):
        with pytest.raises(ConfigError, match=r"--kube\.instance"):
            _settings([*NO_AUTH, f"--kube.instance={bad}"], env)
