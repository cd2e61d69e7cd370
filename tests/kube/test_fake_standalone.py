"""The fake API server as its own process (for proofs that run the controller out of process)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.kube.client import KubeClient, KubeClientSettings
from remediation.model import Target
from tests.kube.conftest import StepClock, backend_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
async def test_standalone_fake_serves_seeded_cluster_and_its_request_log(tmp_path: Path) -> None:
    seed = tmp_path / "cluster.json"
    seed.write_text(
        json.dumps(
            {
                "nodes": [{"name": "gpu-1"}],
                "pods": [
                    {
                        "namespace": "ml",
                        "name": "w-0",
                        "node": "gpu-1",
                        "owner": ["StatefulSet", "w"],
                        "gpus": 1,
                    }
                ],
            }
        )
    )
    kubeconfig = tmp_path / "kc"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.kube_api",
        "--kubeconfig",
        str(kubeconfig),
        "--seed",
        str(seed),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        assert url.startswith("http://127.0.0.1:")
        async with await KubeClient.connect(KubeClientSettings(kubeconfig_path=str(kubeconfig))) as client:
            backend = KubernetesBackend(client, backend_settings(), StepClock())
            result = await backend.migrate(Target(kind="gpu", node="gpu-1", uuid="GPU-1"), "xid 79")
            assert result.details["evicted"] == ["ml/w-0"]
        headers = {"Authorization": "Bearer gpupulse-test-token"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{url}/_fake/requests", headers=headers) as resp,
        ):
            requests = await resp.json()
        assert [r["method"] for r in requests if "/eviction" in r["path"]] == ["POST"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
