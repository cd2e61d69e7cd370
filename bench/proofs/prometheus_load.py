"""What many gpupulse nodes cost one Prometheus: head series, samples/s, RSS and CPU, measured.

One real `gpupulse-exporter --simulate <scenario>` page is captured once and served by a small aiohttp
app as `--targets` scrape targets (same address, a distinct `node` label each, the way a scrape config
adds it). Debian's Prometheus scrapes them every `--interval`; after `--seconds` the script reads
Prometheus' own metrics.

    .venv/bin/python -m bench.proofs.prometheus_load --targets 400 --interval 5s --seconds 120

The served values do not change between scrapes, so chunks compress better than real data would:
read the memory figure as the series' cost (index, labels, head chunk), a floor for real use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from aiohttp import web

from bench.proofs.harness import ProofError, free_port, http_status, wait_until
from bench.proofs.series import capture

PROMETHEUS = Path("/usr/bin/prometheus")


def _query(base: str, expr: str) -> float:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    result = doc["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


async def _serve_page(page: bytes, port: int, stop: asyncio.Event) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await stop.wait()
    await runner.cleanup()


def run(scenario: str, targets: int, interval: str, seconds: float, workdir: Path) -> dict[str, float]:
    """Measure; returns the figures printed."""
    if not PROMETHEUS.exists():
        raise ProofError("prometheus is not installed (/usr/bin/prometheus)")
    page = capture(scenario).encode()
    page_series = sum(1 for ln in page.decode().splitlines() if ln and not ln.startswith("#"))
    exporter_port, prom_port = free_port(), free_port()
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{prom_port}"]}]},
            {
                "job_name": "gpupulse",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"node": f"gpu-{i:05d}"}}
                    for i in range(targets)
                ],
            },
        ],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()
    server = loop.create_task(_serve_page(page, exporter_port, stop))
    thread_result: dict[str, float] = {}

    def measure() -> None:
        prom = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "prometheus.log").open("wb"),
        )
        base = f"http://127.0.0.1:{prom_port}"
        try:
            wait_until(lambda: http_status(base + "/-/ready") == 200, 60, "prometheus ready")
            began = time.monotonic()
            cpu0 = _query(base, 'process_cpu_seconds_total{job="prometheus"}')
            time.sleep(seconds)  # the measurement window itself
            cpu1 = _query(base, 'process_cpu_seconds_total{job="prometheus"}')
            thread_result.update(
                targets=targets,
                series_per_target=page_series,
                head_series=_query(base, "prometheus_tsdb_head_series"),
                gpupulse_series=_query(base, 'count({job="gpupulse"})'),
                samples_per_second=_query(base, "rate(prometheus_tsdb_head_samples_appended_total[1m])"),
                rss_bytes=_query(base, 'process_resident_memory_bytes{job="prometheus"}'),
                heap_inuse_bytes=_query(base, 'go_memstats_heap_inuse_bytes{job="prometheus"}'),
                cpu_cores=(cpu1 - cpu0) / (time.monotonic() - began),
                scrape_max_seconds=_query(base, 'max(scrape_duration_seconds{job="gpupulse"})'),
                up=_query(base, 'sum(up{job="gpupulse"})'),
            )
        finally:
            prom.terminate()
            prom.wait(30)

    async def main_async() -> None:
        await asyncio.to_thread(measure)
        stop.set()
        await server

    loop.run_until_complete(main_async())
    loop.close()
    return thread_result


def main() -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", default="demo")
    parser.add_argument("--targets", type=int, default=400)
    parser.add_argument("--interval", default="5s")
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpupulse-prom-"))
    try:
        r = run(args.scenario, args.targets, args.interval, args.seconds, workdir)
    except ProofError as e:
        print(f"could not run: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    per_series = r["heap_inuse_bytes"] / r["head_series"] if r["head_series"] else 0.0
    print(
        f"\nPrometheus load: {args.targets} x '{args.scenario}' node, every {args.interval},"
        f" {args.seconds:.0f} s"
    )
    for k, v in r.items():
        print(f"  {k:<22} {v:,.3f}")
    print(f"  heap bytes per series  {per_series:,.0f}")
    print(f"  RSS bytes per series   {r['rss_bytes'] / max(1.0, r['head_series']):,.0f}")
    return 0 if r["up"] == args.targets else 1


if __name__ == "__main__":
    raise SystemExit(main())
