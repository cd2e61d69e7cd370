"""The Kubernetes backend's pools and lemons: a cordon that would take too much of a node's pool out is
refused before any write, and a lemon's node is labelled and never auto-uncordoned."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.capacity import WOULD_EXCEED
from remediation.engine import RemediationEngine, build_engine
from remediation.errors import PermanentError, TemporaryError
from remediation.kube.client import KubeClient
from remediation.kube.pools import LEMON_ANNOTATION, LEMON_LABEL
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent, Target
from remediation.settings import EngineSettings, LemonSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings

Make = Callable[..., KubernetesBackend]
POOL = "cloud.google.com/gke-nodepool"


def _pool(api: FakeKubeAPI, name: str, count: int, cordoned: int = 0) -> list[str]:
    nodes = [f"{name}-{i}" for i in range(count)]
    for i, node in enumerate(nodes):
        api.add_node(node, unschedulable=i < cordoned, labels={POOL: name})
    return nodes


def _patches(api: FakeKubeAPI, node: str) -> int:
    return len(api.calls("PATCH", f"/api/v1/nodes/{node}"))


async def test_ten_nodes_at_ten_percent_refuse_a_second_node_out(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    a100 = _pool(kube_api, "a100", 10, cordoned=1)  # a human's cordon takes capacity too
    _pool(kube_api, "h100", 4, cordoned=3)  # another pool's cordons are not this pool's
    backend = make_backend(pool_label=POOL, pool_max_unavailable="10%")
    with pytest.raises(TemporaryError) as refused:
        await backend.migrate(Target(kind="gpu", node=a100[5], uuid="GPU-5"), "xid 79")
    assert refused.value.nothing_changed
    assert WOULD_EXCEED in str(refused.value)
    assert "pool 'cloud.google.com/gke-nodepool=a100' has 10 nodes, 1 out already (a100-0)" in str(
        refused.value
    )
    assert _patches(kube_api, a100[5]) == 0
    assert "unschedulable" not in kube_api.nodes[a100[5]]["spec"]
    # the node already out may still be migrated (it costs the pool nothing more)
    await backend.migrate(Target(kind="node", node=a100[0]), "xid 79")
    # once the human's cordon is lifted, one node of ten may go
    kube_api.nodes[a100[0]]["spec"] = {}
    await backend.migrate(Target(kind="gpu", node=a100[5], uuid="GPU-5"), "xid 79")
    assert kube_api.nodes[a100[5]]["spec"]["unschedulable"] is True


async def test_without_a_pool_label_every_gpu_node_is_one_pool(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    for i in range(10):
        node = kube_api.add_node(f"gpu-{i}")
        node["status"] = {"capacity": {"nvidia.com/gpu": "8"}}
    for i in range(5):
        kube_api.add_node(f"cpu-{i}", unschedulable=True)  # CPU nodes are no GPU capacity
    backend = make_backend(pool_max_unavailable="10%")
    await backend.migrate(Target(kind="node", node="gpu-1"), "xid 79")
    with pytest.raises(TemporaryError, match="the pool of every GPU node has 10 nodes, 1 out already"):
        await backend.migrate(Target(kind="node", node="gpu-2"), "xid 79")


def _xid(clock: FakeClock, fingerprint: str) -> AlertEvent:
    now = clock.utcnow()
    return AlertEvent(
        fingerprint=fingerprint,
        status="firing",
        labels={
            "alertname": "GPUXidResetRequired",
            "severity": "critical",
            "layer": "hardware",
            "fault_class": "xid_reset",
            "xid": "48",
            "target_kind": "gpu",
            "node": "gpu-1",
            "uuid": "GPU-1111",
            "serial": "1652021001234",
        },
        annotations={},
        starts_at=datetime.fromtimestamp(clock.time(), tz=UTC),
        ends_at=None,
        generator_url="http://prometheus/graph",
        receiver="gpupulse",
        group_key="{}:{}",
        received_at=now,
    )


async def test_a_lemon_is_labelled_through_the_engine_and_never_auto_uncordoned(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_node("gpu-2")
    backend = KubernetesBackend(kube_client, backend_settings(auto_uncordon=True), clock)
    engine_clock = FakeClock()
    pager = RecordingPager()
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(lemons=LemonSettings(quarantines=2, window_seconds=7 * 86400)),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=engine_clock,
            backend=backend,
            pager=pager,
        ),
    )
    try:
        first = _xid(engine_clock, "fp-1")
        await engine.handle(first)
        await engine.wait_idle()
        assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True
        assert LEMON_LABEL not in (kube_api.nodes["gpu-1"]["metadata"].get("labels") or {})
        # the first fault is returned to service: auto_uncordon may do that
        await backend.uncordon(Target(kind="gpu", node="gpu-1", uuid="GPU-1111"), "resolved")
        assert "unschedulable" not in kube_api.nodes["gpu-1"]["spec"]
        await engine.handle(
            AlertEvent(**{**first.__dict__, "status": "resolved", "received_at": engine_clock.utcnow()})
        )
        engine_clock.advance(3 * 3600)
        await engine.tick()
        await engine.wait_idle()
        # the same GPU fails again within the week: quarantined a second time, a lemon
        await engine.handle(_xid(engine_clock, "fp-2"))
        await engine.wait_idle()
    finally:
        await engine.aclose()
    meta = kube_api.nodes["gpu-1"]["metadata"]
    assert meta["labels"][LEMON_LABEL] == "true"
    assert meta["annotations"][LEMON_ANNOTATION].startswith(
        "GPUs GPU-1111: GPU GPU-1111 (serial 1652021001234)"
    )
    (rma,) = [p for p in pager.pages if "needs RMA" in p.summary]
    assert "quarantined 2 times" in rma.summary
    with pytest.raises(PermanentError, match="gpu-1 is a lemon"):
        await backend.uncordon(Target(kind="gpu", node="gpu-1", uuid="GPU-1111"), "resolved")
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True


async def test_our_taint_alone_counts_as_out_and_unlabelled_nodes_are_a_pool_of_their_own(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    ours = {"key": "gpupulse.io/remediation", "value": "xid_79", "effect": "NoSchedule"}
    other = {"key": "ops/maintenance", "value": "disk", "effect": "NoSchedule"}
    for i in range(10):
        kube_api.add_node(f"bare-{i}", taints=[ours] if i == 0 else [other])  # no pool label
    _pool(kube_api, "a100", 10, cordoned=0)
    backend = make_backend(pool_label=POOL, pool_max_unavailable="10%")
    with pytest.raises(
        TemporaryError, match=r"pool 'without cloud.google.com/gke-nodepool' has 10 nodes, 1 out"
    ):
        await backend.migrate(Target(kind="node", node="bare-3"), "xid 79")
    await backend.migrate(Target(kind="node", node="a100-3"), "xid 79")  # another pool: room left


async def test_through_the_engine_a_refused_cordon_is_retried_then_pages_and_never_writes(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    a100 = _pool(kube_api, "a100", 10, cordoned=1)
    backend = KubernetesBackend(
        kube_client, backend_settings(pool_label=POOL, pool_max_unavailable="10%"), clock
    )
    engine_clock, pager = FakeClock(), RecordingPager()
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(max_temporary_retries=2),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=engine_clock,
            backend=backend,
            pager=pager,
        ),
    )
    try:
        event = _xid(engine_clock, "fp-pool")
        event = replace(event, labels={**event.labels, "node": a100[4]})
        await engine.handle(event)
        await engine.wait_idle()
        for _ in range(3):
            engine_clock.advance(61)  # blocked_retry_delay_seconds: capacity may have come back
            await engine.tick()
            await engine.wait_idle()
        (incident,) = engine.list_incidents()
        detail = engine.get_incident(int(incident["id"]))
    finally:
        await engine.aclose()
    assert detail is not None and detail["state"] == "paged"
    assert [h["status"] for h in detail["history"] if h["kind"] == "action" and h["rung"] == "migrate"] == [
        "refused"
    ] * 3
    (page,) = pager.firing
    assert "could not act: migrate refused 3 times, nothing changed: migrate of a100-4 " in page.summary
    assert WOULD_EXCEED in page.summary
    assert _patches(kube_api, a100[4]) == 0


async def test_nothing_on_a_lemon_node_returns_by_validation_or_auto_uncordon(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    """A device quarantine (DeviceTaintRule) on a lemon's node: neither the validation nor
    auto-uncordon deletes the rule, and no validation Job is started."""
    from remediation.kube.validation import ValidationSettings

    kube_api.add_node("gpu-1")
    devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in range(2)]
    kube_api.add_resourceslice("s", "gpu-1", "gpu.nvidia.com", "gpu-1", devices)
    target = Target(kind="gpu", node="gpu-1", uuid="GPU-1")
    validation = ValidationSettings(namespace="gpupulse", image="registry.example/dcgm:test")
    backend = make_backend(validation=validation, auto_uncordon=True)
    await backend.migrate(target, "xid 48")
    assert len(kube_api.dra.rules) == 1
    await backend.mark_lemon("gpu-1", ["GPU-1"], "GPU GPU-1 quarantined 2 times within 1w")
    with pytest.raises(PermanentError, match="node gpu-1 is a lemon"):
        await backend.return_to_service(target, "xid_reset", 7, 1)
    with pytest.raises(PermanentError, match="node gpu-1 is a lemon"):
        await backend.uncordon(target, "resolved")
    assert len(kube_api.dra.rules) == 1
    assert not kube_api.calls("POST", "/jobs")
