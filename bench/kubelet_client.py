"""The kubelet List call, h2 client against the grpc.aio client it replaced: CPU and wall per call.

Run: .venv/bin/python -m bench.kubelet_client [--pods 110 1000] [--rounds 50]
One fake kubelet (grpcio's server, bench/attribution_bench.py --serve) per pod count runs in a child
process, so the CPU measured is the client's alone. The baseline is the grpc.aio client as the
exporter had it (one channel kept open, identity serializers), measured in the same run against the
same server; h2 opens a connection per call, as the exporter does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import grpc.aio

from exporter.attribution.kubelet import PodResourcesClient
from exporter.attribution.podresources_proto import LIST_METHOD, decode_list_response, encode_list_request


async def _measure(fn: Callable[[], Awaitable[object]], rounds: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        await fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


async def _rows(pods: int, rounds: int) -> list[tuple[str, float, float, float, float]]:
    with tempfile.TemporaryDirectory(prefix="gpk") as tmp:
        sock = os.path.join(tmp, "kubelet.sock")
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.attribution_bench", "--serve", sock, "--pods", str(pods),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert child.stdout is not None
            await child.stdout.readline()  # "ready"
            channel = grpc.aio.insecure_channel(
                f"unix://{sock}", options=[("grpc.max_receive_message_length", 16 << 20)]
            )
            call = channel.unary_unary(LIST_METHOD, request_serializer=bytes, response_deserializer=bytes)

            async def baseline() -> object:
                return decode_list_response(await call(encode_list_request(), timeout=5.0))

            client = PodResourcesClient(sock, timeout_seconds=5.0)
            assert await baseline() == await client.list()  # same answer both ways
            await _measure(baseline, 3)  # warm both before measuring
            await _measure(client.list, 3)
            base_wall, base_cpu = await _measure(baseline, rounds)
            wall, cpu = await _measure(client.list, rounds)
            await channel.close()
        finally:
            child.terminate()
            await child.wait()
    return [
        (f"List, {pods} pods: grpc.aio (baseline)", base_wall, base_cpu, 1.0, 1.0),
        (f"List, {pods} pods: h2", wall, cpu, wall / base_wall, cpu / base_cpu),
    ]


def main() -> None:
    """Run both clients for each pod count and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, nargs="+", default=[110, 1000])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    rows = [row for pods in args.pods for row in asyncio.run(_rows(pods, args.rounds))]
    print(f"median of {args.rounds} calls\n")
    print("| call | wall ms | CPU ms | wall / baseline | CPU / baseline |")
    print("|---|---|---|---|---|")
    for name, wall, cpu, wall_ratio, cpu_ratio in rows:
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {wall_ratio:.2f} | {cpu_ratio:.2f} |")


if __name__ == "__main__":
    main()
