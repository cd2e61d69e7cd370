"""The kill switch leaves Kubernetes Events on the controller's own Pod: `serve --backend kubernetes`
against the in-process API server, then pause, resume and breaker reset through the operator API;
`kubectl describe pod <controller>` shows who switched, when, why, and whether it changed anything.
An Events API that refuses never undoes or fails the switch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from remediation.cli import build_parser, settings_from_flags
from remediation.kube.events import REPORTING_CONTROLLER, switch_event_body
from remediation.kube.serve import serve_kubernetes
from tests.fakes.kube_api import FakeKubeAPI

NAMESPACE, POD = "gpupulse", "gpupulse-remediation-0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events(api: FakeKubeAPI) -> list[dict[str, Any]]:
    found = [o for (_, plural, _, _), o in api.objects.items() if plural == "events"]
    return sorted(found, key=lambda e: str(e["eventTime"]))


@contextlib.asynccontextmanager
async def _controller(tmp_path: Path, api: FakeKubeAPI) -> AsyncIterator[str]:
    """A real `serve --backend kubernetes` (no leader election: it leads) on a free port."""
    port = _free_port()
    argv = [
        "serve", "--insecure-no-auth", "--backend=kubernetes", f"--web.listen-address=127.0.0.1:{port}",
        f"--storage.path={tmp_path / 'state'}", f"--kube.kubeconfig={api.write_kubeconfig(tmp_path / 'kc')}",
        f"--kube.namespace={NAMESPACE}", f"--kube.identity={POD}",
    ]  # fmt: skip
    settings = settings_from_flags(build_parser().parse_args(argv), {})
    task = asyncio.create_task(serve_kubernetes(settings))
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{url}/readyz") as r:
                        if r.status == 200:
                            break
                if task.done():
                    task.result()
                await asyncio.sleep(0.05)
        yield url
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _switch(url: str, path: str, body: dict[str, str]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(f"{url}{path}", json=body) as r:
        assert r.status == 200, await r.text()
        return dict(json.loads(await r.text()))


async def _until(api: FakeKubeAPI, count: int) -> list[dict[str, Any]]:
    for _ in range(100):
        if len(_events(api)) >= count:
            break
        await asyncio.sleep(0.05)
    return _events(api)


async def test_pause_resume_and_breaker_reset_are_events_on_the_controllers_pod(tmp_path: Path) -> None:
    api = FakeKubeAPI()
    await api.start()
    try:
        async with _controller(tmp_path, api) as url:
            await _switch(url, "/api/v1/pause", {"by": "alice", "reason": "draining rack 4"})
            await _switch(url, "/api/v1/resume", {"by": "bob"})
            await _switch(url, "/api/v1/breaker/reset", {"by": "carol", "reason": "budget raised"})
            events = await _until(api, 3)
    finally:
        await api.stop()
    assert [(e["reason"], e["type"]) for e in events] == [
        ("Paused", "Warning"),
        ("Resumed", "Normal"),
        ("BreakerReset", "Normal"),
    ]
    for e in events:
        assert e["metadata"]["namespace"] == NAMESPACE
        assert e["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": NAMESPACE, "name": POD}
        assert e["reportingController"] == REPORTING_CONTROLLER and e["reportingInstance"] == POD
    assert [e["note"] for e in events] == [
        "gpupulse paused by alice (draining rack 4)",
        "gpupulse resumed by bob",
        "gpupulse breaker reset by carol (budget raised): nothing changed (the breaker was not open)",
    ]


async def test_an_events_api_that_refuses_does_not_undo_or_fail_the_switch(tmp_path: Path) -> None:
    api = FakeKubeAPI()
    await api.start()
    try:
        async with _controller(tmp_path, api) as url:
            api.fail("POST", "/events$", 403, "Forbidden", times=1000)
            answer = await _switch(url, "/api/v1/pause", {"by": "alice"})
            assert answer["changed"] is True and answer["paused"]["paused"] is True
            async with aiohttp.ClientSession() as session, session.get(f"{url}/api/v1/stats") as r:
                stats = await r.json()
            assert stats["paused"]["paused"] is True
            for _ in range(100):  # the Event was asked for, and refused
                if api.calls("POST", f"/namespaces/{NAMESPACE}/events$"):
                    break
                await asyncio.sleep(0.05)
            assert api.calls("POST", f"/namespaces/{NAMESPACE}/events$")
    finally:
        await api.stop()
    assert _events(api) == []


def test_a_pause_that_changed_nothing_is_not_a_warning() -> None:
    from datetime import UTC, datetime

    body = switch_event_body(
        "pause", "dave", False, POD, NAMESPACE, POD, datetime(2026, 12, 1, tzinfo=UTC), 1
    )
    assert (body["reason"], body["type"]) == ("Paused", "Normal")
    assert body["note"] == "gpupulse paused by dave: nothing changed (it already was paused)"
    assert body["metadata"]["name"] == f"{POD}.1"
