"""Attribution and page-cache benchmark: CPU and wall time per round, printed as a table.

Run: .venv/bin/python -m bench.attribution_bench [--pods 110] [--processes 64] [--file-gib 2]
The fake kubelet runs in a child process, so the CPU measured is the client's alone; process_time
covers every thread of this process (procfs reads and mincore run in worker threads). The 2 GiB
weight file is written under .work/bench/ on the real disk (tmpfs pages cannot be evicted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.attribution.kubelet import PodResourcesClient
from exporter.attribution.podresources_proto import (
    SERVICE_NAME,
    ContainerDevices,
    ContainerResources,
    PodResources,
    encode_list_response,
)
from exporter.collectors.base import GpuProcess, GpuRef, NodeState
from exporter.pagecache.collector import PageCacheCollector, PageCacheSettings

MIB = 1 << 20
GPUS = [
    GpuRef(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", index=str(i), name="H100", pci_bus_id="")
    for i in range(8)
]


def _pods(n: int) -> list[PodResources]:
    """n pods: 8 x 4 time-sliced GPU pods, the rest without GPUs (like a busy node)."""
    out = []
    for i in range(n):
        devices: tuple[ContainerDevices, ...] = ()
        if i < 32:
            devices = (ContainerDevices("nvidia.com/gpu.shared", (f"{GPUS[i % 8].uuid}::{i // 8}",)),)
        containers = (ContainerResources("main", devices), ContainerResources("sidecar", ()))
        out.append(PodResources(f"pod-{i}", f"ns-{i % 7}", containers))
    return out


def _uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


async def _serve(socket_path: str, pods: int) -> None:
    payload = encode_list_response(_pods(pods))

    async def list_(request: bytes, context: object) -> bytes:
        return payload

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(list_, lambda b: b, lambda b: b)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {"List": handler}),))
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def _procfs_tree(root: Path, pods_dir: Path, processes: int) -> list[GpuProcess]:
    out = []
    for n in range(processes):
        pid, pod_no = 10_000 + n, n % 32
        d = root / str(pid)
        d.mkdir(parents=True)
        uid = _uid(pod_no).replace("-", "_")
        (d / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{pid:064x}.scope\n"
        )
        (d / "stat").write_text(f"{pid} (python3) S 1 {pid} {pid} 0 -1 0 0 0 0 0 {n * 7} {n} 0 0\n")
        pod_dir = pods_dir / _uid(pod_no)
        if not pod_dir.exists():
            (pod_dir / "volumes/kubernetes.io~projected/token").mkdir(parents=True)
            (pod_dir / "etc-hosts").write_text(f"127.0.0.1\tlocalhost\n10.0.0.{pod_no}\tpod-{pod_no}\n")
            (pod_dir / "volumes/kubernetes.io~projected/token/namespace").write_text(f"ns-{pod_no % 7}")
        gpu = GPUS[pod_no % 8]
        out.append(GpuProcess(uuid=gpu.uuid, index=gpu.index, pid=pid))
    return out


async def _measure(fn: Callable[[], Awaitable[object]], rounds: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        await fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def _write_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size == size:
        return
    block = os.urandom(8 * MIB)
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 * MIB):
            pass


async def _bench(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpb") as tmp:
        sock = os.path.join(tmp, "kubelet.sock")
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.attribution_bench",
            "--serve",
            sock,
            "--pods",
            str(args.pods),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            await child.stdout.readline()  # "ready"
            client = PodResourcesClient(sock, timeout_seconds=5.0)
            rows.append((f"pod-resources List ({args.pods} pods)", *await _measure(client.list, args.rounds)))
            await client.close()

            processes = _procfs_tree(Path(tmp) / "proc", Path(tmp) / "pods", args.processes)
            settings = AttributionSettings(
                kubelet_socket_path=sock,
                kubelet_pods_dir=str(Path(tmp) / "pods"),
                procfs_path=str(Path(tmp) / "proc"),
                kubelet_refresh_interval_seconds=3600,
            )
            collector = AttributionCollector(settings)
            state = NodeState(gpus=GPUS, processes=processes)
            await collector.collect(state)
            label = f"attribution round ({args.processes} processes, cached pod-resources)"
            rows.append((label, *await _measure(lambda: collector.collect(state), args.rounds)))
            await collector.close()
        finally:
            child.terminate()
            await child.wait()

    weights = Path(args.work_dir) / "weights" / "bench-model" / "model.safetensors"
    size = int(args.file_gib * 1024) * MIB
    await asyncio.to_thread(_write_file, weights, size)
    page = PageCacheCollector(
        PageCacheSettings(paths=(str(weights.parent),), scan_mapped=False, max_seconds_per_round=30.0)
    )
    await asyncio.to_thread(_warm, weights)
    rows.append(
        (
            f"page cache round, {args.file_gib:g} GiB resident",
            *await _measure(lambda: page.collect(NodeState()), args.rounds),
        )
    )
    await asyncio.to_thread(_evict, weights)
    rows.append(
        (
            f"page cache round, {args.file_gib:g} GiB evicted",
            *await _measure(lambda: page.collect(NodeState()), args.rounds),
        )
    )
    if not args.keep_file:
        weights.unlink()
    return rows


def main() -> None:
    """Parse flags, run the benchmark (or serve the fake kubelet), print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--pods", type=int, default=110, help="pods the fake kubelet lists (110 = kubelet max)"
    )
    parser.add_argument("--processes", type=int, default=64, help="GPU processes in the procfs tree")
    parser.add_argument("--file-gib", type=float, default=2.0, help="size of the weight file")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--work-dir", default=".work/bench")
    parser.add_argument("--keep-file", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args.serve, args.pods))
        return
    rows = asyncio.run(_bench(args))
    print(f"{'operation':62} {'wall ms':>9} {'CPU ms':>9}   (median of {args.rounds})")
    for name, wall, cpu in rows:
        print(f"{name:62} {wall:9.2f} {cpu:9.2f}")


if __name__ == "__main__":
    main()
