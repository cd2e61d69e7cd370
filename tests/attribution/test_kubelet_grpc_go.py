"""The List call against the kubelet's own server stack: grpc-go and the generated k8s.io/kubelet
podresources v1 service at Kubernetes v1.37.2's versions (tests/fixtures/kubelet-grpc-go, built here
with the go command into the neighbours' cache; without Go the tests fail, they do not skip)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.kubelet import PodResourcesClient
from exporter.attribution.podresources_proto import (
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
)
from exporter.errors import PodResourcesError
from tests.attribution.conftest import GPU_UUIDS, MIG_UUIDS
from tests.attribution.grpc_go_server import BUILD_TIMEOUT_SECONDS, build

START_TIMEOUT_SECONDS = 30
# the first test of a worker may build the server: about 150 s on a busy 2-core machine with the
# modules already downloaded, past the suite's 120 s per test
pytestmark = [pytest.mark.integration, pytest.mark.timeout(BUILD_TIMEOUT_SECONDS + 60)]


@pytest.fixture(scope="session")
def kubelet_grpc_go() -> Path:
    """The built server (scripts/setup builds it; a test run after a source change builds it again)."""
    return build()


Serve = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve(kubelet_grpc_go: Path, tmp_path: Path) -> AsyncIterator[Serve]:
    """Start the grpc-go server (answer: a protojson ListPodResourcesResponse); returns its socket."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(answer: dict[str, Any] | None = None, *flags: str) -> str:
        socket_path = str(tmp_path / f"grpc-go-{len(procs)}.sock")
        answer_file = tmp_path / f"answer-{len(procs)}.json"
        answer_file.write_text(json.dumps(answer or {}))
        proc = await asyncio.create_subprocess_exec(
            str(kubelet_grpc_go), "-socket", socket_path, "-answer", str(answer_file), *flags,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            line = await proc.stdout.readline()
        assert line == b"ready\n", f"kubelet-grpc-go did not start: {line!r}"
        return socket_path

    yield start
    for proc in procs:
        proc.kill()
        await proc.wait()


def container(name: str, devices: dict[str, list[str]], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "devices": [
            # topology is a field our reader skips, as are cpu_ids and memory below
            {"resourceName": r, "deviceIds": ids, "topology": {"nodes": [{"ID": "1"}]}}
            for r, ids in devices.items()
        ],
        "cpuIds": ["2", "3"],
        "memory": [{"memoryType": "memory", "size": "1073741824", "topology": {"nodes": [{"ID": "0"}]}}],
        **extra,
    }


async def _list(socket_path: str, timeout_seconds: float) -> tuple[PodResources, ...]:
    client = PodResourcesClient(socket_path, timeout_seconds=timeout_seconds)
    try:
        return await client.list()
    finally:
        await client.close()


async def test_grpc_go_answer_with_devices_claims_and_skipped_fields(serve: Serve) -> None:
    claim = {
        "claimName": "gpu-claim",
        "claimNamespace": "ml",
        "claimResources": [
            {"cdiDevices": [{"name": "k8s.gpu.nvidia.com/device=gpu-3"}], "driverName": "gpu.nvidia.com",
             "poolName": "node-a", "deviceName": "gpu-3"},
            {"driverName": "gpu.nvidia.com", "poolName": "node-a", "deviceName": "gpu-4",
             "shareId": "share-7"},
        ],
    }  # fmt: skip
    answer = {
        "podResources": [
            {"name": "llama-0", "namespace": "serving", "containers": [
                container("vllm", {"nvidia.com/gpu": [GPU_UUIDS[0], GPU_UUIDS[1]]}),
                container("sidecar", {}),
            ]},
            {"name": "small", "namespace": "ml", "containers": [
                container("worker", {"nvidia.com/mig-1g.10gb": [MIG_UUIDS[0]]}, dynamicResources=[claim]),
            ]},
        ]
    }  # fmt: skip
    socket_path = await serve(answer)

    pods = await _list(socket_path, 5.0)

    assert pods == (
        PodResources("llama-0", "serving", (
            ContainerResources("vllm", (ContainerDevices("nvidia.com/gpu", (GPU_UUIDS[0], GPU_UUIDS[1])),)),
            ContainerResources("sidecar", ()),
        )),
        PodResources("small", "ml", (
            ContainerResources(
                "worker",
                (ContainerDevices("nvidia.com/mig-1g.10gb", (MIG_UUIDS[0],)),),
                (DynamicResource("gpu-claim", "ml", (
                    ClaimResource("gpu.nvidia.com", "node-a", "gpu-3", ("k8s.gpu.nvidia.com/device=gpu-3",)),
                    ClaimResource("gpu.nvidia.com", "node-a", "gpu-4", share_id="share-7"),
                )),),
            ),
        )),
    )  # fmt: skip


async def test_grpc_go_answer_of_many_windows(serve: Serve) -> None:
    answer = {
        "podResources": [
            {"name": f"job-{i:05d}", "namespace": "batch",
             "containers": [container("worker", {"nvidia.com/gpu": [GPU_UUIDS[i % 8]]})]}
            for i in range(3000)
        ]
    }  # fmt: skip
    socket_path = await serve(answer)
    pods = await _list(socket_path, 10.0)
    assert [p.name for p in pods] == [f"job-{i:05d}" for i in range(3000)]
    assert pods[2999].containers[0].devices == (ContainerDevices("nvidia.com/gpu", (GPU_UUIDS[2999 % 8],)),)


async def test_grpc_go_status_and_percent_encoded_message(serve: Serve) -> None:
    socket_path = await serve(None, "-fail-code", "8", "-fail-message", "rejected by rate limit: 100% ü")
    with pytest.raises(PodResourcesError) as failed:
        await _list(socket_path, 5.0)
    assert str(failed.value) == "List failed: RESOURCE_EXHAUSTED: rejected by rate limit: 100% ü"


async def test_grpc_go_graceful_stop_during_a_list_lets_the_call_finish(serve: Serve) -> None:
    # the kubelet shutting down (server.GracefulStop) while our List is in flight: its GOAWAY notice
    # (2^31-1) and PING come first, then our answer and the final GOAWAY; the call must succeed
    answer = {"podResources": [{"name": "llama-0", "namespace": "serving", "containers": [
        container("vllm", {"nvidia.com/gpu": [GPU_UUIDS[0]]})]}]}  # fmt: skip
    socket_path = await serve(answer, "-graceful-stop-in-list")
    client = PodResourcesClient(socket_path, timeout_seconds=5.0)
    try:
        pods = await client.list()
        assert [p.name for p in pods] == ["llama-0"]
        with pytest.raises(PodResourcesError):  # stopped: the drained connection is not used again
            await client.list()
        assert client.connections_opened == 1
    finally:
        await client.close()
