"""Fakes for the controller's intake tests: an Engine that records, an in-process service harness,
payload builders, and a real Alertmanager (the current line's, demo/neighbours.py) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp

from demo.neighbours import CURRENT, DEBIAN, line
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent, Engine
from remediation.server import RunningService, start_service
from remediation.settings import Settings
from tests.fakes.clock import FakeClock

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "alertmanager"
# the payloads each line's Alertmanager really sends (0.3x adds notification_reason and routeLabels)
FIXTURES_BY_LINE = {DEBIAN: FIXTURES, CURRENT: FIXTURES / "0.3x"}
TOKEN = "s3cret-token-for-tests"


class FakeEngine:
    """Records what intake hands it; can be told to fail or block; implements the Engine protocol."""

    def __init__(self) -> None:
        self.handled: list[AlertEvent] = []
        self.calls: list[AlertEvent] = []  # every attempt, failed ones included
        self.ticks = 0
        self.controls: list[tuple[str, str]] = []
        self.fail_times: dict[str, int] = {}  # dedup_key → failures still to raise
        self.fail_always = False
        self.gate: asyncio.Event | None = None  # when set, handle waits for it
        self.incidents: list[dict[str, Any]] = [
            {"id": 1, "state": "open", "fault_class": "xid_app", "ledger": [{"rung": "restart"}]},
            {"id": 2, "state": "resolved", "fault_class": "memory_leak", "ledger": []},
        ]
        self._changed = asyncio.Condition()

    async def handle(self, event: AlertEvent) -> None:
        self.calls.append(event)
        await self._notify()
        if self.gate is not None:
            await self.gate.wait()
        left = self.fail_times.get(event.dedup_key, 0)
        if self.fail_always or left > 0:
            self.fail_times[event.dedup_key] = left - 1
            raise RuntimeError(f"engine failure for {event.dedup_key}")
        if all(e.dedup_key != event.dedup_key for e in self.handled):  # idempotent, like the real one
            self.handled.append(event)
        await self._notify()

    async def tick(self) -> None:
        self.ticks += 1
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], within_seconds: float = 5.0) -> None:
        """Wait until predicate() holds after some engine call (no sleeping)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), within_seconds)

    def list_incidents(
        self, state: str | None = None, limit: int = 100, signature: str | None = None
    ) -> Sequence[Mapping[str, Any]]:
        found = [i for i in self.incidents if state is None or i["state"] == state]
        return [i for i in found if signature is None or i.get("signature") == signature][:limit]

    def get_incident(self, incident_id: int) -> Mapping[str, Any] | None:
        return next((i for i in self.incidents if i["id"] == incident_id), None)

    def list_signatures(self) -> Sequence[Mapping[str, Any]]:
        return [
            {"name": "xid-app-restart", "fault_class": "xid_app", "rungs": ["restart", "migrate", "page"]}
        ]

    def stats(self) -> Mapping[str, Any]:
        return {"incidents": 2, "handled_without_human_ratio": 0.5}

    def pause(self, by: str) -> Mapping[str, Any]:
        self.controls.append(("pause", by))
        return {}

    def resume(self, by: str) -> Mapping[str, Any]:
        self.controls.append(("resume", by))
        return {}

    def reset_breaker(self, by: str) -> Mapping[str, Any]:
        self.controls.append(("reset_breaker", by))
        return {}


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings for an in-process service on a free 127.0.0.1 port with fast timers."""
    base = Settings(
        listen_host="127.0.0.1",
        listen_port=0,
        auth_token=TOKEN,
        storage_path=tmp_path / "state",
        engine_tick_interval_seconds=0.05,
        worker_retry_initial_seconds=0.05,
        worker_retry_max_seconds=0.2,
        shutdown_grace_seconds=2.0,
    )
    return replace(base, **overrides)


@dataclass
class Harness:
    """A running service with its fake engine and an HTTP session."""

    service: RunningService
    engine: FakeEngine
    session: aiohttp.ClientSession
    metrics: RemediationMetrics
    headers: dict[str, str] = field(default_factory=lambda: {"Authorization": f"Bearer {TOKEN}"})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.port}"

    @property
    def inbox_path(self) -> Path:
        """The inbox file."""
        return self.service.ctl.settings.inbox_path

    async def post_alerts(self, payload: Any, headers: Mapping[str, str] | None = None) -> Reply:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        hdrs = dict(self.headers if headers is None else headers)
        hdrs.setdefault("Content-Type", "application/json")
        async with self.session.post(f"{self.url}/api/v1/alerts", data=body, headers=hdrs) as resp:
            return Reply(resp.status, dict(resp.headers), await resp.read())

    async def json(self, reply: Reply) -> Any:
        return json.loads(reply.body)


@dataclass(frozen=True)
class Reply:
    """A finished HTTP response."""

    status: int
    headers: Mapping[str, str]
    body: bytes


async def start_harness(
    settings: Settings, engine: FakeEngine | None = None, clock: FakeClock | None = None
) -> Harness:
    fake = engine or FakeEngine()
    metrics = RemediationMetrics()

    async def factory(_s: Settings, _m: RemediationMetrics) -> Engine:
        return fake

    service = await start_service(settings, factory, metrics=metrics, clock=clock)
    return Harness(service, fake, aiohttp.ClientSession(), metrics)


def count_rows(db_path: Path, where: str = "1") -> int:
    """Rows in the inbox, read through a fresh connection (what survives if the process died now)."""
    import sqlite3

    conn = sqlite3.connect(db_path)
    try:
        return int(conn.execute(f"SELECT count(*) FROM inbox WHERE {where}").fetchone()[0])
    finally:
        conn.close()


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def notification(
    alerts: Sequence[Mapping[str, Any]] | None = None, status: str = "firing", **extra: Any
) -> dict[str, Any]:
    """A minimal valid webhook payload (shape of the recorded ones)."""
    if alerts is None:
        alerts = [alert()]
    doc: dict[str, Any] = {
        "version": "4",
        "groupKey": '{}:{alertname="GPUXidAppError"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "gpupulse",
        "groupLabels": {"alertname": "GPUXidAppError"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }
    doc.update(extra)
    return doc


def alert(
    fingerprint: str = "443b1680bcd2a640",
    status: str = "firing",
    starts_at: str = "2026-11-30T00:25:25.886825742Z",
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": "GPUXidAppError", "fault_class": "xid_app", "node": "n1", **labels},
        "annotations": {"summary": "XID 13 on GPU-1"},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T00:30:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }


# --- real Alertmanager ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll an external process's state until it holds (external processes offer no event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Alertmanager:
    """A real Alertmanager on 127.0.0.1 whose one receiver posts to `webhook_url` with a bearer token."""

    def __init__(self, workdir: Path, webhook_url: str, token_file: Path, line_name: str = CURRENT) -> None:
        self.binary = line(line_name).alertmanager  # MissingNeighbourError when not built: the test fails
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "route": {
                "receiver": "gpupulse",
                "group_by": ["alertname", "node"],
                # 1s, not 0s: Alertmanager 0.3x flushes a new group as soon as its first alert lands,
                # so with 0s the second alert of one POST comes in a later notification (0.25 sent both)
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "gpupulse",
                    "webhook_configs": [
                        {
                            "url": webhook_url,
                            "send_resolved": True,
                            # authorization.credentials_file: 0.25 and 0.3x (bearer_token_file is the
                            # older spelling)
                            "http_config": {
                                "authorization": {"type": "Bearer", "credentials_file": str(token_file)}
                            },
                        }
                    ],
                }
            ],
        }
        self.config_file = workdir / "alertmanager.yml"
        self.config_file.write_text(json.dumps(config))  # JSON is YAML
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self.log_file = workdir / "alertmanager.log"

    def __enter__(self) -> Alertmanager:
        self.start()
        return self

    def start(self) -> None:
        """Start the process and wait until it reports ready (blocking: call via asyncio.to_thread)."""
        self._log = self.log_file.open("wb")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                f"--config.file={self.config_file}",
                f"--storage.path={self.workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        wait_until(self._ready, 15, "Alertmanager /-/ready")

    def _ready(self) -> bool:
        import urllib.request

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"alertmanager exited: {self.log_file.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def post(self, alerts: list[dict[str, Any]]) -> None:
        """Post alerts through the v2 API, as Prometheus does."""
        import urllib.request

        req = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Terminate the process (kill after 5 s)."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
