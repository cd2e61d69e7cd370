"""API-server load of engine pod discovery: one LIST and a resumed WATCH, against a LIST per refresh.

Run: .venv/bin/python -m bench.pod_discovery [--seconds 20] [--pods 110]

Both run in the same process against the in-process API server (tests/fakes/kube_api.py) with one
node's pods and the same churn (a pod changes every 0.5 s). The watch is told to end every second
(the production default is 300-600 s), so one run shows many watch cycles; the table scales the
measured requests per cycle to an hour at production settings, per node and for 10,000 nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.engines.kube_pods import KubePodSource
from exporter.kube.client import ApiSettings
from exporter.kube.pods import PodStore
from tests.fakes.kube_api import FakeKubeAPI, parse_bool

OLD_REFRESH_SECONDS = 30.0  # the LIST-per-refresh design this replaces
PRODUCTION = ApiSettings("node")
NODES = 10_000


def _set_ip(ip: str) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        pod["status"]["podIP"] = ip

    return change


def _relabel(generation: str) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        pod["metadata"].setdefault("labels", {})["gen"] = generation

    return change


def _seed(api: FakeKubeAPI, pods: int) -> None:
    for i in range(pods):
        annotations = {"gpupulse.io/engine": "vllm"} if i % 10 == 0 else None
        api.add_pod("serving", f"pod-{i}", "node-a", annotations=annotations)
        api.update_pod("serving", f"pod-{i}", _set_ip(f"10.0.{i // 250}.{i % 250}"))
    for i in range(pods):  # the rest of the cluster
        api.add_pod("serving", f"other-{i}", "node-b")


async def _churn(api: FakeKubeAPI, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        name = f"pod-{n % 20}"
        api.update_pod("serving", name, _relabel(str(n)))
        n += 1
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass


def _counts(api: FakeKubeAPI) -> tuple[int, int]:
    calls = api.calls("GET", r"^/api/v1/pods$")
    watches = sum(1 for r in calls if parse_bool(r.query.get("watch")))
    return len(calls) - watches, watches


async def _watching(api: FakeKubeAPI, token: Path, seconds: float) -> tuple[int, int, float]:
    settings = ApiSettings("node-a", api.url, token, None, watch_timeout_seconds=1.0)
    store = PodStore(settings)
    source = KubePodSource(store)
    started = time.monotonic()
    try:
        await source.targets()
        await asyncio.sleep(seconds)
    finally:
        await store.close()
    lists, watches = _counts(api)
    return lists, watches, time.monotonic() - started


async def run(seconds: float, pods: int) -> None:
    random.seed(1)
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"
        token.write_text("bench-token")
        api = FakeKubeAPI(token="bench-token")
        _seed(api, pods)
        await api.start()
        stop = asyncio.Event()
        churn = asyncio.create_task(_churn(api, stop))
        try:
            lists, watches, elapsed = await _watching(api, token, seconds)
            body = json.dumps({"items": [p for p in api.pods.values() if p["spec"]["nodeName"] == "node-a"]})
        finally:
            stop.set()
            await churn
            await api.stop()
    cycles = watches - 1  # each cycle: one server-ended watch, then the next request
    mean_timeout = PRODUCTION.watch_timeout_seconds * 1.5  # uniform in [timeout, 2 x timeout)
    watch_per_hour = 3600 / mean_timeout
    poll_per_hour = 3600 / OLD_REFRESH_SECONDS
    print(f"measured: {elapsed:.1f} s with 1 s watch timeouts and a pod change every 0.5 s:")
    print(f"  {lists} LIST, {watches} WATCH ({cycles} resumed from their resourceVersion, no relist)")
    print(f"  one LIST of the node's {pods} pods is {len(body):,} bytes")
    print()
    print(
        "| design | requests per node per hour | 10,000 nodes, per hour | per second | full LISTs per hour |"
    )
    print("|---|---:|---:|---:|---:|")
    print(
        f"| LIST every {OLD_REFRESH_SECONDS:.0f} s (before) | {poll_per_hour:.0f} | "
        f"{poll_per_hour * NODES:,.0f} | {poll_per_hour * NODES / 3600:,.0f} | {poll_per_hour:.0f} |"
    )
    print(
        f"| one LIST, then WATCH ({PRODUCTION.watch_timeout_seconds:.0f}-"
        f"{2 * PRODUCTION.watch_timeout_seconds:.0f} s each) | {watch_per_hour:.0f} | "
        f"{watch_per_hour * NODES:,.0f} | {watch_per_hour * NODES / 3600:,.1f} | 0 (1 per restart or 410) |"
    )
    assert lists == 1 and cycles >= 1, "the watch must resume without relisting"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--pods", type=int, default=110, help="pods on the node (the kubelet's default maximum)"
    )
    args = parser.parse_args()
    asyncio.run(run(args.seconds, args.pods))


if __name__ == "__main__":
    main()
