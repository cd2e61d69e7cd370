"""Targets from the static config file and from annotated pods of this node (fake API server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.engines.kube_pods import KubePodSource, target_from_pod
from exporter.engines.targets import StaticSource, Target, load_config
from exporter.errors import ConfigError
from exporter.kube.client import ApiSettings as KubeSettings
from exporter.kube.pods import PodStore
from exporter.kube.reflector import ReflectorStats
from tests.fakes.kube_api import FakeKubeAPI, parse_bool


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


# --- this node's pods, from one LIST and a WATCH (tests/fakes/kube_api.py speaks the watch cache's semantics)

ENGINE = {"gpupulse.io/engine": "vllm"}


def _running(
    api: FakeKubeAPI, namespace: str, name: str, node: str, ip: str, annotations: dict[str, str]
) -> None:
    api.add_pod(namespace, name, node, annotations=annotations)
    api.update_pod(namespace, name, lambda p: p["status"].update(podIP=ip))


class GatedSleep:
    """The source's back-off sleep, held until the test releases it; records each delay."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await self.gate.wait()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FakeKubeAPI]:
    server = FakeKubeAPI(token="s3cret")
    await server.start()
    (tmp_path / "token").write_text("s3cret\n")
    try:
        yield server
    finally:
        await server.stop()


class _Discovery(KubePodSource):
    """Engine discovery on a pod store of its own, closed with it, read as these tests do."""

    def __init__(self, kube: KubeSettings, sleep: GatedSleep) -> None:
        self.store = PodStore(kube, sleep=sleep)
        super().__init__(self.store)

    @property
    def stats(self) -> ReflectorStats:
        return self.store.stats

    @property
    def error(self) -> str:
        return self.store.error

    @property
    def _targets(self) -> list[Target]:
        return self.view.value

    async def wait_until(self, predicate: Callable[[], bool], timeout_seconds: float) -> None:
        await self.store.wait_until(predicate, timeout_seconds)

    async def close(self) -> None:
        await self.store.close()


def _source(api: FakeKubeAPI, tmp_path: Path, sleep: GatedSleep | None = None, **settings: Any) -> _Discovery:
    kube = KubeSettings("node-a", api_url=api.url, token_path=tmp_path / "token", ca_path=None, **settings)
    return _Discovery(kube, sleep or GatedSleep())


def _pods(source_targets: list[Target]) -> list[str]:
    return [t.pod for t in source_targets]


def _pod_requests(api: FakeKubeAPI, watch: bool) -> list[dict[str, str]]:
    return [r.query for r in api.calls("GET", r"^/api/v1/pods$") if parse_bool(r.query.get("watch")) is watch]


async def test_one_list_then_a_watch_follows_this_nodes_pods(api: FakeKubeAPI, tmp_path: Path) -> None:
    _running(api, "serving", "llama-0", "node-a", "10.1.0.1", ENGINE)
    _running(api, "serving", "llama-1", "node-b", "10.1.0.2", ENGINE)
    api.add_pod("serving", "web-0", "node-a")
    source = _source(api, tmp_path)
    try:
        assert _pods(await source.targets()) == ["llama-0"]
        (listing,) = _pod_requests(api, watch=False)
        # served from the API server's watch cache, only this node's pods
        assert listing == {"fieldSelector": "spec.nodeName=node-a", "resourceVersion": "0", "limit": "500"}
        await source.wait_until(lambda: source.stats.watches == 1, 5)
        # a new engine pod becomes a target once it runs with an IP
        api.add_pod("serving", "qwen-0", "node-a", annotations=ENGINE, phase="Pending")
        api.update_pod("serving", "qwen-0", lambda p: p["status"].update(phase="Running", podIP="10.1.0.3"))
        await source.wait_until(lambda: _pods(source._targets) == ["llama-0", "qwen-0"], 5)
        # losing the annotation, or being deleted, removes it
        api.update_pod("serving", "llama-0", lambda p: p["metadata"]["annotations"].clear())
        await source.wait_until(lambda: _pods(source._targets) == ["qwen-0"], 5)
        api.remove_pod("serving", "qwen-0")
        await source.wait_until(lambda: source._targets == [], 5)
        # another node's pods never arrive
        _running(api, "serving", "llama-2", "node-b", "10.1.0.4", ENGINE)
        assert _pods(await source.targets()) == []
        (watch,) = _pod_requests(api, watch=True)
        assert watch["fieldSelector"] == "spec.nodeName=node-a" and parse_bool(watch["allowWatchBookmarks"])
        assert int(watch["timeoutSeconds"]) >= 300
        assert source.stats.lists == 1 and source.stats.failures == 0
    finally:
        await source.close()
    await api.wait_open_watches(0)  # closing ends the watch on the server too


async def test_a_watch_that_ends_resumes_from_its_resource_version_without_listing(
    api: FakeKubeAPI, tmp_path: Path
) -> None:
    _running(api, "serving", "llama-0", "node-a", "10.1.0.1", ENGINE)
    source = _source(api, tmp_path)
    try:
        await source.targets()
        for n in range(3):
            await source.wait_until(lambda n=n: source.stats.watches == n + 1, 5)
            await api.wait_open_watches(1)
            api.close_watches()  # the server's watch timeout, or an API server restart
            await api.wait_open_watches(0)
        await source.wait_until(lambda: source.stats.watches == 4, 5)
        await api.wait_open_watches(1)
        _running(api, "serving", "qwen-0", "node-a", "10.1.0.3", ENGINE)
        await source.wait_until(lambda: len(source._targets) == 2, 5)
        watches = _pod_requests(api, watch=True)
        assert [w["resourceVersion"] for w in watches[1:]] == [watches[0]["resourceVersion"]] * 3
        assert source.stats.lists == 1 and source.stats.relists_after_expired == 0
    finally:
        await source.close()


async def test_an_expired_resource_version_relists_the_current_state(
    api: FakeKubeAPI, tmp_path: Path
) -> None:
    _running(api, "serving", "llama-0", "node-a", "10.1.0.1", ENGINE)
    sleep = GatedSleep()
    source = _source(api, tmp_path, sleep, short_watch_seconds=0.0)  # the closed watch is no failure
    try:
        await source.targets()
        await api.wait_open_watches(1)
        # the next watch fails, and while the source backs off the cluster moves on and compacts
        sleep.gate.clear()
        api.fail("GET", r"^/api/v1/pods$", 503, "ServiceUnavailable")
        api.close_watches()
        await source.wait_until(lambda: source.stats.failures == 1, 5)
        api.remove_pod("serving", "llama-0")
        _running(api, "serving", "qwen-0", "node-a", "10.1.0.3", ENGINE)
        api.compact()
        assert _pods(await source.targets()) == ["llama-0"]  # the last good state meanwhile
        sleep.gate.set()
        await source.wait_until(lambda: _pods(source._targets) == ["qwen-0"], 5)
        assert source.stats.relists_after_expired == 1
        first, second = _pod_requests(api, watch=False)
        (watch, *_) = _pod_requests(api, watch=True)
        assert first["resourceVersion"] == "0"
        # from the last version seen, out of the watch cache: no quorum read while that serves
        assert second["resourceVersion"] == watch["resourceVersion"]
        assert second["resourceVersionMatch"] == "NotOlderThan"
    finally:
        await source.close()


@pytest.mark.parametrize("bookmarks", [True, False])
async def test_bookmarks_keep_the_resource_version_fresh_across_compaction(
    api: FakeKubeAPI, tmp_path: Path, bookmarks: bool
) -> None:
    _running(api, "serving", "llama-0", "node-a", "10.1.0.1", ENGINE)
    source = _source(api, tmp_path)
    try:
        await source.targets()
        await api.wait_open_watches(1)
        for i in range(5):  # other nodes' churn moves the resourceVersion past our last event
            api.add_pod("batch", f"job-{i}", "node-b")
        if bookmarks:
            api.bookmark()
            await source.wait_until(lambda: source.store._resource_version == str(api._rv), 5)
        api.compact()
        api.close_watches()
        await source.wait_until(lambda: source.stats.watches == 2, 5)
        await api.wait_open_watches(1)
        assert source.stats.relists_after_expired == (0 if bookmarks else 1)
        assert _pods(source._targets) == ["llama-0"]
    finally:
        await source.close()


async def test_api_errors_keep_the_last_good_targets_and_back_off(api: FakeKubeAPI, tmp_path: Path) -> None:
    _running(api, "serving", "llama-0", "node-a", "10.1.0.1", ENGINE)
    sleep = GatedSleep()
    source = _source(
        api,
        tmp_path,
        sleep,
        retry_seconds=1.0,
        retry_max_seconds=4.0,
        retry_jitter_ratio=0.0,
        short_watch_seconds=0.0,
    )
    try:
        await source.targets()
        await api.wait_open_watches(1)
        (tmp_path / "token").write_text("rotated-but-wrong\n")  # re-read on every request
        api.close_watches()
        await source.wait_until(lambda: source.stats.failures >= 4, 5)
        assert sleep.delays[:4] == [1.0, 2.0, 4.0, 4.0]  # doubling, capped
        assert _pods(await source.targets()) == ["llama-0"]
        (tmp_path / "token").write_text("s3cret\n")
        _running(api, "serving", "qwen-0", "node-a", "10.1.0.3", ENGINE)
        await source.wait_until(lambda: len(source._targets) == 2, 5)
        assert source.stats.lists == 1  # resumed from its resourceVersion, no relist
    finally:
        await source.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json at all\n",
        b'{"type": "ADDED", "object": {"metadata": {}}}\n',
        b'{"type": "WEIRD", "object": 1}\n',
    ],
)
async def test_a_corrupt_watch_stream_is_a_failure_not_a_crash(
    api: FakeKubeAPI, tmp_path: Path, garbage: bytes
) -> None:
    _running(api, "serving", "llama-0", "node-a", "10.1.0.1", ENGINE)
    source = _source(api, tmp_path)
    api.inject_watch_lines.append(garbage)
    try:
        assert _pods(await source.targets()) == ["llama-0"]
        await source.wait_until(lambda: source.stats.failures == 1, 5)
        await api.wait_open_watches(1)
        _running(api, "serving", "qwen-0", "node-a", "10.1.0.3", ENGINE)
        await source.wait_until(lambda: len(source._targets) == 2, 5)
    finally:
        await source.close()


async def test_a_hung_api_server_never_blocks_targets(tmp_path: Path) -> None:
    async def say_nothing(request: web.Request) -> web.StreamResponse:
        await asyncio.Event().wait()  # never a status line; cancelled when the client goes away
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/{tail:.*}", say_nothing)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    (tmp_path / "token").write_text("s3cret\n")
    sleep = GatedSleep()
    kube = KubeSettings(
        "node-a",
        api_url=f"http://127.0.0.1:{port}",
        token_path=tmp_path / "token",
        ca_path=None,
        timeout_seconds=0.3,
    )
    source = _Discovery(kube, sleep)
    try:
        async with asyncio.timeout(2):
            assert await source.targets() == []  # waited at most timeout_seconds for a first sync
        await source.wait_until(lambda: source.stats.failures >= 1, 5)
        assert source.error == "LIST pods: no complete answer in 0.3 s"
        async with asyncio.timeout(0.1):
            assert await source.targets() == []
    finally:
        await source.close()
        await runner.cleanup()  # every connection closed by the source: no handler left to wait for
