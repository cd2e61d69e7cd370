"""Wiring: settings from config, and a backend built with leader election refuses to act until it leads."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from remediation.backends.kubernetes import settings_from_mapping
from remediation.errors import TemporaryError
from remediation.kube.client import KubeClientSettings
from remediation.kube.leader import LeaderElectionSettings
from remediation.kube.runtime import connect
from remediation.model import Target
from tests.fakes.kube_api import FakeKubeAPI


def test_settings_reject_unknown_keys_and_a_lease_shorter_than_the_drain() -> None:
    s = settings_from_mapping({"namespace": "g", "identity": "a", "gpu_resource_prefixes": ["amd.com/gpu"]})
    assert s.gpu_resource_prefixes == ("amd.com/gpu",)
    with pytest.raises(ValueError, match="unknown"):
        settings_from_mapping({"namespace": "g", "identity": "a", "evict_deadline": 5})
    with pytest.raises(ValueError, match="outlast"):
        settings_from_mapping(
            {
                "namespace": "g",
                "identity": "a",
                "eviction_deadline_seconds": 900,
                "node_lease_duration_seconds": 600,
            }
        )
    with pytest.raises(ValueError, match="on_eviction_deadline"):
        settings_from_mapping({"namespace": "g", "identity": "a", "on_eviction_deadline": "ignore"})


async def test_backend_acts_only_while_its_replica_leads(kube_api: FakeKubeAPI, tmp_path: Path) -> None:
    kube_api.add_node("gpu-1")
    runtime = await connect(
        KubeClientSettings(kubeconfig_path=str(kube_api.write_kubeconfig(tmp_path / "kc"))),
        settings_from_mapping({"namespace": "gpupulse", "identity": "replica-a"}),
        LeaderElectionSettings(
            namespace="gpupulse",
            identity="replica-a",
            lease_duration_seconds=2,
            renew_deadline_seconds=1.2,
            retry_period_seconds=0.2,
        ),
    )
    assert runtime.elector is not None
    with pytest.raises(TemporaryError, match="not the leader"):
        await runtime.backend.migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert kube_api.calls("PATCH", "/nodes/") == []

    done: asyncio.Queue[str] = asyncio.Queue()

    async def lead() -> None:
        result = await runtime.backend.migrate(Target(kind="node", node="gpu-1"), "xid 79")
        await done.put(result.summary)
        await asyncio.Event().wait()

    async def stopped() -> None:
        return None

    task = asyncio.create_task(runtime.elector.run(lead, stopped))
    assert (await asyncio.wait_for(done.get(), 5)).startswith("cordoned gpu-1")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await runtime.close()
