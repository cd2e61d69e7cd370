"""Engine-collector benchmark: N simulated engines scraped concurrently, CPU and wall time per round.

Run: .venv/bin/python -m bench.engines_bench [--engines 4] [--rounds 50]
The simulated engines run in their own processes, so the CPU measured is the collector's alone
(process_time covers every thread of this process, including the parse threads).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
            sys.executable, "-c", "from exporter.engines.simulated import main; main()",
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


def main() -> None:
    """Print one table row per engine count."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engines", type=int, nargs="+", default=[4])
    p.add_argument("--rounds", type=int, default=50)
    args = p.parse_args()
    print(f"{'engines':>7} {'rounds':>6} {'cpu ms/round':>12} {'cpu p95':>8} {'wall ms':>8} {'series':>7}")
    for n in args.engines:
        r = asyncio.run(run(n, args.rounds))
        print(
            f"{r['engines']:>7} {r['rounds']:>6} {r['cpu_ms_mean']:>12.2f} {r['cpu_ms_p95']:>8.2f} "
            f"{r['wall_ms_mean']:>8.2f} {r['series_out']:>7}"
        )


if __name__ == "__main__":
    main()
