"""`gpupulse-remediation serve` as a real process with the real engine: acts, survives SIGKILL, stops on
SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.intake import TOKEN, alert, free_port, notification, wait_until

pytestmark = pytest.mark.integration


class Serve:
    """One `python -m remediation serve` process on a free 127.0.0.1 port."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        env = {**os.environ, "GPUPULSE_REMEDIATION_TOKEN": TOKEN}
        env.pop("GPUPULSE_REMEDIATION_INSECURE_NO_AUTH", None)
        self._log = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "remediation",
                "serve",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--storage.path={tmp / 'state'}",
                "--engine.tick-interval=100ms",
                *extra,
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self.ready, 30, "serve /readyz")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"serve exited {self.proc.returncode}: {self.log.read_text()}")
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def post(self, payload: Any) -> int:
        req = urllib.request.Request(
            self.url + "/api/v1/alerts",
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(15)
        finally:
            self._log.close()


def _pending(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM inbox WHERE processed_at IS NULL").fetchone()[0])
    finally:
        conn.close()


def test_serve_acts_on_an_alert_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "restarted"
    script = f"import pathlib,sys; pathlib.Path({str(marker)!r}).write_text(' '.join(sys.argv[1:]))"
    restart = f"{sys.executable} -c {json.dumps(script)} {{namespace}} {{pod}}"
    serve = Serve(tmp_path, f"--backend.local.restart-command={restart}", "--scope.namespaces=serving")
    try:
        leak = alert(
            fingerprint="1eak000000000001", fault_class="memory_leak", namespace="serving", pod="llm-0"
        )
        leak["labels"]["target_kind"] = "pod"
        leak["labels"]["alertname"] = "GPUProcessMemoryAboveHardLimit"
        assert serve.post(notification([leak])) == 200
        wait_until(marker.exists, 20, "the restart command to run")
        assert marker.read_text() == "serving llm-0"
    finally:
        rc = serve.stop(signal.SIGTERM)
    assert rc == 0, serve.log.read_text()
    assert _pending(tmp_path / "state" / "inbox.db") == 0


def test_serve_killed_after_acknowledging_resumes_on_restart(tmp_path: Path) -> None:
    db = tmp_path / "state" / "inbox.db"
    # a 1 ms engine budget makes the first controller fall behind, so rows are pending at the kill
    first = Serve(tmp_path, "--dry-run", "--engine.handle-timeout=1ms")
    statuses = [first.post(notification([alert(fingerprint=f"{i:016x}")])) for i in range(50)]
    first.stop(signal.SIGKILL)
    assert statuses == [200] * 50
    conn = sqlite3.connect(db)
    stored = int(conn.execute("SELECT count(*) FROM inbox").fetchone()[0])
    conn.close()
    assert stored == 50  # every acknowledged alert survived SIGKILL
    left = _pending(db)
    assert left > 0
    second = Serve(tmp_path, "--dry-run")
    try:
        wait_until(lambda: _pending(db) == 0, 20, "the restarted controller to process the leftovers")
    finally:
        assert second.stop() == 0


def test_serve_without_a_token_exits_nonzero(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPULSE_REMEDIATION_")}
    proc = subprocess.run(
        [sys.executable, "-m", "remediation", "serve", f"--storage.path={tmp_path}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "--insecure-no-auth" in proc.stderr
