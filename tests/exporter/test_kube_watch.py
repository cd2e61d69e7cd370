"""The exporter's own LIST/WATCH client (exporter/kube/client.py) under the shared reflector, against an
aiohttp server that answers each request as the test scripts it: streams cut mid-line, ERROR events,
HTTP failures, silent and endless streams, a rotating token. The API server's semantics (selectors,
history, bookmarks) are tests/fakes/kube_api.py's and the real one's (tests/kube/test_real_apiserver.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.attribution.podmeta import pod_metas
from exporter.collectors.self import self_families
from exporter.collectors.training import PodMeta
from exporter.kube.client import ApiSettings, KubeClient, in_cluster_api_url
from exporter.kube.pods import PodStore
from exporter.kube.requests import RequestCounts
from exporter.snapshot import render
from tests.fakes.clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    """One request as the server got it."""

    path: str
    query: dict[str, str]
    authorization: str

    @property
    def watch(self) -> bool:
        return self.query.get("watch") == "true"


@dataclass
class ScriptedAPI:
    """Answers the n-th request with the n-th scripted handler; past the script a WATCH is held open
    quietly (a server with nothing to report) and a LIST fails with 500."""

    script: list[Handler] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    disconnects: int = 0  # handlers ended because the client went away
    url: str = ""
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        seen = Seen(request.path, dict(request.query), request.headers.get("Authorization", ""))
        self.seen.append(seen)
        self._arrived.set()
        handler = (
            self.script.pop(0)
            if self.script
            else (hold() if seen.watch else status(500, "InternalError", "x"))
        )
        try:
            return await handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1
            self._arrived.set()
            raise

    async def wait_requests(self, count: int, timeout_seconds: float = 5.0) -> None:
        await self._wait(lambda: len(self.seen) >= count, timeout_seconds)

    async def wait_disconnects(self, count: int, timeout_seconds: float = 5.0) -> None:
        """Until `count` handlers have ended because their client went away."""
        await self._wait(lambda: self.disconnects >= count, timeout_seconds)

    async def _wait(self, done: Callable[[], bool], timeout_seconds: float) -> None:
        async with asyncio.timeout(timeout_seconds):
            while not done():
                self._arrived.clear()
                await self._arrived.wait()


@pytest.fixture
async def api() -> AsyncIterator[ScriptedAPI]:
    server = ScriptedAPI()
    app = web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    runner = web.AppRunner(app, handler_cancellation=True)  # a client that leaves ends its handler
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv, "labels": {"app": name}}}


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def status_obj(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def listing(*names: str, rv: str = "10") -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        items = [pod(n, rv) for n in names]
        return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": rv}, "items": items})

    return handler


def stream(*chunks: bytes, then_hold: bool = False) -> Handler:
    """A 200 WATCH writing these chunks, then ending (or holding the connection open, silent)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        if then_hold:
            await asyncio.Event().wait()  # until the client leaves (handler cancellation)
        await response.write_eof()
        return response

    return handler


def hold() -> Handler:
    return stream(then_hold=True)


def status(code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(status_obj(code, reason, message), status=code, headers=headers)

    return handler


class RecordedSleep:
    """The reflector's back-off: recorded, not slept."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


class PodMetadataSource(PodStore):
    """The node's pod store with the attribution plug-in's view on it, looked up as these tests do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._metas = self.view("attribution", pod_metas)

    def lookup(self, namespace: str, name: str) -> PodMeta | None:
        return self._metas.value.get((namespace, name))

    def __len__(self) -> int:
        return len(self._metas.value)


def source(
    api: ScriptedAPI, tmp_path: Path, sleep: RecordedSleep | None = None, **settings: Any
) -> PodMetadataSource:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("t0k3n\n")
    kube = ApiSettings("node-a", api.url, token_path=token, ca_path=None, **settings)
    return PodMetadataSource(kube, sleep=sleep or RecordedSleep())


async def test_a_watch_cut_inside_an_event_is_a_failure_that_resumes_from_the_last_event(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    api.script = [listing("a"), stream(event("ADDED", pod("b", "11")), b'{"type": "ADDED", "obj')]
    pods = source(api, tmp_path)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert "the stream ended inside an event" in pods.error
        assert pods.lookup("ns", "a") and pods.lookup("ns", "b")  # what came before the cut is kept
        await api.wait_requests(3)
        assert api.seen[2].watch and api.seen[2].query["resourceVersion"] == "11"  # no relist
        await pods.wait_until(lambda: pods.error == "", 5)  # the next watch was answered
        assert pods.stats.lists == 1
    finally:
        await pods.close()


async def test_an_event_split_over_many_writes_is_put_together(api: ScriptedAPI, tmp_path: Path) -> None:
    line = event("ADDED", pod("b", "11")) + event("BOOKMARK", {"metadata": {"resourceVersion": "12"}})
    api.script = [listing("a"), stream(*(line[i : i + 7] for i in range(0, len(line), 7)), then_hold=True)]
    pods = source(api, tmp_path)
    pods.start()
    try:
        await pods.wait_until(lambda: pods._resource_version == "12", 5)
        assert pods.lookup("ns", "b") is not None and pods.stats.failures == 0
    finally:
        await pods.close()
    await api.wait_disconnects(1)  # closing the source ends its watch on the server


@pytest.mark.parametrize("as_event", [True, False])
async def test_a_410_relists_from_the_last_version_seen_out_of_the_watch_cache(
    api: ScriptedAPI, tmp_path: Path, as_event: bool
) -> None:
    expired = status_obj(410, "Expired", "too old resource version: 11 (20)")
    gone = stream(event("ERROR", expired)) if as_event else status(410, "Expired", expired["message"])
    api.script = [listing("a"), stream(event("ADDED", pod("b", "11"))), gone, listing("c", rv="30")]
    sleep = RecordedSleep()
    pods = source(api, tmp_path, sleep)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.lookup("ns", "c") is not None, 5)
        assert pods.lookup("ns", "a") is None and pods.lookup("ns", "b") is None
        assert pods.stats.relists_after_expired == 1 and pods.stats.failures == 0
        assert pods.stats.quorum_relists == 0 and len(sleep.delays) == 1  # backed off once, as client-go
        relist = api.seen[3].query
        assert not api.seen[3].watch and relist["resourceVersion"] == "11"  # not a quorum read
        assert relist["resourceVersionMatch"] == "NotOlderThan"
        assert "limit" not in relist  # whole: with a limit the server would read it from etcd
        await api.wait_requests(5)
        assert api.seen[4].watch and api.seen[4].query["resourceVersion"] == "30"
    finally:
        await pods.close()


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (410, "Expired", "too old resource version: 11 (40)"),
        (504, "Timeout", "Too large resource version: 11, current: 9"),  # a cache behind the version
    ],
)
async def test_a_relist_whose_version_is_unavailable_falls_back_to_a_quorum_read(
    api: ScriptedAPI, tmp_path: Path, code: int, reason: str, message: str
) -> None:
    expired = event("ERROR", status_obj(410, "Expired", "too old resource version: 11 (20)"))
    api.script = [
        listing("a"),
        stream(event("ADDED", pod("b", "11")), expired),
        status(code, reason, message),
        listing("c", rv="40"),
    ]
    pods = source(api, tmp_path)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.lookup("ns", "c") is not None, 5)
        lists = [s.query for s in api.seen if not s.watch]
        assert [q["resourceVersion"] for q in lists] == ["0", "11", ""]
        assert "resourceVersionMatch" not in lists[2]
        assert pods.stats.quorum_relists == 1 and pods.stats.failures == 0 and pods.error == ""
        await api.wait_requests(5)
        assert api.seen[4].query["resourceVersion"] == "40"
        await pods.wait_until(lambda: pods.stats.watches == 2, 5)
        assert pods._relist_from == "0"  # the next 410 starts from its own last version again
    finally:
        await pods.close()


async def test_an_error_event_of_another_status_is_a_failure_with_its_message(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    api.script = [
        listing("a"),
        stream(event("ERROR", status_obj(500, "InternalError", "etcd leader changed"))),
    ]
    pods = source(api, tmp_path)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert pods.error == "WATCH pods: ERROR event: HTTP 500: InternalError: etcd leader changed"
        assert pods.stats.relists_after_expired == 0
    finally:
        await pods.close()


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (401, "Unauthorized", "Unauthorized"),
        (
            403,
            "Forbidden",
            'pods is forbidden: User "system:serviceaccount:gpupulse:x" cannot watch resource "pods"',
        ),
        (500, "InternalError", "etcdserver: request timed out"),
        (503, "ServiceUnavailable", "the server is currently unable to handle the request"),
    ],
)
async def test_a_failed_watch_keeps_the_objects_says_why_and_backs_off(
    api: ScriptedAPI, tmp_path: Path, code: int, reason: str, message: str
) -> None:
    api.script = [listing("a"), status(code, reason, message), status(code, reason, message)]
    sleep = RecordedSleep()
    pods = source(api, tmp_path, sleep, retry_seconds=1.0, retry_max_seconds=8.0, retry_jitter_ratio=0.0)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 2, 5)
        assert pods.error == f"WATCH pods: HTTP {code}: {reason}: {message}"
        assert pods.lookup("ns", "a") is not None
        assert sleep.delays == [1.0, 2.0]
        await api.wait_requests(4)
        assert {s.query["resourceVersion"] for s in api.seen[1:4]} == {"10"} and pods.stats.lists == 1
    finally:
        await pods.close()


async def test_a_watch_answered_404_lists_again(api: ScriptedAPI, tmp_path: Path) -> None:
    gone = status(404, "NotFound", "the server could not find the requested resource")
    api.script = [listing("a"), gone, listing("a", "b", rv="20")]
    pods = source(api, tmp_path)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.lookup("ns", "b") is not None, 5)
        assert pods.stats.failures == 1 and pods.stats.lists == 2
        assert not api.seen[2].watch  # the collection went away (an upgrade): a resourceVersion means nothing
    finally:
        await pods.close()


async def test_a_failure_that_is_not_a_status_says_what_came(api: ScriptedAPI, tmp_path: Path) -> None:
    async def proxy(request: web.Request) -> web.StreamResponse:
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    api.script = [proxy]
    pods = source(api, tmp_path)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures >= 1, 5)
        assert pods.error == "LIST pods: HTTP 502: <html>bad gateway</html>"
    finally:
        await pods.close()


async def test_a_429_waits_at_least_its_retry_after_within_the_cap(api: ScriptedAPI, tmp_path: Path) -> None:
    def busy(retry_after: str | None) -> Handler:
        headers = {"Retry-After": retry_after} if retry_after else None
        return status(429, "TooManyRequests", "too many requests", headers=headers)

    api.script = [listing("a"), busy("7"), busy(None), busy("3600")]
    sleep = RecordedSleep()
    pods = source(api, tmp_path, sleep, retry_seconds=1.0, retry_max_seconds=10.0, retry_jitter_ratio=0.0)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 3, 5)
        # Retry-After 7 s; then the ordinary doubling (2 s); then an hour's Retry-After, capped
        assert sleep.delays == [7.0, 2.0, 10.0]
        assert pods.error == "WATCH pods: HTTP 429: TooManyRequests: too many requests"
    finally:
        await pods.close()


async def test_a_silent_watch_is_reopened_from_its_resource_version_after_the_idle_deadline(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    api.script = [listing("a"), stream(event("ADDED", pod("b", "11")), then_hold=True)]
    pods = source(api, tmp_path, watch_idle_timeout_seconds=0.3)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.silent_watches == 1, 5)
        await api.wait_requests(3)
        assert api.seen[2].watch and api.seen[2].query["resourceVersion"] == "11"
        assert pods.stats.failures == 0 and pods.error == "" and pods.lookup("ns", "b") is not None
        await api.wait_disconnects(1)  # the silent connection was closed, not left behind
    finally:
        await pods.close()


async def test_a_watch_that_never_answers_fails_after_the_request_timeout(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    async def never(request: web.Request) -> web.StreamResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    api.script = [listing("a"), never]
    pods = source(api, tmp_path, timeout_seconds=0.3)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert pods.error == "WATCH pods: no answer in 0.3 s" and pods.lookup("ns", "a") is not None
    finally:
        await pods.close()


async def test_an_endless_line_is_refused_at_the_event_bound(api: ScriptedAPI, tmp_path: Path) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        while True:  # a line that never ends: only the client's bound stops it
            await response.write(b"x" * 16384)

    api.script = [listing("a"), endless]
    pods = source(api, tmp_path, max_event_bytes=65536)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 10)
        assert pods.error == "WATCH pods: an event over 65536 bytes" and pods.lookup("ns", "a") is not None
    finally:
        await pods.close()


async def test_a_complete_line_over_the_bound_is_refused(api: ScriptedAPI, tmp_path: Path) -> None:
    big = pod("b", "11")
    big["metadata"]["annotations"] = {"blob": "y" * 100_000}
    api.script = [listing("a"), stream(event("ADDED", big))]
    pods = source(api, tmp_path, max_event_bytes=65536)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert "over 65536" in pods.error and pods.lookup("ns", "b") is None
    finally:
        await pods.close()


@pytest.mark.parametrize("sized", [True, False])
async def test_a_list_over_its_bound_is_refused(api: ScriptedAPI, tmp_path: Path, sized: bool) -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)  # no Content-Length: only the bytes read tell
        await response.write(b'{"metadata": {"resourceVersion": "10"}, "items": [' + b" " * 8192 + b"]}")
        await response.write_eof()
        return response

    api.script = [listing(*(f"p{i}" for i in range(200))) if sized else chunked]
    pods = source(api, tmp_path, max_list_bytes=4096)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert pods.error.startswith("LIST pods: a body ") and pods.error.endswith("over 4096 bytes")
        assert len(pods) == 0
    finally:
        await pods.close()


async def test_the_next_request_carries_the_rotated_token(api: ScriptedAPI, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    api.script = [listing("a"), stream(event("ADDED", pod("b", "11")))]
    pods = source(api, tmp_path)
    pods.start()
    try:
        await api.wait_requests(2)
        (tmp_path / "token").write_text("second\n")  # the kubelet rotated the projected token
        await api.wait_requests(3)
        assert [s.authorization for s in api.seen[:3]] == ["Bearer first", "Bearer first", "Bearer second"]
    finally:
        await pods.close()


@pytest.mark.parametrize(
    ("content", "problem"), [("", "is empty"), ("abc\r\nX-Evil: 1\n", "spaces or control characters")]
)
async def test_an_unusable_token_file_is_a_clear_error_and_nothing_is_sent(
    api: ScriptedAPI, tmp_path: Path, content: str, problem: str
) -> None:
    (tmp_path / "token").write_text(content)
    pods = source(api, tmp_path)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert pods.error.startswith("service account token: ") and problem in pods.error
        assert api.seen == []
    finally:
        await pods.close()


def test_the_in_cluster_url_comes_from_the_service_environment() -> None:
    assert in_cluster_api_url({}) == "https://kubernetes.default.svc"
    assert in_cluster_api_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == "https://10.96.0.1:443"
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_api_url(env) == "https://[fd00::1]:6443"


def test_an_exporter_with_every_watch_on_never_imports_kubernetes_asyncio() -> None:
    """A fresh interpreter: every plug-in, every reflector, one LIST and WATCH of the fake API server."""
    code = """
import asyncio, sys, tempfile
from pathlib import Path
from exporter import cli, registry
registry.available_plugins()
from exporter.attribution.podmeta import pod_metas
from exporter.attribution.slices import ResourceSliceSource, SliceSettings
from exporter.engines.kube_pods import KubePodSource
from exporter.progress.pods import progress_pods
from exporter.kube.client import ApiSettings
from exporter.kube.pods import PodStore
from tests.fakes.kube_api import FakeKubeAPI

async def main():
    api = FakeKubeAPI(token="s")
    await api.start()
    api.add_pod("ns", "p", "n")
    token = Path(tempfile.mkdtemp()) / "token"
    token.write_text("s")
    pods = PodStore(ApiSettings("n", api.url, token_path=token, ca_path=None))
    metas = pods.view("attribution", pod_metas)
    KubePodSource(pods); pods.view("progress", progress_pods)
    slices = ResourceSliceSource(SliceSettings("n", api.url, token_path=token, ca_path=None))
    pods.start(); slices.start()
    await pods.wait_until(lambda: ("ns", "p") in metas.value and pods.stats.watches == 1, 10)
    await slices.wait_until(lambda: slices.stats.watches == 1, 10)
    await pods.close(); await slices.close(); await api.stop()

asyncio.run(main())
print(sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes_asyncio"))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


async def test_an_unreadable_ca_file_is_a_clear_error(api: ScriptedAPI, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0k3n\n")
    (tmp_path / "ca.crt").write_text("not a certificate\n")
    for ca, problem in ((tmp_path / "missing.crt", "No such file"), (tmp_path / "ca.crt", "")):
        kube = ApiSettings("node-a", "https://127.0.0.1:1", token_path=tmp_path / "token", ca_path=ca)
        pods = PodMetadataSource(kube, sleep=RecordedSleep())
        pods.start()
        try:
            await pods.wait_until(lambda pods=pods: pods.stats.failures >= 1, 5)
            assert pods.error.startswith(f"CA file {ca}: ") and problem in pods.error, pods.error
        finally:
            await pods.close()


async def test_a_failure_whose_body_never_comes_fails_after_the_request_timeout(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    async def half(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=500, headers={"Content-Length": "1000"})
        await response.prepare(request)
        await asyncio.Event().wait()  # the headers, then nothing of the promised body
        raise AssertionError("unreachable")

    api.script = [listing("a"), half]
    pods = source(api, tmp_path, timeout_seconds=0.3)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert pods.error == "WATCH pods: no answer in 0.3 s"
    finally:
        await pods.close()
    await api.wait_disconnects(1)


# --- servers that close watches at once, page their lists, expire continue tokens, send bookmarks


def clocked(
    api: ScriptedAPI, tmp_path: Path, clock: FakeClock, counts: RequestCounts, **settings: Any
) -> PodMetadataSource:
    """A source on virtual time: its back-off sleeps move the clock, its watches take no time."""
    (tmp_path / "token").write_text("t0k3n\n")
    kube = ApiSettings("node-a", api.url, token_path=tmp_path / "token", ca_path=None, **settings)
    return PodMetadataSource(kube, client_factory=lambda s: KubeClient(s, counts), clock=clock)


async def test_a_server_that_ends_every_watch_at_once_is_backed_off_to_a_trickle(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    # 200, no event, end of stream: the storm of issue 37 (3,479 WATCHes in 1.5 s from one reflector)
    api.script = [listing("a"), *(stream() for _ in range(200))]
    clock, counts = FakeClock(), RequestCounts()
    start = clock.monotonic()
    pods = clocked(api, tmp_path, clock, counts)
    pods.start()
    try:
        await pods.wait_until(lambda: clock.monotonic() - start >= 300 or pods.stats.watches >= 100, 10)
        # 800 ms doubling to 30 s, each stretched by up to as much again: 10 to 15 waits fill 300 s
        assert 11 <= pods.stats.watches <= 16, pods.stats
        assert pods.stats.short_watches == pods.stats.watches - 1 and pods.stats.failures == 0
        bases = [min(0.8 * 2**i, 30.0) for i in range(len(clock.sleeps))]
        assert all(b <= d < 2 * b for b, d in zip(bases, clock.sleeps, strict=True)), clock.sleeps
        assert pods.stats.lists == 1 and pods.lookup("ns", "a") is not None  # the state is kept
    finally:
        await pods.close()
    watches = sum(s.watch for s in api.seen)
    assert counts.snapshot() == {("pods", "LIST", "200"): 1, ("pods", "WATCH", "200"): watches}


async def test_only_a_quiet_spell_resets_the_back_off_never_an_empty_short_watch(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    clock, counts = FakeClock(), RequestCounts()
    long_watch_open, end_long_watch = asyncio.Event(), asyncio.Event()

    async def long_watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        long_watch_open.set()
        await end_long_watch.wait()  # the test moves the clock on meanwhile
        await response.write_eof()
        return response

    api.script = [
        listing("a"),
        stream(),
        stream(),
        stream(event("ADDED", pod("b", "11"))),  # news, at once: reopened at once, the ladder kept
        stream(),
        long_watch,
        stream(),
    ]
    pods = clocked(api, tmp_path, clock, counts, retry_jitter_ratio=0.0)
    pods.start()
    try:
        await long_watch_open.wait()
        assert clock.sleeps == [0.8, 1.6, 3.2]
        clock.advance(121.0)  # a watch that ran past retry_reset_seconds
        end_long_watch.set()
        await pods.wait_until(lambda: len(clock.sleeps) == 4, 5)
        # the long watch ended without news but ran 121 s: not short, no wait; the next short one
        # starts the ladder over
        assert clock.sleeps == [0.8, 1.6, 3.2, 0.8]
        assert pods.stats.short_watches == 4 and pods.lookup("ns", "b") is not None
    finally:
        await pods.close()


def paged(pages: dict[str, tuple[list[str], str]], rv: str = "10") -> Handler:
    """A LIST answered page by page: continue token ("" first) -> (pod names, next token)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        names, token = pages[request.query.get("continue", "")]
        meta = {"resourceVersion": rv, **({"continue": token} if token else {})}
        return web.json_response({"kind": "PodList", "metadata": meta, "items": [pod(n, rv) for n in names]})

    return handler


async def test_a_list_is_read_page_by_page_with_limit_and_continue(api: ScriptedAPI, tmp_path: Path) -> None:
    pages = {"": (["a", "b"], "t1"), "t1": (["c", "d"], "t2"), "t2": (["e"], "")}
    api.script = [paged(pages), paged(pages), paged(pages)]
    pods = source(api, tmp_path, list_page_size=2)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.watches == 1, 5)
        assert len(pods) == 5 and pods.stats.lists == 1 and pods.stats.list_pages == 3
        first, *rest = [s.query for s in api.seen[:3]]
        assert first == {"fieldSelector": "spec.nodeName=node-a", "resourceVersion": "0", "limit": "2"}
        # a continued page names neither the version nor its match: the token carries them
        assert rest == [
            {"fieldSelector": "spec.nodeName=node-a", "continue": t, "limit": "2"} for t in ("t1", "t2")
        ]
        await api.wait_requests(4)
        assert api.seen[3].query["resourceVersion"] == "10"
    finally:
        await pods.close()


async def test_an_expired_continue_token_lists_everything_at_once(api: ScriptedAPI, tmp_path: Path) -> None:
    pages = {"": (["a", "b"], "t1")}
    expired = status(
        410, "Expired", "The provided continue parameter is too old to display a consistent list"
    )
    api.script = [paged(pages), expired, listing("a", "b", "c", rv="12")]
    pods = source(api, tmp_path, list_page_size=2)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.watches == 1, 5)
        assert len(pods) == 3 and pods.stats.expired_continues == 1 and pods.stats.failures == 0
        assert api.seen[2].query == {"fieldSelector": "spec.nodeName=node-a", "resourceVersion": "0"}
        await api.wait_requests(4)
        assert api.seen[3].watch and api.seen[3].query["resourceVersion"] == "12"
    finally:
        await pods.close()


async def test_a_continue_token_that_repeats_is_a_failure_not_a_loop(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    pages = {"": (["a"], "t1"), "t1": (["b"], "t1")}
    api.script = [paged(pages), paged(pages)]
    pods = source(api, tmp_path, list_page_size=1)
    pods.start()
    try:
        await pods.wait_until(lambda: pods.stats.failures == 1, 5)
        assert pods.error == "LIST pods: a continue token that leads nowhere" and len(pods) == 0
    finally:
        await pods.close()


async def test_watches_ask_for_bookmarks_and_resume_from_the_last_one(
    api: ScriptedAPI, tmp_path: Path
) -> None:
    bookmark = event("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "15"}})
    api.script = [listing("a"), stream(bookmark)]
    sleep = RecordedSleep()
    pods = source(api, tmp_path, sleep)
    pods.start()
    try:
        await api.wait_requests(3)
        assert api.seen[1].query["allowWatchBookmarks"] == "true"
        assert api.seen[2].watch and api.seen[2].query["resourceVersion"] == "15"
        assert sleep.delays == [] and pods.stats.short_watches == 0  # a bookmark is news: no back-off
        assert pods.lookup("ns", "a") is not None and pods.stats.lists == 1
    finally:
        await pods.close()


def test_the_requests_are_exported_per_resource_verb_and_answer() -> None:
    counts = RequestCounts()
    assert [f.name for f in self_families({}, None, (), counts)] == [
        "gpupulse_collector_success",
        "gpupulse_collector_duration_seconds",
        "gpupulse_build_info",
    ]  # no request yet: no family
    for verb, code in [("LIST", "200"), ("WATCH", "200"), ("WATCH", "200"), ("WATCH", "<error>")]:
        counts.add("pods", verb, code)
    text = render(self_families({}, None, (), counts)).decode()
    assert "# TYPE gpupulse_kube_requests_total counter" in text
    assert 'gpupulse_kube_requests_total{code="200",resource="pods",verb="WATCH"} 2.0' in text
    assert 'gpupulse_kube_requests_total{code="<error>",resource="pods",verb="WATCH"} 1.0' in text
    assert 'gpupulse_kube_requests_total{code="200",resource="pods",verb="LIST"} 1.0' in text
