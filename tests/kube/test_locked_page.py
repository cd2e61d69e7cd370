"""A node locked by another action: the attempts change nothing, so they are refusals (no restart loop,
no escalation to a migrate), and the page names who holds the node's Lease, when it expires and how to
clear it should that holder be dead."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.errors import TemporaryError
from remediation.kube.client import KubeClient
from remediation.kube.timing import micro_time
from remediation.metrics import RemediationMetrics
from remediation.model import Target
from remediation.settings import EngineSettings, ScopeSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import JSON, FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings
from tests.kube.test_ladder_e2e import LEAK, firing_leak

LEASE = ("gpupulse", "gpupulse-node-gpu-1")


def held_lease(holder: str, renewed: str, duration: int = 900) -> JSON:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE[1], "namespace": LEASE[0], "resourceVersion": "7"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": renewed,
            "renewTime": renewed,
        },
    }


async def test_a_locked_node_pages_with_the_holder_and_the_leases_expiry_instead_of_escalating(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_pod("llm", "vllm-0", "gpu-1", owner=("StatefulSet", "vllm"), labels={"app": "vllm"}, gpus=1)
    renewed = clock.utcnow() - timedelta(seconds=100)
    kube_api.leases[LEASE] = held_lease("replica-b/0badcafe", micro_time(renewed))
    expires = (renewed + timedelta(seconds=900)).strftime("%Y-%m-%dT%H:%M:%SZ")
    engine_clock = FakeClock()
    pager = RecordingPager()
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(scope=ScopeSettings(namespaces=(LEAK["namespace"],))),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=engine_clock,
            backend=KubernetesBackend(kube_client, backend_settings(), clock),
            pager=pager,
        ),
    )
    await engine.handle(firing_leak(engine_clock))
    await engine.wait_idle()
    for _ in range(10):  # the retries' delays (10 s each), stepped
        if pager.firing:
            break
        engine_clock.advance(15)
        await engine.tick()
        await engine.wait_idle()
    (page,) = pager.firing
    assert "could not act" in page.summary
    assert f"locked by replica-b/0badcafe until {expires}" in page.summary
    assert "Lease gpupulse/gpupulse-node-gpu-1" in page.summary
    undo = "if replica-b/0badcafe is gone: kubectl -n gpupulse delete lease gpupulse-node-gpu-1"
    assert undo in page.summary
    actions = [(h["rung"], h["status"]) for h in page.history if h["kind"] == "action"]
    # four refusals of the restart, then the page: no restart loop counted, no migrate attempted
    assert actions[:-1] == [("restart", "refused")] * 4 and actions[-1][0] == "page"
    assert [r.method for r in kube_api.requests if r.method != "GET"] == []
    await engine.aclose()


async def test_a_lease_taken_between_our_read_and_our_create_names_its_winner(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_pod("ml", "llm-0", "gpu-1", owner=("StatefulSet", "llm"), gpus=1)
    renewed = clock.utcnow()

    def race(method: str, path: str) -> None:
        if method == "POST" and path.endswith("/leases") and LEASE not in kube_api.leases:
            kube_api.leases[LEASE] = held_lease("replica-c/5eed5eed", micro_time(renewed), 60)

    kube_api.before.append(race)
    backend = KubernetesBackend(kube_client, backend_settings(), clock)
    with pytest.raises(TemporaryError) as err:
        await backend.restart(Target(kind="pod", namespace="ml", pod="llm-0"), "xid 13")
    assert err.value.nothing_changed
    expires = (renewed + timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"locked by replica-c/5eed5eed until {expires}" in str(err.value)
    assert kube_api.deleted == []
