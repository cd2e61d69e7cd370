"""Targets from the static config file and from annotated pods of this node (fake API server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.engines.kube_pods import KubePodSource, target_from_pod
from exporter.engines.settings import KubeSettings
from exporter.engines.targets import ConfigError, StaticSource, Target, load_config

from .conftest import FakeClock


def test_static_config_entries(tmp_path: Path) -> None:
    path = tmp_path / "engines.yaml"
    path.write_text(
        "engines:\n"
        "  - url: http://127.0.0.1:8000/metrics\n    engine: vllm\n    model: llama\n"
        "    namespace: serving\n    pod: llama-0\n    pid: 4242\n"
        "  - url: http://10.0.0.5:8002/metrics\n"
    )
    assert load_config(path) == [
        Target("http://127.0.0.1:8000/metrics", "vllm", "llama", "serving", "llama-0", 4242),
        Target("http://10.0.0.5:8002/metrics", "auto"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        "engines:\n  - url: ftp://x/metrics\n",
        "engines:\n  - url: http://x:1/metrics\n    engine: llamacpp\n",
        "engines:\n  - engine: vllm\n",
        "engines: {url: x}\n",
        "engines:\n  - url: http://x:1/m\n    pid: abc\n",
    ],
)
def test_static_config_rejects_malformed_entries(tmp_path: Path, body: str) -> None:
    path = tmp_path / "engines.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError):
        load_config(path)


async def test_static_source_keeps_last_good_list_when_file_breaks(tmp_path: Path) -> None:
    path = tmp_path / "engines.yaml"
    path.write_text("- url: http://127.0.0.1:8000/metrics\n")
    source = StaticSource(path)
    assert len(await source.targets()) == 1
    path.write_text("- url: [not, a, string\n")
    import os

    os.utime(path, (1, 1))  # a different mtime even on coarse filesystems
    assert len(await source.targets()) == 1


def pod(
    name: str, annotations: dict[str, str], phase: str = "Running", ip: str = "10.1.2.3"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "serving", "annotations": annotations},
        "status": {"phase": phase, "podIP": ip},
    }


def test_pod_annotations_to_target() -> None:
    t = target_from_pod(
        pod(
            "llama-0",
            {"gpupulse.io/engine": "vllm", "gpupulse.io/port": "9000", "gpupulse.io/model": "llama"},
        )
    )
    assert t == Target("http://10.1.2.3:9000/metrics", "vllm", "llama", "serving", "llama-0")
    trt = target_from_pod(pod("trt", {"gpupulse.io/engine": "trtllm"}))
    assert trt is not None and trt.url == "http://10.1.2.3:8000/prometheus/metrics"
    https = target_from_pod(
        pod("s", {"gpupulse.io/engine": "sglang", "gpupulse.io/scheme": "https", "gpupulse.io/path": "stats"})
    )
    assert https is not None and https.url == "https://10.1.2.3:30000/stats"
    assert target_from_pod(pod("plain", {})) is None
    assert target_from_pod(pod("pending", {"gpupulse.io/engine": "vllm"}, phase="Pending")) is None
    assert target_from_pod(pod("auto", {"gpupulse.io/engine": "auto"})) is None  # auto needs a port
    assert target_from_pod(pod("bad", {"gpupulse.io/engine": "vllm", "gpupulse.io/port": "http"})) is None


@pytest.fixture
async def fake_api(tmp_path: Path) -> AsyncIterator[tuple[str, Path, list[dict[str, Any]], list[str]]]:
    """A tiny API server answering GET /api/v1/pods for one node; records the queries it got."""
    pods: list[dict[str, Any]] = []
    seen: list[str] = []
    token = tmp_path / "token"
    token.write_text("s3cret\n")

    async def list_pods(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        seen.append(request.query.get("fieldSelector", ""))
        node = request.query.get("fieldSelector", "").removeprefix("spec.nodeName=")
        items = [p for p in pods if p.get("spec", {}).get("nodeName") == node]
        return web.json_response({"kind": "PodList", "items": items})

    app = web.Application()
    app.router.add_get("/api/v1/pods", list_pods)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", token, pods, seen
    finally:
        await runner.cleanup()


async def test_kube_source_lists_this_nodes_annotated_pods(
    fake_api: tuple[str, Path, list[dict[str, Any]], list[str]],
) -> None:
    url, token, pods, seen = fake_api
    mine = pod("llama-0", {"gpupulse.io/engine": "vllm"}) | {"spec": {"nodeName": "node-a"}}
    other_node = pod("llama-1", {"gpupulse.io/engine": "vllm"}, ip="10.9.9.9") | {
        "spec": {"nodeName": "node-b"}
    }
    plain = pod("web", {}) | {"spec": {"nodeName": "node-a"}}
    pods += [mine, other_node, plain]
    clock = FakeClock()
    source = KubePodSource(
        KubeSettings("node-a", api_url=url, token_path=token, ca_path=None, refresh_seconds=30), clock
    )
    try:
        targets = await source.targets()
        assert [t.pod for t in targets] == ["llama-0"]
        assert seen == ["spec.nodeName=node-a"]
        pods.clear()
        assert [t.pod for t in await source.targets()] == ["llama-0"]  # cached within refresh_seconds
        clock.now += 31
        assert await source.targets() == []
    finally:
        await source.close()


async def test_kube_source_keeps_targets_when_api_fails(
    fake_api: tuple[str, Path, list[dict[str, Any]], list[str]],
) -> None:
    url, token, pods, _ = fake_api
    pods.append(pod("llama-0", {"gpupulse.io/engine": "vllm"}) | {"spec": {"nodeName": "node-a"}})
    clock = FakeClock()
    source = KubePodSource(KubeSettings("node-a", api_url=url, token_path=token, ca_path=None), clock)
    try:
        assert len(await source.targets()) == 1
        token.write_text("rotated-but-wrong\n")
        clock.now += 60
        assert len(await source.targets()) == 1
    finally:
        await source.close()
