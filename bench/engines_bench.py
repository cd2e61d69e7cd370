"""Engine-collector benchmark: N simulated engines scraped concurrently, CPU and wall time per round;
and, with --hostile, the exporter's memory and scrape latency beside hostile endpoints.

Run: .venv/bin/python -m bench.engines_bench [--engines 4] [--rounds 50]
     .venv/bin/python -m bench.engines_bench --hostile [--seconds 120]
The simulated engines run in their own processes, so the CPU measured is the collector's alone
(process_time covers every thread of this process).

--hostile runs the real exporter twice on the simulated 16-GPU node, both times with 4 healthy
simulated engines and --engines.interval 2: once alone, once with six hostile endpoints beside them
(80,000 series of a mapped family under the byte cap, a 16 MiB page, a slow drip, a hang, binary
garbage, a vLLM page with a broken sidecar). It reports the exporter's RSS (VmRSS) after the run,
scrape latency from 10 concurrent clients, and how many healthy engines stayed up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from exporter.collectors.base import NodeState
from exporter.engines.collector import EnginesCollector
from exporter.engines.settings import EngineSettings
from exporter.engines.targets import Target

_KINDS = ("vllm", "sglang", "tgi", "vllm")


class _Targets:
    def __init__(self, targets: list[Target]) -> None:
        self._targets = targets

    async def targets(self) -> list[Target]:
        return self._targets

    async def close(self) -> None:
        return None


async def _start_engines(n: int, scenario: Path) -> tuple[list[asyncio.subprocess.Process], list[Target]]:
    procs, targets = [], []
    for i in range(n):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from exporter.sim.engines import main; main()",
            "--scenario", str(scenario), "--engine", f"e{i}", "--listen", "127.0.0.1:0", "--speed", "60",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
        procs.append(proc)
        targets.append(Target(line[-1], model=f"model-{i}", namespace="bench", pod=f"engine-{i}"))
    return procs, targets


async def run(engines: int, rounds: int) -> dict[str, float]:
    """Measure `rounds` collection rounds over `engines` simulated engines."""
    section = [
        {"name": f"e{i}", "kind": _KINDS[i % len(_KINDS)], "model": f"model-{i}"} for i in range(engines)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "bench.yaml"
        scenario.write_text(
            yaml.safe_dump({"name": "bench", "gpus": [{"model": "H100-SXM5-80GB"}], "engines": section})
        )
        procs, targets = await _start_engines(engines, scenario)
        collector = EnginesCollector([_Targets(targets)], EngineSettings())
        cpu_ms, wall_ms, series = [], [], 0
        try:
            await collector.collect(NodeState())  # warm-up: sessions, imports, first PID lookups
            for _ in range(rounds):
                c0, w0 = time.process_time(), time.perf_counter()
                metrics = await collector.collect(NodeState())
                cpu_ms.append((time.process_time() - c0) * 1e3)
                wall_ms.append((time.perf_counter() - w0) * 1e3)
                series = sum(len(m.samples) for m in metrics)
        finally:
            await collector.close()
            for p in procs:
                p.terminate()
                await p.wait()
    cpu_sorted = sorted(cpu_ms)
    return {
        "engines": engines,
        "rounds": rounds,
        "cpu_ms_mean": statistics.fmean(cpu_ms),
        "cpu_ms_p95": cpu_sorted[int(0.95 * (len(cpu_sorted) - 1))],
        "wall_ms_mean": statistics.fmean(wall_ms),
        "series_out": series,
    }


_VLLM_PAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engines" / "vllm-0.33.0.prom"


def _serve_hostile(port_file: str) -> None:
    """Hostile engine endpoints on a free port (written to port_file), until killed."""
    from aiohttp import web

    flood = "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{model_name="m{i}",engine="0"}} {i}\n' for i in range(80_000)
    )
    row = 'vllm:num_requests_waiting{model_name="x"} 1\n'
    huge = ("# TYPE vllm:num_requests_waiting gauge\n" + row * 380_000).encode()  # 16 MiB
    garbage = os.urandom(1 << 20)
    sidecar = _VLLM_PAGE.read_text() + "# TYPE sidecar_up gauge\nsidecar_up{instance=broken} 1\n"

    async def drip(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            for i in range(10_000):
                await resp.write(f'vllm:num_requests_running{{model_name="d{i}"}} 1\n'.encode())
                await asyncio.sleep(0.05)
        except ConnectionResetError:
            pass  # the exporter gave up at its deadline, as it should
        return resp

    async def hang(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(3600)
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/flood", lambda _: _text(flood))
    app.router.add_get("/huge", lambda _: _bytes(huge))
    app.router.add_get("/garbage", lambda _: _bytes(garbage))
    app.router.add_get("/sidecar", lambda _: _text(sidecar))
    app.router.add_get("/drip", drip)
    app.router.add_get("/hang", hang)

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        await asyncio.to_thread(Path(port_file).write_text, str(runner.addresses[0][1]))
        await asyncio.Event().wait()

    asyncio.run(run())


async def _text(text: str) -> Any:
    from aiohttp import web

    return web.Response(text=text)


async def _bytes(body: bytes) -> Any:
    from aiohttp import web

    return web.Response(body=body)


HOSTILE_PATHS = ("flood", "huge", "drip", "hang", "garbage", "sidecar")


def _exporter_run(
    targets: list[dict[str, str]], seconds: float, tmp: Path, tag: str, root: Path | None = None
) -> dict[str, float]:
    from bench.exporter import _free_port, _percentile, _proc_stats, _scrape_latencies

    config = tmp / f"engines-{tag}.yaml"
    config.write_text(yaml.safe_dump({"engines": targets}))
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    cmd = [sys.executable, "-m", "exporter.cli", "--simulate", "large", "--web.listen-address",
           f"127.0.0.1:{port}", "--log.level", "error", "--engines.config", str(config),
           "--engines.interval", "2", "--no-collector.pagecache", "--no-collector.attribution"]  # fmt: skip
    root = root or Path(__file__).resolve().parents[1]
    with subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            asyncio.run(_scrape_latencies(url, 5, 0.0))  # wait until it serves, warm up
            time.sleep(seconds)
            latencies = asyncio.run(_scrape_latencies(url, 100, 0.0))
            rss, _ = _proc_stats(proc.pid)
            up = _healthy_up(url, [t["url"] for t in targets if "/metrics" in t["url"]])
        finally:
            proc.terminate()
            proc.wait(10)
    return {
        "rss_mib": rss,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * _percentile(latencies, 0.99),
        "healthy_up": up,
    }


def _healthy_up(url: str, healthy: list[str]) -> float:
    from urllib.request import urlopen

    with urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    up = 0.0
    for line in text.splitlines():
        if line.startswith("inference_engine_up{") and any(f'endpoint="{h}"' in line for h in healthy):
            up += float(line.rsplit(" ", 1)[1])
    return up


def _spawn_engines(n: int, scenario: Path) -> tuple[list[subprocess.Popen[bytes]], list[Target]]:
    procs, targets = [], []
    for i in range(n):
        proc = subprocess.Popen(
            [sys.executable, "-c", "from exporter.sim.engines import main; main()",
             "--scenario", str(scenario), "--engine", f"e{i}", "--listen", "127.0.0.1:0", "--speed", "60"],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().split()[-1]
        procs.append(proc)
        targets.append(Target(url, model=f"model-{i}", namespace="bench", pod=f"engine-{i}"))
    return procs, targets


def hostile(seconds: float, compare_root: Path | None = None) -> None:
    """RSS and scrape latency of the exporter with 4 healthy engines, alone and beside hostile endpoints."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        scenario = tmp / "engines.yaml"
        section = [{"name": f"e{i}", "kind": _KINDS[i], "model": f"model-{i}"} for i in range(4)]
        scenario.write_text(
            yaml.safe_dump({"name": "b", "gpus": [{"model": "H100-SXM5-80GB"}], "engines": section})
        )
        port_file = tmp / "hostile.port"
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.engines_bench", "--serve-hostile", str(port_file)]
        )
        procs, targets = _spawn_engines(4, scenario)
        try:
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.1)
            base = f"http://127.0.0.1:{port_file.read_text()}"
            healthy = [{"url": t.url, "pod": t.pod, "namespace": t.namespace} for t in targets]
            bad = [{"url": f"{base}/{path}", "pod": f"hostile-{path}"} for path in HOSTILE_PATHS]
            rows = [
                ("4 healthy engines", _exporter_run(healthy, seconds, tmp, "healthy")),
                ("4 healthy + 6 hostile endpoints", _exporter_run(healthy + bad, seconds, tmp, "hostile")),
            ]
            if compare_root is not None:  # the same two runs with another checkout's exporter
                rows += [
                    (
                        f"4 healthy engines ({compare_root.name})",
                        _exporter_run(healthy, seconds, tmp, "h0", compare_root),
                    ),
                    (
                        f"4 healthy + 6 hostile endpoints ({compare_root.name})",
                        _exporter_run(healthy + bad, seconds, tmp, "x0", compare_root),
                    ),
                ]
        finally:
            for p in [*procs, server]:
                p.terminate()
                p.wait(10)
    print(f"Exporter (--simulate large, 16 GPUs) with --engines.interval 2, RSS after {seconds:.0f} s:")
    print()
    print("| endpoints | RSS MiB | scrape p50 ms | scrape p99 ms | healthy engines up |")
    print("|---|---|---|---|---|")
    for label, r in rows:
        cells = f"{r['rss_mib']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['healthy_up']:.0f} of 4"
        print(f"| {label} | {cells} |")
    growth = rows[1][1]["rss_mib"] - rows[0][1]["rss_mib"]
    print()
    print(f"RSS growth beside the hostile endpoints: {growth:+.1f} MiB")


def main() -> None:
    """Print one table row per engine count (or the --hostile table)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engines", type=int, nargs="+", default=[4])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--hostile", action="store_true", help="exporter RSS and latency beside hostile endpoints")
    p.add_argument("--seconds", type=float, default=120.0, help="how long each --hostile run lasts")
    p.add_argument("--compare-root", type=Path, default=None, help="also run --hostile with this checkout")
    p.add_argument("--serve-hostile", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_hostile:
        _serve_hostile(args.serve_hostile)
        return
    if args.hostile:
        hostile(args.seconds, args.compare_root)
        return
    print(f"{'engines':>7} {'rounds':>6} {'cpu ms/round':>12} {'cpu p95':>8} {'wall ms':>8} {'series':>7}")
    for n in args.engines:
        r = asyncio.run(run(n, args.rounds))
        print(
            f"{r['engines']:>7} {r['rounds']:>6} {r['cpu_ms_mean']:>12.2f} {r['cpu_ms_p95']:>8.2f} "
            f"{r['wall_ms_mean']:>8.2f} {r['series_out']:>7}"
        )


if __name__ == "__main__":
    main()
