"""Where one sampling cycle's CPU goes (not a test): a deterministic profile over every thread.

    .venv/bin/python -m bench.exporter_profile [--gpus 16] [--cycles 200] [--top 30] [--render]

Runs the same cycle as `bench/exporter.py --one gpupulse` (every NVML collector on the simulated
`large` scenario, 64 processes, a manual clock moving 1 s per cycle) under cProfile in the sampler
thread and in every GPU worker thread (each thread gets its own profiler, timed by the thread's CPU
time; the stats are summed), and prints the functions by own time, then by cumulative time.
`--render` also renders and gzips every snapshot, as a scrape of every tick would. cProfile's own
overhead inflates the small functions, so read the shares, not the absolute times; the cycle's real
CPU is what `bench/exporter.py` measures (and `--no-profile` here: each thread kind's CPU per cycle,
time.thread_time, without the profiler).

The first table sums the profile's own time by area (the simulated driver, pynvml's wrappers, our
NVML seam, collectors, sampler and series, asyncio, threads): the shares explain where ours and the
raw loop differ. `--raw` profiles bench/exporter.py's raw pynvml loop the same way, for comparison.

`--sim-cost` answers another question: how much of a cycle is the simulated driver itself, per C
symbol, for gpupulse and for bench/exporter.py's raw pynvml loop (the floor). Each simulated C
function is timed by the CPU time of the thread calling it, so both sides pay the same per call only
if they make the same calls with the same arguments: the table shows where they differ.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pynvml  # noqa: E402

from bench.exporter import RawLoop, Target, scenario_file  # noqa: E402
from exporter.collectors.gpus import GpuFleet  # noqa: E402
from exporter.collectors.xid import XidCounter  # noqa: E402
from exporter.config import ExporterSettings  # noqa: E402
from exporter.nvml import Nvml  # noqa: E402
from exporter.registry import BUILTINS, BuiltinContext  # noqa: E402
from exporter.sampler import Sampler  # noqa: E402

_profiles: list[cProfile.Profile] = []
_thread_cpu: dict[str, float] = {}
_lock = threading.Lock()


def _bootstrap(frame: Any, event: str, arg: Any) -> None:
    # the first profile event of a new thread: give it its own profiler (which replaces this hook)
    prof = cProfile.Profile(time.thread_time)  # CPU time of this thread, not wall time
    with _lock:
        _profiles.append(prof)
    prof.enable()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--render", action="store_true", help="render and gzip every snapshot (scraped)")
    parser.add_argument("--no-profile", action="store_true", help="only the per-thread CPU table")
    parser.add_argument("--raw", action="store_true", help="profile the raw pynvml loop instead (the floor)")
    parser.add_argument(
        "--sim-cost", action="store_true", help="CPU inside the simulated driver per symbol, ours and raw"
    )
    args = parser.parse_args(argv)
    if args.sim_cost:
        print(_sim_cost(args.gpus, args.cycles))
        return 0
    if args.raw:
        print(_raw_profile(args.gpus, args.cycles, args.top))
        return 0
    if not args.no_profile:
        threading.setprofile(_bootstrap)  # before the fleet starts its worker threads
    with tempfile.TemporaryDirectory() as tmp, Target(scenario_file(args.gpus, Path(tmp))) as target:
        nvml = Nvml()
        nvml.init()
        nvml.discover()
        settings = ExporterSettings()
        fleet = GpuFleet(nvml, target.clock, settings.gpu_call_timeout_seconds)
        ctx = BuiltinContext(fleet, XidCounter(), settings)
        sampler = Sampler([f(ctx) for f in BUILTINS.values()], settings, target.clock, gpu_status=fleet)
        loop = asyncio.new_event_loop()

        def cycle() -> None:
            target.advance()
            snap = loop.run_until_complete(sampler.sample_once())
            if args.render:
                snap.gzipped()

        for _ in range(5):
            cycle()
        main_prof = cProfile.Profile(time.thread_time)
        t0, w0 = time.process_time(), time.thread_time()
        if not args.no_profile:
            main_prof.enable()
        for _ in range(args.cycles):
            cycle()
        if not args.no_profile:
            main_prof.disable()
        process_ms = 1000 * (time.process_time() - t0) / args.cycles
        main_ms = 1000 * (time.thread_time() - w0) / args.cycles
        loop.close()
        fleet.close()
        nvml.shutdown()
    threading.setprofile(None)
    print(f"{args.gpus} GPUs, {args.cycles} cycles{' (profiled)' if not args.no_profile else ''}:")
    print(f"  process CPU per cycle {process_ms:.2f} ms, of which the sampler thread {main_ms:.2f} ms,")
    print(f"  GPU threads (the round runner, and GPU workers when one hangs) {process_ms - main_ms:.2f} ms")
    if args.no_profile:
        return 0
    stats = pstats.Stats(main_prof, stream=io.StringIO())
    for prof in _profiles:
        try:
            prof.disable()
        except Exception:  # a profiler of a thread that already ended
            pass
        stats.add(prof)
    print(_printed(stats, args.cycles, args.top))
    return 0


# Where a function's file puts it, first match wins: (area, path fragment); "~" is a C built-in.
_AREAS = (
    ("simulated NVML (exporter/sim)", "/exporter/sim/"),
    ("pynvml's wrappers and structs", "/pynvml.py"),
    ("our NVML seam (exporter/nvml.py)", "/exporter/nvml.py"),
    ("collectors (exporter/collectors)", "/exporter/collectors/"),
    ("sampler, series, snapshot (rest of exporter/)", "/exporter/"),
    ("the bench's own loop", "/bench/"),
    ("asyncio", "/asyncio/"),
    ("threads and queues", "/threading.py"),
    ("threads and queues", "/queue.py"),
    ("C built-ins (len, isinstance, dict.get, sum...)", "~"),  # a ctypes call counts in its caller
)


def _areas(stats: pstats.Stats, cycles: int) -> str:
    """Markdown: the profile's own time summed by area, per cycle and as a share."""
    spent: Counter[str] = Counter()
    for (filename, _line, _name), row in stats.stats.items():  # type: ignore[attr-defined]
        # "~" is cProfile's whole file name for a built-in; the other fragments are parts of a path
        area = next(
            (a for a, frag in _AREAS if filename == frag or (frag != "~" and frag in filename)),
            "other Python",
        )
        spent[area] += row[2]  # tottime: own time, callees excluded
    total = sum(spent.values()) or 1.0
    lines = ["| area | own time per cycle, ms (profiled) | share |", "|---|---|---|"]
    for area, seconds in spent.most_common():
        lines.append(f"| {area} | {1000 * seconds / cycles:.2f} | {100 * seconds / total:.0f} % |")
    return "\n".join(lines)


def _printed(stats: pstats.Stats, cycles: int, top: int) -> str:
    parts = [_areas(stats, cycles)]
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats(order).print_stats(top)
        text = out.getvalue()
        parts.append(text[text.find("   ncalls") :].replace(str(ROOT) + "/", ""))
    return "\n\n".join(parts)


def _raw_profile(gpus: int, cycles: int, top: int) -> str:
    """The raw pynvml loop under the same profiler: the floor's own shares."""
    with tempfile.TemporaryDirectory() as tmp, Target(scenario_file(gpus, Path(tmp))) as target:
        pynvml.nvmlInit()
        raw = RawLoop(target.now_us)
        for _ in range(5):
            target.advance()
            raw.cycle()
        prof = cProfile.Profile(time.thread_time)
        t0 = time.process_time()
        prof.enable()
        for _ in range(cycles):
            target.advance()
            raw.cycle()
        prof.disable()
        process_ms = 1000 * (time.process_time() - t0) / cycles
        pynvml.nvmlShutdown()
    head = f"raw pynvml loop, {gpus} GPUs, {cycles} cycles (profiled): process CPU per cycle"
    head += f" {process_ms:.2f} ms"
    return head + "\n" + _printed(pstats.Stats(prof, stream=io.StringIO()), cycles, top)


def _timed_lookup(sim: Any) -> tuple[Counter[str], Counter[str]]:
    """Wrap every simulated C function pynvml and gpupulse look up: (thread CPU ns, calls) per symbol."""
    cpu: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    wrapped: dict[str, Callable[..., Any]] = {}
    lock, lookup, clock = threading.Lock(), sim._lookup, time.thread_time_ns

    def timed(name: str) -> Any:
        found = wrapped.get(name)
        if found is None:
            fn = lookup(name)

            def found(*args: Any) -> Any:
                t0 = clock()
                try:
                    return fn(*args)
                finally:
                    spent = clock() - t0
                    with lock:
                        cpu[name] += spent
                        calls[name] += 1

            wrapped[name] = found
        return found

    pynvml._nvmlGetFunctionPointer = timed  # uninstalling the simulation restores pynvml's own
    return cpu, calls


def _sim_side(side: str, gpus: int, cycles: int) -> tuple[Counter[str], Counter[str], float]:
    """(thread CPU ns, calls) per simulated symbol over `cycles` cycles of one side, and process CPU ms
    per cycle."""
    with tempfile.TemporaryDirectory() as tmp, Target(scenario_file(gpus, Path(tmp))) as target:
        assert target.sim is not None
        cpu, calls = _timed_lookup(target.sim)
        if side == "raw":
            pynvml.nvmlInit()
            raw = RawLoop(target.now_us)
            step: Callable[[], object] = raw.cycle
            close: list[Callable[[], object]] = [pynvml.nvmlShutdown]
        else:
            nvml = Nvml()
            nvml.init()
            nvml.discover()
            settings = ExporterSettings()
            fleet = GpuFleet(nvml, target.clock, settings.gpu_call_timeout_seconds)
            ctx = BuiltinContext(fleet, XidCounter(), settings)
            sampler = Sampler([f(ctx) for f in BUILTINS.values()], settings, target.clock, gpu_status=fleet)
            loop = asyncio.new_event_loop()

            def step() -> object:
                return loop.run_until_complete(sampler.sample_once())

            close = [loop.close, fleet.close, nvml.shutdown]
        for _ in range(5):
            target.advance()
            step()
        cpu.clear()
        calls.clear()
        t0 = time.process_time()
        for _ in range(cycles):
            target.advance()
            step()
        process_ms = 1000 * (time.process_time() - t0) / cycles
        for fn in close:
            fn()
        return cpu, calls, process_ms


def _sim_cost(gpus: int, cycles: int) -> str:
    """Markdown: per symbol, calls per cycle and simulated-driver µs per call, raw loop and gpupulse."""
    (rc, rn, rp), (oc, on, op) = _sim_side("raw", gpus, cycles), _sim_side("gpupulse", gpus, cycles)

    def cells(name: str, cpu: Counter[str], calls: Counter[str]) -> str:
        n = calls[name]
        return f"{n / cycles:.1f} | {cpu[name] / n / 1000:.2f}" if n else "0 | -"

    lines = [
        f"{gpus} GPUs, {cycles} cycles: CPU inside the simulated driver, per C symbol (timing every call "
        "adds its own cost: read the ratios)",
        "",
        "| symbol | raw loop calls/cycle | raw µs/call | gpupulse calls/cycle | gpupulse µs/call |",
        "|---|---|---|---|---|",
    ]
    for name in sorted(set(rc) | set(oc), key=lambda n: -(rc[n] + oc[n])):
        lines.append(f"| {name} | {cells(name, rc, rn)} | {cells(name, oc, on)} |")
    for label, cpu, calls, process_ms in (("raw loop", rc, rn, rp), ("gpupulse", oc, on, op)):
        inside = sum(cpu.values()) / cycles / 1e6
        lines.append(
            f"\n{label}: process CPU {process_ms:.2f} ms per cycle (timed), of which inside the simulated "
            f"driver {inside:.2f} ms over {sum(calls.values()) / cycles:.0f} calls, outside it "
            f"{process_ms - inside:.2f} ms"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
