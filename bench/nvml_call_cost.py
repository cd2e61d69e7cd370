"""What each NVML function costs on the real driver, per sampling cycle: gpupulse, the raw pynvml loop
and nvitop-exporter side by side.

    python bench/nvml_call_cost.py [--cycles 30]

bench/exporter.py --real gives the CPU of a whole cycle; this says where it goes. Each kind runs in a
fresh interpreter with every C function pynvml resolves wrapped in a timer (wall time, and CPU time of
the calling thread), so the table names the calls that are dear on this driver and host (under a
sandbox such as gVisor every ioctl is), not the ones that are dear in our simulation. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("gpupulse", "raw", "nvitop")


@dataclass
class Cost:
    """Calls of one NVML symbol and their summed wall and calling-thread CPU seconds."""

    calls: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0


@dataclass
class _Timed:
    """A ctypes function stand-in: times each call; attribute writes (restype) reach the real one."""

    fn: Any
    cost: Cost = field(default_factory=Cost)

    def __call__(self, *args: Any) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self.fn(*args)
        finally:
            self.cost.calls += 1
            self.cost.wall_s += time.perf_counter() - w0
            self.cost.cpu_s += time.thread_time() - c0

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("fn", "cost"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.fn, name, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)


class _TimedCache(dict[str, Any]):
    """pynvml's function-pointer cache: every pointer stored in it comes back wrapped in a timer.

    Replacing the cache, not the lookup, catches nvitop too, which keeps its own reference to
    pynvml's lookup function."""

    costs: dict[str, Cost] = {}

    def __setitem__(self, name: str, fn: Any) -> None:
        timed = _Timed(fn)
        self.costs.setdefault(name, timed.cost)
        timed.cost = self.costs[name]
        super().__setitem__(name, timed)


def _one(kind: str, cycles: int, simulated_gpus: int) -> None:
    import tempfile

    import pynvml

    cache = _TimedCache()
    pynvml._nvmlGetFunctionPointer_cache = cache
    sys.path.insert(0, str(ROOT))
    from bench import exporter as bench_exporter

    measured: dict[str, dict[str, float]] = {}
    per_cycle = bench_exporter._per_cycle

    def counted(target: Any, n: int, run: Any) -> Any:
        """bench/exporter.py's own cycle loop, with the counters zeroed after its warm-up."""

        def first_measured() -> object:
            if not measured:
                for cost in cache.costs.values():
                    cost.calls, cost.wall_s, cost.cpu_s = 0, 0.0, 0.0
                measured["started"] = {}
            return run()

        warm = [0]

        def run_once() -> object:
            warm[0] += 1
            return run() if warm[0] <= 3 else first_measured()

        result = per_cycle(target, n, run_once)
        if "done" not in measured:
            measured["done"] = {}
            measured.update({k: dict(vars(v)) for k, v in cache.costs.items()})
        return result

    bench_exporter._per_cycle = counted  # type: ignore[assignment]
    tmp = tempfile.mkdtemp()
    path = bench_exporter.scenario_file(simulated_gpus, Path(tmp)) if simulated_gpus else None
    result = bench_exporter.MEASURES[kind](path, cycles)
    if result is None:
        print(json.dumps(None))
        return
    costs = {k: v for k, v in measured.items() if k not in ("started", "done")}
    print(json.dumps({"cycle_cpu_ms": result.cpu_ms, "costs": costs}))


def _run(kind: str, cycles: int, simulated_gpus: int) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--one", kind, str(cycles), str(simulated_gpus)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, timeout=600).stdout
    data: dict[str, Any] | None = json.loads(out.strip().splitlines()[-1])
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--top", type=int, default=15, help="rows: the dearest symbols for gpupulse")
    parser.add_argument(
        "--simulate", type=int, default=0, metavar="GPUS",
        help="rehearse on the simulation (the simulation bypasses the timed lookup: counts stay empty)",
    )
    parser.add_argument("--one", nargs=3, metavar=("KIND", "CYCLES", "GPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        _one(args.one[0], int(args.one[1]), int(args.one[2]))
        return 0
    runs = {kind: _run(kind, args.cycles, args.simulate) for kind in KINDS}
    per: dict[str, dict[str, Cost]] = {
        kind: {k: Cost(**v) for k, v in (run or {}).get("costs", {}).items()} for kind, run in runs.items()
    }
    n = args.cycles
    symbols = sorted(
        {s for costs in per.values() for s in costs},
        key=lambda s: -per["gpupulse"].get(s, Cost()).cpu_s,
    )
    print(
        f"NVML calls per sampling cycle on the real driver ({n} cycles per kind; CPU of the calling "
        "thread in the call; bench/exporter.py's measured cycles, after its warm-up):\n"
    )
    print(
        "| symbol | calls/cycle (gpupulse, raw, nvitop) | us/call wall "
        "| CPU ms/cycle (gpupulse, raw, nvitop) |"
    )
    print("|---|---|---|---|")

    def cell(kind: str, s: str, what: str) -> str:
        c = per[kind].get(s)
        if c is None:
            return "-"
        return f"{c.calls / n:.1f}" if what == "calls" else f"{1000 * c.cpu_s / n:.3f}"

    for s in symbols[: args.top]:
        ours = per["gpupulse"].get(s) or per["raw"].get(s) or per["nvitop"].get(s) or Cost()
        us = 1e6 * ours.wall_s / ours.calls if ours.calls else float("nan")
        calls = ", ".join(cell(k, s, "calls") for k in KINDS)
        cpu = ", ".join(cell(k, s, "cpu") for k in KINDS)
        print(f"| {s} | {calls} | {us:.0f} | {cpu} |")
    totals = []
    for kind in KINDS:
        run = runs[kind]
        if run is None:
            totals.append(f"{kind}: not measured")
            continue
        in_calls = 1000 * sum(c.cpu_s for c in per[kind].values()) / n
        cycle_ms = run["cycle_cpu_ms"]
        totals.append(f"{kind}: {in_calls:.2f} ms of {cycle_ms:.2f} ms CPU per cycle inside NVML calls")
    print("\n" + "; ".join(totals) + ".")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
