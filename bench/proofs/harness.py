"""Shared parts of the reliability proofs: the controller and the fake API as processes, alerts, a pager sink.

Everything binds 127.0.0.1 on free ports; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import web

REPO = Path(__file__).resolve().parents[2]
TOKEN = "gpupulse-proof-token"
KUBE_TOKEN = "gpupulse-test-token"
STARTS_AT = "2026-11-30T00:00:00Z"


class ProofError(Exception):
    """A proof's precondition or deadline failed (not the property under test)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], within_seconds: float, what: str, every: float = 0.05) -> None:
    """Poll an external process's state until predicate() holds, or raise ProofError."""
    deadline = time.monotonic() + within_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise ProofError(f"timed out after {within_seconds} s waiting for {what}")
        time.sleep(every)


def alert(fingerprint: str, labels: Mapping[str, str], status: str = "firing") -> dict[str, Any]:
    """One Alertmanager webhook alert."""
    return {
        "status": status,
        "labels": {"severity": "critical", **labels},
        "annotations": {"summary": "proof"},
        "startsAt": STARTS_AT,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }


def notification(alerts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An Alertmanager webhook notification (version 4) carrying `alerts`."""
    return {
        "version": "4",
        "groupKey": '{}:{alertname=~".+"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "gpupulse",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def leak_alert(i: int, node: str = "") -> dict[str, Any]:
    """memory_leak on pod ns-<i%50>/pod-<i> (on node-<i%500> unless given): the first rung is a restart."""
    return alert(
        f"{i:016x}",
        {
            "alertname": "GPUProcessMemoryAboveHardLimit",
            "layer": "workload",
            "fault_class": "memory_leak",
            "target_kind": "pod",
            "namespace": f"ns-{i % 50}",
            "pod": f"pod-{i}",
            "node": node or f"node-{i % 500}",
        },
    )


def xid79_alert(node: str, fault_class: str = "gpu_lost") -> dict[str, Any]:
    """XID 79 (GPU fell off the bus) on one node, target_kind node."""
    return alert(
        f"79{abs(hash(node)) % 16**14:014x}",
        {
            "alertname": "GPUFellOffBus",
            "layer": "hardware",
            "fault_class": fault_class,
            "xid": "79",
            "target_kind": "node",
            "node": node,
        },
    )


def post(url: str, payload: Any, timeout_seconds: float = 10.0) -> int:
    """POST a webhook with the bearer token; the HTTP status, or 0 when no answer came."""
    req = urllib.request.Request(
        url + "/api/v1/alerts",
        data=json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_seconds) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def http_status(url: str, timeout_seconds: float = 1.0) -> int:
    """GET status code, 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def rss_bytes(pid: int) -> int:
    """VmRSS of a process from /proc/<pid>/status (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


@dataclass
class Serve:
    """One `python -m remediation serve` process on a free port."""

    workdir: Path
    args: Sequence[str]
    name: str = "serve"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def start(self, wait_ready: bool = True, within_seconds: float = 60.0) -> None:
        """Start (or restart) the process; wait for /readyz (or only /healthz for a follower)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPULSE_REMEDIATION_")}
        env["GPUPULSE_REMEDIATION_TOKEN"] = TOKEN
        env["PYTHONPATH"] = str(REPO)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "remediation",
                "serve",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *self.args,
            ],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.starts += 1
        path = "/readyz" if wait_ready else "/healthz"
        wait_until(lambda: self._answers(path), within_seconds, f"{self.name} {path}")

    def _answers(self, path: str) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise ProofError(f"{self.name} exited: {self.log_tail()}")
        return http_status(self.url + path) == 200

    def ready(self) -> bool:
        """/readyz answers 200."""
        return http_status(self.url + "/readyz") == 200

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self._close_log()

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_log()
        return int(self.proc.returncode)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class FakeKube:
    """`python -m tests.fakes.kube_api` as a process, seeded from a JSON document."""

    workdir: Path
    seed: Mapping[str, Any]
    proc: subprocess.Popen[str] | None = None
    url: str = ""
    _log: IO[bytes] | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def start(self) -> None:
        """Start the server and read its URL from the first line it prints."""
        seed_path = self.workdir / "cluster.json"
        seed_path.write_text(json.dumps(self.seed))
        self._log = (self.workdir / "kube_api.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fakes.kube_api",
                f"--kubeconfig={self.kubeconfig}",
                f"--seed={seed_path}",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise ProofError(f"fake API did not start: {(self.workdir / 'kube_api.log').read_text()}")

    def _get(self, path: str) -> Any:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {KUBE_TOKEN}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def requests(self) -> list[dict[str, Any]]:
        """The request log (method, path, query, body), oldest first."""
        return list(self._get("/_fake/requests"))

    def state(self) -> dict[str, Any]:
        """Nodes, pods, leases and deletions as the fake holds them now."""
        return dict(self._get("/_fake/state"))

    def stop(self) -> None:
        """SIGTERM, wait, and close the pipes."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


def writes(log: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """API writes that are actions (not Lease bookkeeping): deletes, evictions, node/Deployment patches."""
    return [r for r in log if r["method"] in ("DELETE", "POST", "PATCH") and "/leases" not in r["path"]]


class PagerSink:
    """A tiny aiohttp webhook receiver that records every page body (run inside the proof's loop)."""

    def __init__(self) -> None:
        self.pages: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/page"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        self.pages.append(await request.json())
        return web.json_response({"status": "ok"})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def inbox_rows(storage: Path) -> dict[str, tuple[int, float | None]]:
    """fingerprint → (row count, processed_at of the last row) from the inbox file."""
    conn = sqlite3.connect(storage / "inbox.db")
    try:
        out: dict[str, tuple[int, float | None]] = {}
        for fp, n, processed in conn.execute(
            "SELECT fingerprint, count(*), max(processed_at) FROM inbox GROUP BY fingerprint"
        ):
            out[str(fp)] = (int(n), processed)
        return out
    finally:
        conn.close()


def query(db: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one read query against a controller SQLite file."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        return [tuple(r) for r in conn.execute(sql, tuple(params))]
    finally:
        conn.close()


def print_table(title: str, rows: Sequence[tuple[str, str, bool | None]]) -> bool:
    """Print `check | measured | ok` rows; True when none failed."""
    print(f"\n{title}")
    width = max(len(r[0]) for r in rows)
    ok_all = True
    for name, value, ok in rows:
        mark = "" if ok is None else ("PASS" if ok else "FAIL")
        ok_all = ok_all and ok is not False
        print(f"  {name.ljust(width)}  {value:<40} {mark}")
    print(f"  => {'PASS' if ok_all else 'FAIL'}")
    return ok_all


async def sleep_until(predicate: Callable[[], bool], within_seconds: float, what: str) -> None:
    """Async poll of an external process's state (HTTP, files) with a deadline."""
    deadline = time.monotonic() + within_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise ProofError(f"timed out after {within_seconds} s waiting for {what}")
        await asyncio.sleep(0.05)
