"""Requests per node that the exporter's reflectors send a real kube-apiserver, across an API-server restart.

Run: .venv/bin/python -m bench.reflector_requests [--minutes 10] [--nodes 50] [--restart-at-minutes 5]

Starts the control plane of tests/kube/realapi.py (etcd, kube-apiserver, kube-controller-manager built
by scripts/neighbours), creates --nodes Node objects with --pods-per-node pods and one ResourceSlice
each, and runs, per node, what an exporter runs: a pod reflector and a ResourceSlice reflector
(exporter/kube/reflector.py, production settings: watches of 300-600 s, bookmarks, back-off from
800 ms to 30 s). A thread changes one pod every --churn-seconds. At --restart-at-minutes the API
server is stopped (SIGTERM), kept down --down-seconds and started again on the same etcd: every watch
breaks at once, the reflectors back off while it is down, and the new server's watch cache decides
what their resourceVersions are still worth. Every request is counted per node (KubeClient's
RequestCounts); the table gives requests per node by resource, verb and answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from exporter.attribution.slices import ResourceSliceSource, SliceSettings
from exporter.kube.client import ApiSettings, KubeClient
from exporter.kube.pods import PodStore
from exporter.kube.reflector import Reflector
from exporter.kube.requests import RequestCounts
from tests.kube.realapi import (
    ADMIN_TOKEN,
    ControlPlane,
    KubeHTTPError,
    RealKube,
    add_node,
    ensure_namespace,
    env_missing_reason,
)

NAMESPACE = "bench"


@dataclass
class Node:
    """One node's exporter: its two reflectors and the requests they sent."""

    name: str
    counts: RequestCounts = field(default_factory=RequestCounts)
    reflectors: list[Reflector] = field(default_factory=list)


def _seed(kube: RealKube, nodes: list[str], pods_per_node: int) -> list[str]:
    ensure_namespace(kube, NAMESPACE)
    names = []
    for node in nodes:
        add_node(kube, node)
        for i in range(pods_per_node):
            name = f"{node}-pod-{i}"
            kube.post(
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"gen": "0"}},
                 "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}},
            )  # fmt: skip
            names.append(name)
        kube.post(
            "/apis/resource.k8s.io/v1/resourceslices",
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{node}-gpus"},
             "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                      "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                      "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": f"GPU-{node}"}}}]}},
        )  # fmt: skip
    return names


def _churn(kube: RealKube, pods: list[str], every_seconds: float, stop: threading.Event) -> None:
    n = 0
    while not stop.wait(every_seconds):
        n += 1
        with contextlib.suppress(KubeHTTPError, OSError):  # the API server is down for a while
            path = f"/api/v1/namespaces/{NAMESPACE}/pods/{random.choice(pods)}"
            kube.merge_patch(path, {"metadata": {"labels": {"gen": str(n)}}})


def _reflectors(node: Node, plane: ControlPlane, token: Path) -> None:
    def client(s: ApiSettings) -> KubeClient:
        return KubeClient(s, node.counts)

    pods = ApiSettings(node.name, plane.url, token_path=token, ca_path=plane.ca_file)
    slices = SliceSettings(node.name, plane.url, token_path=token, ca_path=plane.ca_file)
    node.reflectors = [
        PodStore(pods, client_factory=client),  # the one pod store an exporter runs per node
        ResourceSliceSource(slices, client_factory=client),
    ]


def _total(nodes: list[Node]) -> int:
    return sum(n.counts.total() for n in nodes)


def _rows(nodes: list[Node]) -> Iterator[str]:
    keys = _keys(nodes)
    yield "| resource | verb | per node: min | median | max | all nodes | answers (all nodes) |"
    yield "|---|---|---:|---:|---:|---:|---|"
    for resource, verb in keys:
        per_node = [
            sum(c for (r, v, _), c in n.counts.snapshot().items() if (r, v) == (resource, verb))
            for n in nodes
        ]
        codes: dict[str, int] = {}
        for n in nodes:
            for (r, v, code), c in n.counts.snapshot().items():
                if (r, v) == (resource, verb):
                    codes[code] = codes.get(code, 0) + c
        answers = ", ".join(f"{code}: {c}" for code, c in sorted(codes.items()))
        yield (
            f"| {resource} | {verb} | {min(per_node)} | {statistics.median(per_node):g} | {max(per_node)} "
            f"| {sum(per_node)} | {answers} |"
        )
    per_node_all = [n.counts.total() for n in nodes]
    yield (
        f"| all | all | {min(per_node_all)} | {statistics.median(per_node_all):g} | {max(per_node_all)} "
        f"| {sum(per_node_all)} | |"
    )


def _stats_lines(nodes: list[Node]) -> Iterator[str]:
    fields = ("lists", "watches", "relists_after_expired", "quorum_relists", "expired_continues",
              "short_watches", "failures", "silent_watches", "events", "backoffs")  # fmt: skip
    for resource in sorted({r.resource for n in nodes for r in n.reflectors}):
        ours = [r for n in nodes for r in n.reflectors if r.resource == resource]
        sums = {f: sum(getattr(r.stats, f) for r in ours) for f in fields}
        waited = sum(r.stats.backoff_seconds for r in ours)
        yield f"{resource}: " + ", ".join(f"{k} {v}" for k, v in sums.items()) + f", waited {waited:.0f} s"


async def run(args: argparse.Namespace) -> None:
    random.seed(1)
    reason = env_missing_reason()
    if reason is not None:
        raise SystemExit(f"no control plane here: {reason} (scripts/setup builds it)")
    with tempfile.TemporaryDirectory(prefix="reflector-bench-") as tmp:
        plane = ControlPlane(Path(tmp) / "plane")
        (Path(tmp) / "plane").mkdir()
        token = Path(tmp) / "token"
        token.write_text(ADMIN_TOKEN)
        started = time.monotonic()
        await asyncio.to_thread(plane.start)
        try:
            kube = plane.client()
            names = [f"node-{i:03d}" for i in range(args.nodes)]
            pods = await asyncio.to_thread(_seed, kube, names, args.pods_per_node)
            print(f"control plane up and seeded in {time.monotonic() - started:.0f} s: "
                  f"{args.nodes} nodes, {len(pods)} pods, {args.nodes} ResourceSlices")  # fmt: skip
            nodes = [Node(name) for name in names]
            for node in nodes:
                _reflectors(node, plane, token)
                for r in node.reflectors:
                    r.start()
            stop = threading.Event()
            churner = threading.Thread(
                target=_churn, args=(kube, pods, args.churn_seconds, stop), daemon=True
            )
            churner.start()
            t0 = time.monotonic()
            restart_at, end_at = t0 + args.restart_at_minutes * 60, t0 + args.minutes * 60
            restarted = args.restart_at_minutes >= args.minutes  # no restart asked for
            try:
                while (now := time.monotonic()) < end_at:
                    if not restarted and now >= restart_at:
                        before = _total(nodes)
                        print(f"t={now - t0:.0f} s: restarting kube-apiserver ({before} requests so far)")
                        ready = await asyncio.to_thread(plane.restart_apiserver, args.down_seconds)
                        print(f"  ready again {ready:.1f} s after it was started "
                              f"({args.down_seconds:g} s down before that); "
                              f"{_total(nodes) - before} requests meanwhile")  # fmt: skip
                        after_ready, restarted = _total(nodes), True
                        await asyncio.sleep(min(60.0, max(0.0, end_at - time.monotonic())))
                        print(f"  {_total(nodes) - after_ready} requests in the minute after it was ready")
                        continue
                    await asyncio.sleep(min(1.0, end_at - now))
            finally:
                stop.set()
                churner.join()
                for node in nodes:
                    for r in node.reflectors:
                        await r.close()
            elapsed = time.monotonic() - t0
        finally:
            await asyncio.to_thread(plane.stop)
    print()
    print(f"{elapsed / 60:.1f} minutes, {args.nodes} nodes (a pod and a ResourceSlice reflector each), "
          f"a pod change every {args.churn_seconds:g} s, kube-apiserver restarted at "
          f"{args.restart_at_minutes:g} min:")  # fmt: skip
    print()
    for row in _rows(nodes):
        print(row)
    print()
    print("reflectors, all nodes:")
    for line in _stats_lines(nodes):
        print(f"  {line}")
    if args.per_node:
        print()
        print("| node | " + " | ".join(f"{r} {v}" for r, v in _keys(nodes)) + " |")
        print("|---|" + "---:|" * len(_keys(nodes)))
        for n in nodes:
            snap = n.counts.snapshot()
            cells = [sum(c for (r, v, _), c in snap.items() if (r, v) == key) for key in _keys(nodes)]
            print(f"| {n.name} | " + " | ".join(str(c) for c in cells) + " |")


def _keys(nodes: list[Node]) -> list[tuple[str, str]]:
    return sorted({(r, v) for n in nodes for (r, v, _) in n.counts.snapshot()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the reflectors run")
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods-per-node", type=int, default=5)
    parser.add_argument("--churn-seconds", type=float, default=1.0, help="one pod changes this often")
    parser.add_argument("--restart-at-minutes", type=float, default=None, help="default: half way")
    parser.add_argument("--down-seconds", type=float, default=5.0, help="the API server is down this long")
    parser.add_argument("--per-node", action="store_true", help="also print every node's counts")
    parser.add_argument("--verbose", action="store_true", help="the reflectors' own log lines too")
    args = parser.parse_args()
    # every reflector logs each failure once: during the restart that is two lines per node
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    if args.restart_at_minutes is None:
        args.restart_at_minutes = args.minutes / 2
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
