"""Benchmark of the remediation controller's webhook intake and alert → first action latency.

Runs, in one go and on this machine:
  1. a bare aiohttp handler (read body, json.loads, 200) as the ceiling for this HTTP stack;
  2. `gpupulse-remediation serve` (real engine, dry-run) with synchronous=FULL, then NORMAL:
     closed-loop throughput (C concurrent keep-alive clients for D seconds) and, open loop,
     acknowledgement latency at a fixed 500 alerts/s (measured from each request's scheduled time);
  3. alert → first action: the local backend's restart command records when it ran.
Servers run as subprocesses; the load generator is this process (one asyncio loop). Prints markdown.

    .venv/bin/python bench/remediation.py [--seconds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
# run as a script, this file's directory leads sys.path and this file would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
FIXTURE = REPO / "tests" / "fixtures" / "alertmanager" / "firing.json"
TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_bare_server(port: int, decoder: str = "json") -> None:
    """The baseline: the least an aiohttp JSON webhook can do (stdlib json, or orjson as intake uses)."""
    import orjson
    from aiohttp import web

    loads = orjson.loads if decoder == "orjson" else json.loads

    async def handle(request: web.Request) -> web.Response:
        loads(await request.read())
        return web.json_response({"status": "ok"})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/api/v1/alerts", handle)
    app.router.add_get("/readyz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


class NoopEngine:
    """Engine that accepts every event and does nothing (isolates the intake's own cost)."""

    handled = 0

    async def handle(self, event: Any) -> None:
        self.handled += 1

    async def tick(self) -> None:
        return None

    def list_incidents(
        self, state: str | None = None, limit: int = 100, signature: str | None = None
    ) -> list[Any]:
        return []

    def get_incident(self, incident_id: int) -> None:
        return None

    def list_signatures(self) -> list[Any]:
        return []

    def stats(self) -> dict[str, Any]:
        return {}

    def pause(self, by: str) -> dict[str, Any]:
        return {}

    def resume(self, by: str) -> dict[str, Any]:
        return {}

    def reset_breaker(self, by: str) -> dict[str, Any]:
        return {}


def run_noop_controller(port: int, storage: str, sync: str) -> None:
    """The real intake service (auth, validation, inbox, worker) in front of a no-op engine."""
    from remediation.metrics import RemediationMetrics
    from remediation.model import Engine
    from remediation.server import serve
    from remediation.settings import Settings

    async def factory(_s: Settings, _m: RemediationMetrics) -> Engine:
        return NoopEngine()

    settings = Settings(
        listen_host="127.0.0.1",
        listen_port=port,
        auth_token=TOKEN,
        storage_path=Path(storage),
        storage_synchronous="NORMAL" if sync == "NORMAL" else "FULL",
        queue_max_pending=10_000_000,
    )
    asyncio.run(serve(settings, factory))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    db: Path | None

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server never became ready")


def start_bare(decoder: str = "json") -> Server:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--bare-server", str(port), decoder])
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, proc)
    return Server(proc, url, None)


def start_noop_controller(storage: Path, sync: str) -> Server:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--noop-controller", str(port), str(storage), sync], cwd=REPO
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, proc)
    return Server(proc, url, storage / "inbox.db")


def start_controller(storage: Path, *flags: str) -> Server:
    port = free_port()
    env = {**os.environ, "GPUPULSE_REMEDIATION_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "remediation",
            "serve",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.path={storage}",
            "--queue.max-pending=10000000",
            "--log.level=error",
            "--scope.namespaces=serving",  # the recorded notification's pods
            *flags,
        ],
        env=env,
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, proc)
    return Server(proc, url, storage / "inbox.db")


class Payloads:
    """The recorded Alertmanager notification, with a fresh fingerprint per request."""

    def __init__(self, alerts_per_request: int = 1) -> None:
        self.base = json.loads(FIXTURE.read_text())
        self.alerts_per_request = alerts_per_request
        self.n = 0

    def next(self, **labels: str) -> bytes:
        doc = dict(self.base)
        alerts = []
        for _ in range(self.alerts_per_request):
            self.n += 1
            a = dict(self.base["alerts"][0])
            a["fingerprint"] = f"{self.n:016x}"
            a["labels"] = {**a["labels"], "pod": f"bench-{self.n}", **labels}
            alerts.append(a)
        doc["alerts"] = alerts
        return json.dumps(doc).encode()


PREGENERATED_BODIES = 60_000
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


async def closed_loop(
    url: str, seconds: float, concurrency: int, alerts_per_request: int
) -> dict[str, float]:
    """C clients post back to back for `seconds`; returns alerts/s and ack latency percentiles."""
    payloads = Payloads(alerts_per_request)
    # bodies made before the clock starts, so the load generator spends its core on HTTP only
    bodies = [payloads.next() for _ in range(PREGENERATED_BODIES)]
    latencies: list[float] = []
    errors = 0
    sent = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        end = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal errors, sent
            while time.perf_counter() < end:
                body = bodies[sent] if sent < len(bodies) else payloads.next()
                sent += 1
                t0 = time.perf_counter()
                async with session.post(url + "/api/v1/alerts", data=body, headers=HEADERS) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        continue
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {
        "alerts_per_second": len(latencies) * alerts_per_request / elapsed,
        "p50_ms": _pct(latencies, 50) * 1000,
        "p99_ms": _pct(latencies, 99) * 1000,
        "errors": errors,
    }


async def open_loop(url: str, rate_per_second: float, seconds: float) -> dict[str, float]:
    """Requests at fixed times (one alert each); latency counts from the scheduled time."""
    payloads = Payloads(1)
    n = int(rate_per_second * seconds)
    bodies = [payloads.next() for _ in range(n)]
    latencies: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:

        async def one(scheduled: float, body: bytes) -> None:
            nonlocal errors
            async with session.post(url + "/api/v1/alerts", data=body, headers=HEADERS) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    return
            latencies.append(time.perf_counter() - scheduled)

        tasks = []
        start = time.perf_counter()
        for i in range(n):
            scheduled = start + i / rate_per_second
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(scheduled, bodies[i])))
        await asyncio.gather(*tasks)
    return {"p50_ms": _pct(latencies, 50) * 1000, "p99_ms": _pct(latencies, 99) * 1000, "errors": errors}


async def alert_to_action(url: str, marks: Path, count: int, rate_per_second: float) -> dict[str, float]:
    """Post leak alerts (restart is their first rung); the restart command writes its wall time per pod."""
    payloads = Payloads(1)
    sent: dict[str, float] = {}
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            body = payloads.next(fault_class="memory_leak", alertname="GPUProcessMemoryAboveHardLimit")
            sent[f"bench-{payloads.n}"] = time.time()
            async with session.post(url + "/api/v1/alerts", data=body, headers=HEADERS) as r:
                await r.read()
            await asyncio.sleep(max(0.0, start + (i + 1) / rate_per_second - time.monotonic()))
    delays = await asyncio.to_thread(_collect_marks, marks, sent, 30.0)
    return {
        "acted": len(delays),
        "sent": count,
        "p50_ms": _pct(delays, 50) * 1000,
        "p99_ms": _pct(delays, 99) * 1000,
        "max_ms": max(delays, default=float("nan")) * 1000,
    }


def _collect_marks(marks: Path, sent: dict[str, float], timeout_seconds: float) -> list[float]:
    """Wait (polling files another process writes) until every action ran, then read the delays."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline and len(list(marks.iterdir())) < len(sent):
        time.sleep(0.1)
    delays = []
    for pod, t0 in sent.items():
        f = marks / pod
        text = f.read_text().strip() if f.exists() else ""
        if text:
            delays.append(float(text) - t0)
    return delays


def queue_drain_seconds(url: str, timeout_seconds: float = 300.0) -> float:
    """Seconds until /readyz reports an empty queue (the engine caught up)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_seconds:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
            if json.loads(r.read()).get("queue_depth", 0) == 0:
                return time.monotonic() - start
        time.sleep(0.05)
    return float("nan")


def _pct(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # bare | bare-orjson | noop | engine
    sync: str = "FULL"
    per_request: int = 1


CASES = (
    Case("bare aiohttp handler (read, json.loads, 200)", "bare"),
    Case("bare aiohttp handler with orjson.loads", "bare-orjson"),
    Case("intake + no-op engine, synchronous=FULL", "noop"),
    Case("intake + no-op engine, synchronous=NORMAL", "noop", "NORMAL"),
    Case("controller (real engine, dry-run), FULL", "engine"),
    Case("controller (real engine, dry-run), FULL, 10 alerts/request", "engine", per_request=10),
)


def start_case(case: Case, storage: Path) -> Server:
    if case.kind == "bare":
        return start_bare()
    if case.kind == "bare-orjson":
        return start_bare("orjson")
    if case.kind == "noop":
        return start_noop_controller(storage, case.sync)
    return start_controller(storage, "--dry-run", f"--storage.synchronous={case.sync}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run every measurement and print the markdown table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each closed-loop run")
    ap.add_argument("--rounds", type=int, default=3, help="closed-loop rounds per case (best one reported)")
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    ap.add_argument("--open-loop-seconds", type=float, default=10.0)
    ap.add_argument("--actions", type=int, default=200, help="alerts for the alert → action measurement")
    ap.add_argument("--bare-server", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--noop-controller", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.bare_server:
        run_bare_server(int(args.bare_server[0]), args.bare_server[1])
        return 0
    if args.noop_controller:
        port, storage, sync = args.noop_controller
        run_noop_controller(int(port), storage, sync)
        return 0

    best: dict[str, dict[str, float]] = {}
    load: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        # rounds interleave the cases, so background load on a shared machine hits them alike
        for rnd in range(args.rounds):
            for i, case in enumerate(CASES):
                server = start_case(case, Path(tmp) / f"{rnd}-{i}")
                try:
                    cpu0 = server.cpu()
                    r = asyncio.run(closed_loop(server.url, args.seconds, args.concurrency, case.per_request))
                    requests = r["alerts_per_second"] * args.seconds / case.per_request
                    r["server_cpu_us_per_request"] = (server.cpu() - cpu0) / max(1.0, requests) * 1e6
                    if case.kind == "engine":
                        r["engine_drain_seconds"] = queue_drain_seconds(server.url)
                        r["engine_alerts_per_second"] = (
                            r["alerts_per_second"] * args.seconds / (args.seconds + r["engine_drain_seconds"])
                        )
                finally:
                    server.stop()
                load.append(os.getloadavg()[0])
                if r["alerts_per_second"] > best.get(case.name, {}).get("alerts_per_second", -1.0):
                    best[case.name] = r
        open_loop_results = {}
        for kind in ("noop", "engine"):
            server = start_case(Case("open", kind), Path(tmp) / f"open-{kind}")
            try:
                open_loop_results[kind] = asyncio.run(open_loop(server.url, 500, args.open_loop_seconds))
            finally:
                server.stop()
        marks = Path(tmp) / "marks"
        marks.mkdir()
        restart = f"/bin/sh -c 'date +%s.%N > \"$0\"' {marks}/{{pod}}"
        server = start_controller(
            Path(tmp) / "action",
            f"--backend.local.restart-command={restart}",
            "--engine.tick-interval=100ms",
            "--safety.max-actions-per-minute=100000",
            "--safety.max-concurrent-actions=10000",
            "--cluster.node-count=1000",
        )
        try:
            action = asyncio.run(alert_to_action(server.url, marks, args.actions, 20))
        finally:
            server.stop()

    def f(x: float) -> str:
        return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"

    bare_rate = best[CASES[0].name]["alerts_per_second"]
    bare_orjson_rate = best[CASES[1].name]["alerts_per_second"]
    print(
        f"\n{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average during the runs "
        f"{min(load):.1f}-{max(load):.1f}; closed loop: {args.concurrency} keep-alive clients x "
        f"{args.seconds:.0f} s, best of {args.rounds} interleaved rounds\n"
    )
    print(
        "| run | alerts/s | vs bare | vs bare (orjson) | ack p50 ms | ack p99 ms | server CPU µs/request "
        "| engine caught up |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for case in CASES:
        r = best[case.name]
        caught = (
            f"{r['engine_drain_seconds']:.1f} s after the load ({f(r['engine_alerts_per_second'])} alerts/s)"
            if "engine_drain_seconds" in r
            else ""
        )
        print(
            f"| {case.name} | {f(r['alerts_per_second'])} | {r['alerts_per_second'] / bare_rate:.2f} | "
            f"{r['alerts_per_second'] / bare_orjson_rate:.2f} | "
            f"{f(r['p50_ms'])} | {f(r['p99_ms'])} | {f(r['server_cpu_us_per_request'])} | {caught} |"
        )
    secs = args.open_loop_seconds
    print(
        f"\n| open loop, 500 alerts/s for {secs:.0f} s (1 alert/request) | ack p50 ms | ack p99 ms | errors |"
    )
    print("|---|---:|---:|---:|")
    for kind, label in (("noop", "intake + no-op engine"), ("engine", "controller (real engine, dry-run)")):
        r = open_loop_results[kind]
        print(f"| {label} | {f(r['p50_ms'])} | {f(r['p99_ms'])} | {r['errors']:.0f} |")
    print("\n| alert → first action (local restart command ran) | alerts | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(f"| leak alerts at 20/s, real engine | {action['acted']:.0f}/{action['sent']:.0f} | "
          f"{f(action['p50_ms'])} | {f(action['p99_ms'])} | {f(action['max_ms'])} |")  # fmt: skip
    print("\nJSON: " + json.dumps({"closed": best, "open": open_loop_results, "action": action}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
