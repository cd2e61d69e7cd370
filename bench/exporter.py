"""Exporter benchmark (not a test): CPU per sampling cycle, scrape latency and RSS on the simulated NVML.

    .venv/bin/python bench/exporter.py [--cycles 40] [--pairs 9] [--duration 60] [--markdown out.md]

Everything runs on the same simulated NVML (the shipped `large` scenario cut to 1, 8 and 16 GPUs, always
64 processes):

* CPU per cycle (process CPU time / cycle, in this process, manual scenario clock, 1 s per cycle):
  - gpupulse: one Sampler.sample_once() with every NVML collector. The exposition is rendered when a
    scrape first asks for a snapshot (Prometheus scrapes every 15-30 s, the loop ticks every 1 s), so
    the cycle does not include it: the render and gzip of one snapshot are measured apart, as what a
    scraped snapshot costs once;
  - raw: a straight pynvml loop making the same NVML calls (the floor; no families, no rendering);
  - nvitop-exporter: its PrometheusExporter.update_device() over the same GPUs (its own collection),
    plus one generate_latest() of its registry so both sides include one render per cycle.
* Scrape latency: the real `gpupulse-exporter --simulate` in a subprocess, 10 concurrent aiohttp clients
  on loopback asking for gzip (as Prometheus does), latency per request measured by the client. The
  clients start after a few sampling ticks and 20 unmeasured scrapes each (warm-up); --scrape-pause
  adds a random pause between scrapes (this VM's idle CPUs then wake slowly: the floor's p99 rises
  to 3-4 ms, so the default is back to back).
* RSS and CPU of that subprocess after --duration seconds at a 1 s interval, scraped once a second.

One run of a 16-GPU cycle moves by 10-30 % on a shared 2-vCPU VM, and a p99 of 2,000 scrapes by a
millisecond, so one run of this script repeats each comparison (--pairs): gpupulse and the raw loop in
alternating pairs of fresh interpreters per GPU count, the plug-in measurement, and exporter / bare
server pairs at the largest count. The ratios are medians of the per-pair ratios, with quartiles.

This file calls pynvml directly for the raw floor: that is the point of the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import importlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pynvml as N
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exporter.collectors.gpus import GpuFleet  # noqa: E402
from exporter.collectors.xid import XidCounter  # noqa: E402
from exporter.config import ExporterSettings  # noqa: E402
from exporter.nvml import GPM_METRICS, GPM_RATE_METRICS, Nvml  # noqa: E402
from exporter.registry import BUILTINS, BuiltinContext  # noqa: E402
from exporter.sampler import Sampler  # noqa: E402
from exporter.sim import ManualClock, SimulatedNvml, install, load_scenario  # noqa: E402
from exporter.sim.scenario import SCENARIO_DIR  # noqa: E402
from gpupulse.clock import Clock, SystemClock  # noqa: E402

GPU_COUNTS = (1, 8, 16)
PLUGIN_PAIRS = 3  # runs with and without the plug-ins, interleaved
# Issue 26 set "plug-ins at most 1 ms per cycle at 16 GPUs" on a machine whose raw loop read 2.41 ms
# at 16 GPUs in the same run: as a ratio in one run, at most 1/2.41 of the raw loop. This VM's speed
# moves 10-30 % from hour to hour (docs/benchmarks.md), so the ratio is what one run can decide.
ISSUE_RAW_16_MS = 2.41
PLUGIN_TARGET_MS = 1.0
SCRAPERS = 10
WARMUP_SECONDS = 3.0  # the exporter's first ticks import and allocate; steady state is what we serve
WARMUP_SCRAPES = 20  # per scraper, not measured


class _Clock(Clock):
    """The exporter's clock on the simulation's: wall time = the sim's epoch + scenario time."""

    def __init__(self, sim_clock: ManualClock, epoch_us: int) -> None:
        self.sim_clock, self.epoch_us = sim_clock, epoch_us

    def time(self) -> float:
        return self.epoch_us / 1e6 + self.sim_clock.monotonic()

    def monotonic(self) -> float:
        return self.sim_clock.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.sim_clock.sleep(seconds)


def scenario_file(gpus: int, workdir: Path) -> Path:
    """The shipped `large` scenario cut to `gpus` GPUs, its 64 processes spread over them."""
    data = yaml.safe_load((SCENARIO_DIR / "large.yaml").read_text())
    data["gpus"] = data["gpus"][:gpus]
    for proc in data.get("processes", []):
        proc["gpu"] = int(proc["gpu"]) % gpus
    data["name"] = f"bench-{gpus}"
    path = workdir / f"bench-{gpus}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- the raw floor ---------------------------------------------------------------------------------
class RawLoop:
    """The NVML calls one gpupulse cycle makes, without anything around them."""

    def __init__(self, now_us: Callable[[], int]) -> None:
        self.now_us = now_us
        self.handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
        self.absent: set[tuple[int, str]] = set()
        self.last_seen = [0] * len(self.handles)
        self.samples = [(N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()) for _ in self.handles]
        self.primed = [False] * len(self.handles)
        self.links: list[int | None] = [None] * len(self.handles)
        self.mg = N.c_nvmlGpmMetricsGet_t()
        self.mg.version = N.NVML_GPM_METRICS_GET_VERSION
        self.gpm_ids = [*GPM_METRICS.values(), *GPM_RATE_METRICS.values()]  # ratios and traffic, as gpupulse
        self.mg.numMetrics = len(self.gpm_ids)
        for i, metric_id in enumerate(self.gpm_ids):
            self.mg.metrics[i].metricId = metric_id

    def _try(self, i: int, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        if (i, key) in self.absent:
            return None
        try:
            return fn(*args)
        except N.NVMLError_NotSupported:
            self.absent.add((i, key))
        except N.NVMLError:
            pass
        return None

    def cycle(self) -> int:
        """One pass over every GPU; returns a checksum so nothing is optimised away."""
        acc = 0
        for i, h in enumerate(self.handles):
            t = self._try
            values = [
                N.nvmlDeviceGetMemoryInfo(h, N.nvmlMemory_v2).used,
                t(i, "util", N.nvmlDeviceGetUtilizationRates, h).gpu,
                t(i, "temp", N.nvmlDeviceGetTemperatureV, h, N.NVML_TEMPERATURE_GPU),
                t(i, "memtemp", N.nvmlDeviceGetFieldValues, h, [N.NVML_FI_DEV_MEMORY_TEMP])[0].value.uiVal,
                t(i, "power", N.nvmlDeviceGetPowerUsage, h),
                t(i, "limit", N.nvmlDeviceGetEnforcedPowerLimit, h),
                t(i, "energy", N.nvmlDeviceGetTotalEnergyConsumption, h),
                t(i, "sm", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM),
                t(i, "mem", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_MEM),
                t(i, "fan", N.nvmlDeviceGetFanSpeed, h),
                t(i, "pstate", N.nvmlDeviceGetPerformanceState, h),
                t(i, "margin", N.nvmlDeviceGetMarginTemperature, h),
                t(i, "reasons", N.nvmlDeviceGetCurrentClocksEventReasons, h),
                t(i, "gen", N.nvmlDeviceGetCurrPcieLinkGeneration, h),
                t(i, "width", N.nvmlDeviceGetCurrPcieLinkWidth, h),
                t(i, "replay", N.nvmlDeviceGetPcieReplayCounter, h),
                t(i, "ecc_c", N.nvmlDeviceGetTotalEccErrors, h, 0, 0),
                t(i, "ecc_u", N.nvmlDeviceGetTotalEccErrors, h, 1, 0),
            ]
            rows = t(i, "remap", N.nvmlDeviceGetRemappedRows, h)
            acc += sum(int(v) for v in values if v is not None) + (sum(rows) if rows else 0)
            procs = list(N.nvmlDeviceGetComputeRunningProcesses(h)) + list(
                N.nvmlDeviceGetGraphicsRunningProcesses(h)
            )
            acc += sum(int(p.usedGpuMemory or 0) for p in procs)
            since = self.last_seen[i] or self.now_us() - 1_000_000
            try:
                util = N.nvmlDeviceGetProcessUtilization(h, since)
            except N.NVMLError:
                util = []
            if util:
                self.last_seen[i] = max(int(s.timeStamp) for s in util)
                acc += sum(int(s.smUtil) for s in util)
            if self.links[i] is None:  # link count and far ends are static: read once, like gpupulse
                self.links[i] = int(
                    N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal
                )
                acc += sum(
                    int(N.nvmlDeviceGetNvLinkRemoteDeviceType(h, k)) for k in range(self.links[i] or 0)
                )
            for link in range(self.links[i] or 0):
                acc += int(N.nvmlDeviceGetNvLinkState(h, link) == N.NVML_FEATURE_ENABLED)
            prev, cur = self.samples[i]
            if not self.primed[i]:
                N.nvmlGpmSampleGet(h, prev)
                self.primed[i] = True
                continue
            N.nvmlGpmSampleGet(h, cur)
            self.mg.sample1, self.mg.sample2 = prev, cur
            N.nvmlGpmMetricsGet(self.mg)
            acc += int(sum(self.mg.metrics[k].value for k in range(len(self.gpm_ids))))
            self.samples[i] = (cur, prev)
        return acc


# --- CPU per cycle ---------------------------------------------------------------------------------
@dataclass
class CycleResult:
    cpu_ms: float
    nvml_calls: float
    render_ms: float | None = None  # gpupulse: rendering one snapshot's text, once it is scraped
    gzip_ms: float | None = None  # gpupulse: and compressing it (for a scrape asking for gzip)


class Target:
    """Where the NVML calls go: a scenario on a manual clock (1 s per cycle), or the real driver."""

    REAL_PAUSE_SECONDS = 0.2  # between real cycles: GPM samples must be > 100 ms apart

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.sim: SimulatedNvml | None = None
        self.sim_clock = ManualClock(10.0)
        self.clock: Any = SystemClock()

    def __enter__(self) -> Target:
        if self.path is not None:
            self.sim = install(load_scenario(str(self.path)), self.sim_clock)
            self.clock = _Clock(self.sim_clock, self.sim.epoch_us)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sim is not None:
            self.sim.uninstall()

    def advance(self) -> None:
        """Let one sampling interval pass."""
        if self.sim is not None:
            self.sim_clock.advance(1.0)
        else:
            time.sleep(self.REAL_PAUSE_SECONDS)

    def calls(self) -> float:
        """NVML calls made so far (simulation only)."""
        return float(sum(self.sim.calls.values())) if self.sim is not None else math.nan

    def now_us(self) -> int:
        return int(self.clock.time() * 1e6)


def _as_started() -> None:
    """What the exporter does once started (exporter.cli): its start-up heap frozen out of the garbage
    collector's scans. Every variant gets it after its own set-up, so a full collection costs each
    side what it would cost a running process."""
    gc.collect()
    gc.freeze()


def _per_cycle(target: Target, cycles: int, run: Callable[[], object]) -> CycleResult:
    for _ in range(3):  # warm-up: GPM baselines, NotSupported caches
        target.advance()
        run()
    _as_started()
    calls_before = target.calls()
    cpu = 0.0
    for _ in range(cycles):
        target.advance()
        t0 = time.process_time()
        run()
        cpu += time.process_time() - t0
    return CycleResult(1000 * cpu / cycles, (target.calls() - calls_before) / cycles)


def measure_gpupulse(path: Path | None, cycles: int) -> CycleResult:
    """CPU of Sampler.sample_once() with the NVML collectors (render included)."""
    with Target(path) as target:
        nvml = Nvml()
        nvml.init()
        nvml.discover()
        settings = ExporterSettings()
        fleet = GpuFleet(nvml, target.clock, settings.gpu_call_timeout_seconds)
        ctx = BuiltinContext(fleet, XidCounter(), settings)
        sampler = Sampler([f(ctx) for f in BUILTINS.values()], settings, target.clock, gpu_status=fleet)
        loop = asyncio.new_event_loop()
        try:
            result = _per_cycle(target, cycles, lambda: loop.run_until_complete(sampler.sample_once()))
            render = compress = 0.0
            for _ in range(cycles):  # the same cycles again, each snapshot scraped (rendered, gzipped)
                target.advance()
                snap = loop.run_until_complete(sampler.sample_once())
                t0 = time.process_time()
                _ = snap.body
                t1 = time.process_time()
                snap.gzipped()
                render, compress = render + t1 - t0, compress + time.process_time() - t1
            result.render_ms, result.gzip_ms = 1000 * render / cycles, 1000 * compress / cycles
        finally:
            loop.close()
        fleet.close()
        nvml.shutdown()
        return result


def measure_raw(path: Path | None, cycles: int) -> CycleResult:
    """CPU of the straight pynvml loop."""
    with Target(path) as target:
        N.nvmlInit()
        raw = RawLoop(target.now_us)
        result = _per_cycle(target, cycles, raw.cycle)
        N.nvmlShutdown()
        return result


def measure_nvitop(path: Path | None, cycles: int) -> CycleResult | None:
    """CPU of nvitop-exporter's per-device collection plus one render of its registry."""
    from prometheus_client import CollectorRegistry, generate_latest

    with Target(path) as target:
        # Imported after install: nvitop binds pynvml's function lookup when it is imported.
        try:
            nvitop = importlib.import_module("nvitop")
            nvitop_exporter = importlib.import_module("nvitop_exporter.exporter")
        except ImportError:
            return None
        devices = nvitop.Device.all()
        registry = CollectorRegistry()
        exporter = nvitop_exporter.PrometheusExporter(
            devices, hostname="bench", registry=registry, interval=1.0
        )

        def run() -> None:
            for device in devices:
                exporter.update_device(device)
            generate_latest(registry)

        return _per_cycle(target, cycles, run)


@dataclass
class PluginResult:
    builtins_ms: float  # CPU per cycle, NVML collectors only (median of the runs)
    all_ms: float  # the same cycles with the plug-ins (median of the runs)
    added_ms: float  # median of (with - without) over back-to-back pairs of runs
    engines_round_ms: float  # CPU of one round of each plug-in alone, for reference
    attribution_round_ms: float
    pagecache_round_ms: float
    # Where the added CPU goes (medians over the runs with the plug-ins, minus the NVML-only mean of
    # the same pair): ticks where no plug-in round started (a bigger heap and snapshot, the process
    # collector's pod labels, background threads) and ticks where one or more started, above the sum
    # of those rounds measured alone (contention between rounds, thread hand-overs).
    idle_tick_added_ms: float = math.nan
    round_tick_added_ms: float = math.nan
    round_tick_over_alone_ms: float = math.nan


def _fake_proc(root: Path, pods_dir: Path, pids: Sequence[int]) -> None:
    """A /proc tree for the scenario's GPU processes, each in a pod the fake kubelet lists."""
    for n, pid in enumerate(pids):
        d = root / str(pid)
        d.mkdir(parents=True)
        uid = f"{n % 32:08x}-0000-4000-8000-{n % 32:012x}"
        (d / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n"
        )
        # all 52 fields, as the kernel writes them (starttime is field 22), and the I/O counters
        head = f"{pid} (python3) S 1 {pid} {pid} 0 -1 4194304 10 0 0 0 {n * 7} {n} 0 0 20 0 24 0 {1000 + n}"
        (d / "stat").write_text(head + " 8589934592 262144" + " 0" * 28 + "\n")
        (d / "io").write_text(f"rchar: {n << 20}\nwchar: {n << 10}\nsyscr: 1\nsyscw: 1\n")
        (d / "maps").write_text("")
        pod_dir = pods_dir / uid
        if not pod_dir.exists():
            (pod_dir / "volumes/kubernetes.io~projected/token").mkdir(parents=True)
            (pod_dir / "etc-hosts").write_text(f"127.0.0.1\tlocalhost\n10.0.0.{n % 32}\tpod-{n % 32}\n")
            (pod_dir / "volumes/kubernetes.io~projected/token/namespace").write_text(f"ns-{n % 7}")


def measure_plugins(path: Path | None, cycles: int) -> PluginResult:
    """CPU per 1 s cycle with and without the plug-ins, in this process: 4 simulated engines (vLLM,
    SGLang, TGI, vLLM) scraped over HTTP on their 5 s interval, attribution (fake kubelet with 110
    pods, fake /proc for the scenario's 64 processes) on its 5 s interval, and a 256 MiB model in the
    page cache on its 30 s interval."""
    from bench.engines_bench import _KINDS, _start_engines, _Targets
    from exporter.attribution.collector import AttributionCollector, AttributionSettings
    from exporter.collectors.base import NodeState
    from exporter.engines.collector import EnginesCollector
    from exporter.pagecache.collector import PageCacheCollector, PageCacheSettings

    assert path is not None, "the plug-in measurement runs on the simulation"
    workdir = Path(tempfile.mkdtemp(prefix="gpb"))
    weights = ROOT / ".work" / "bench" / "plugins" / "model-00001-of-00001.safetensors"
    weights.parent.mkdir(parents=True, exist_ok=True)
    with weights.open("wb") as f:
        f.write(os.urandom(256 << 20))
    kubelet_socket = str(workdir / "kubelet.sock")
    kubelet = subprocess.Popen(
        [sys.executable, "-m", "bench.attribution_bench", "--serve", kubelet_socket, "--pods", "110"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    loop = asyncio.new_event_loop()
    engines_scenario = workdir / "engines.yaml"
    engines_scenario.write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "gpus": [{"model": "H100-SXM5-80GB"}],
                "engines": [{"name": f"e{i}", "kind": _KINDS[i], "model": f"model-{i}"} for i in range(4)],
            }
        )
    )
    procs, targets = loop.run_until_complete(_start_engines(4, engines_scenario))
    try:
        assert kubelet.stdout is not None
        kubelet.stdout.readline()  # "ready"
        with Target(path) as target:
            nvml = Nvml()
            nvml.init()
            nvml.discover()
            settings = ExporterSettings()
            fleet = GpuFleet(nvml, target.clock, settings.gpu_call_timeout_seconds)
            ctx = BuiltinContext(fleet, XidCounter(), settings)
            assert target.sim is not None
            _fake_proc(
                workdir / "proc", workdir / "pods", sorted({p.pid for p in target.sim.scenario.processes})
            )

            states: list[NodeState] = []
            ticks: list[list[tuple[float, tuple[str, ...]]]] = []  # per run: (CPU ms, rounds started)

            def run(collectors: list[Any]) -> float:
                sampler = Sampler(collectors, settings, target.clock, gpu_status=fleet)
                for _ in range(6):  # warm-up: GPM baselines, first rounds, sessions
                    target.advance()
                    loop.run_until_complete(sampler.sample_once())
                cpu = 0.0
                rows = []
                for _ in range(cycles):
                    target.advance()
                    _Started.names.clear()
                    t0 = time.process_time()
                    loop.run_until_complete(sampler.sample_once())
                    spent = time.process_time() - t0
                    cpu += spent
                    rows.append((1000 * spent, tuple(_Started.names)))
                ticks.append(rows)
                states.append(sampler.state)
                return 1000 * cpu / cycles

            builtins = [f(ctx) for f in BUILTINS.values()]
            engines = EnginesCollector([_Targets(targets)])
            attribution = AttributionCollector(
                AttributionSettings(
                    kubelet_socket_path=kubelet_socket,
                    kubelet_pods_dir=str(workdir / "pods"),
                    procfs_path=str(workdir / "proc"),
                )
            )
            pagecache = PageCacheCollector(PageCacheSettings(paths=(str(weights.parent),), scan_mapped=False))
            _as_started()
            base = run(builtins)
            plugins: list[Any] = [_Started(attribution), _Started(engines), _Started(pagecache)]
            bases, fulls = [base], [run([*builtins, *plugins])]
            for _ in range(PLUGIN_PAIRS - 1):  # back-to-back pairs: this machine's load drifts
                bases.append(run(builtins))
                fulls.append(run([*builtins, *plugins]))
            state = states[-1]  # the node as the last run saw it: 16 GPUs, 64 processes

            def round_ms(collector: Any) -> float:
                cpus = []
                for _ in range(10):
                    t0 = time.process_time()
                    loop.run_until_complete(collector.collect(state))
                    cpus.append(time.process_time() - t0)
                return 1000 * statistics.median(cpus)

            rounds = [round_ms(c) for c in (engines, attribution, pagecache)]
            alone = dict(zip(("engines", "attribution", "pagecache"), rounds, strict=True))
            idle, busy, over = [], [], []
            for pair, base_ms in enumerate(bases):
                full_ticks = ticks[2 * pair + 1]
                idle.append(statistics.fmean(ms for ms, names in full_ticks if not names) - base_ms)
                started = [(ms, names) for ms, names in full_ticks if names]
                busy.append(statistics.fmean(ms for ms, _ in started) - base_ms)
                over.append(
                    statistics.fmean(ms - base_ms - sum(alone[n] for n in names) for ms, names in started)
                )
            for c in plugins:
                loop.run_until_complete(c.close())
            fleet.close()
            nvml.shutdown()
            return PluginResult(
                statistics.median(bases),
                statistics.median(fulls),
                statistics.median(f - b for b, f in zip(bases, fulls, strict=True)),
                rounds[0],
                rounds[1],
                rounds[2],
                idle_tick_added_ms=statistics.median(idle),
                round_tick_added_ms=statistics.median(busy),
                round_tick_over_alone_ms=statistics.median(over),
            )
    finally:
        for p in procs:
            p.terminate()
            loop.run_until_complete(p.wait())
        loop.close()
        kubelet.terminate()
        kubelet.wait(10)
        weights.unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)  # the fake /proc, pod directories, kubelet socket


class _Started:
    """A plug-in collector that notes in `names` each round it starts (which ticks ran rounds)."""

    names: list[str] = []

    def __init__(self, collector: Any) -> None:
        self._collector = collector
        self.name = collector.name
        self.interval_seconds = collector.interval_seconds
        self.deadline_seconds = getattr(collector, "deadline_seconds", None)

    async def collect(self, state: Any) -> Any:
        _Started.names.append(self.name)
        return await self._collector.collect(state)

    async def close(self) -> None:
        await self._collector.close()


MEASURES: dict[str, Callable[[Path | None, int], Any]] = {
    "gpupulse": measure_gpupulse,
    "raw": measure_raw,
    "nvitop": measure_nvitop,
    "plugins": measure_plugins,
}


def measure_isolated(kind: str, gpus: int, cycles: int) -> Any:
    """One measurement in a fresh interpreter, so imports, caches and garbage do not leak between them."""
    cmd = [sys.executable, __file__, "--one", kind, str(gpus), str(cycles)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, timeout=600).stdout
    data = json.loads(out.strip().splitlines()[-1])
    if data is None:
        return None
    return PluginResult(**data) if kind == "plugins" else CycleResult(**data)


def _one(kind: str, gpus: int, cycles: int) -> None:
    """gpus 0 means the real driver."""
    with tempfile.TemporaryDirectory() as tmp:
        result = MEASURES[kind](scenario_file(gpus, Path(tmp)) if gpus else None, cycles)
    print(json.dumps(None if result is None else dict(vars(result))))


# --- the real exporter process: scrape latency, RSS, CPU -------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_stats(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds) of a process from /proc."""
    rss_kib = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = float(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss_kib / 1024, (int(fields[11]) + int(fields[12])) / ticks


def _rss_parts(pid: int) -> tuple[float, float]:
    """(anonymous, file-backed) resident MiB: a step in the second is code and libraries paged back
    in (after the host reclaimed them), not the process allocating."""
    kib = {"RssAnon:": 0.0, "RssFile:": 0.0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(maxsplit=1)[0] if line else ""
        if key in kib:
            kib[key] = float(line.split()[1])
    return kib["RssAnon:"] / 1024, kib["RssFile:"] / 1024


async def _wait_up(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def _scrape_latencies(url: str, per_scraper: int, pause_seconds: float) -> list[float]:
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=SCRAPERS)
    # Ask for gzip like Prometheus does, but leave the body compressed: the client's own decompression
    # is not the exporter's latency.
    headers = {"Accept-Encoding": "gzip"}
    async with aiohttp.ClientSession(connector=connector, headers=headers, auto_decompress=False) as session:
        await _wait_up(session, url)
        await asyncio.sleep(WARMUP_SECONDS)

        async def scraper() -> None:
            for i in range(WARMUP_SCRAPES + per_scraper):
                t0 = time.perf_counter()
                async with session.get(url) as resp:
                    await resp.read()
                if i >= WARMUP_SCRAPES:  # the first ones warm the client's own code paths and sockets
                    latencies.append(time.perf_counter() - t0)
                if pause_seconds > 0:
                    await asyncio.sleep(random.uniform(0, 2 * pause_seconds))

        await asyncio.gather(*(scraper() for _ in range(SCRAPERS)))
    return latencies


async def _soak(url: str, seconds: float) -> None:
    async with aiohttp.ClientSession() as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            async with session.get(url) as resp:
                await resp.read()
            await asyncio.sleep(1.0)


@dataclass
class ServeResult:
    p50_ms: float
    p99_ms: float
    max_ms: float
    body_kib: float
    rss_mib: float | None = None
    cpu_percent: float | None = None
    body: bytes = b""
    # (seconds into the soak, RSS MiB, of which anonymous, of which file-backed)
    rss_trace: list[tuple[float, float, float, float]] = field(default_factory=list)


SOAK_LEGS = 10

PLUGINS_OFF = ["--no-collector.attribution", "--no-collector.engines", "--no-collector.pagecache"]


def measure_serving(
    path: Path | None,
    per_scraper: int,
    soak_seconds: float,
    extra_args: Sequence[str] = (),
    pause_seconds: float = 0.01,
) -> ServeResult:
    """Start the exporter on the scenario (None: real NVML), measure scrape latency, then soak for RSS/CPU."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    simulate = ["--simulate", str(path)] if path is not None else []
    cmd = [sys.executable, "-m", "exporter.cli", *simulate,
           "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warning", *extra_args]  # fmt: skip
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            latencies = asyncio.run(_scrape_latencies(url, per_scraper, pause_seconds))
            body = asyncio.run(_fetch(url))
            result = ServeResult(
                p50_ms=1000 * statistics.median(latencies),
                p99_ms=1000 * _percentile(latencies, 0.99),
                max_ms=1000 * max(latencies),
                body_kib=len(body) / 1024,
                body=body,
            )
            if soak_seconds > 0:
                rss, cpu_before = _proc_stats(proc.pid)
                t0 = time.monotonic()
                result.rss_trace.append((0.0, rss, *_rss_parts(proc.pid)))
                # ten legs, RSS read after each: growth shows as a trend, not just an end value
                for leg in range(1, SOAK_LEGS + 1):
                    asyncio.run(_soak(url, t0 + soak_seconds * leg / SOAK_LEGS - time.monotonic()))
                    rss, cpu_after = _proc_stats(proc.pid)
                    result.rss_trace.append((time.monotonic() - t0, rss, *_rss_parts(proc.pid)))
                result.rss_mib = rss
                result.cpu_percent = 100 * (cpu_after - cpu_before) / (time.monotonic() - t0)
            return result
        finally:
            proc.terminate()
            proc.wait(10)


def measure_bare_server(body: bytes, per_scraper: int, pause_seconds: float = 0.01) -> ServeResult:
    """The same clients against an aiohttp app that returns a constant body: the method's own floor."""
    port = _free_port()
    with tempfile.NamedTemporaryFile(suffix=".prom") as f:
        f.write(body)
        f.flush()
        cmd = [sys.executable, __file__, "--bare-server", f.name, str(port)]
        with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                latencies = asyncio.run(_scrape_latencies(url, per_scraper, pause_seconds))
            finally:
                proc.terminate()
                proc.wait(10)
    return ServeResult(
        1000 * statistics.median(latencies),
        1000 * _percentile(latencies, 0.99),
        1000 * max(latencies),
        len(body) / 1024,
    )


def _bare_server(body_file: Path, port: int) -> None:
    import gzip

    from aiohttp import web

    body = body_file.read_bytes()
    compressed = gzip.compress(body, mtime=0)

    async def handler(request: web.Request) -> web.Response:
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=compressed, headers={"Content-Encoding": "gzip"})
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _fetch(url: str) -> bytes:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return await resp.read()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


# --- report ----------------------------------------------------------------------------------------
T = TypeVar("T")


def _alternating(pairs: int, first: Callable[[], T], second: Callable[[], T]) -> tuple[list[T], list[T]]:
    """`pairs` runs of each, in pairs whose order swaps every pair: the machine's drifting load (a
    shared VM's neighbours, its own page cache) hits both sides alike, and a ratio per pair cancels it."""
    a: list[T] = []
    b: list[T] = []
    for i in range(pairs):
        if i % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


def _spread(values: Sequence[float], unit: str = "") -> str:
    """Median (quartiles) of a measurement repeated in one run; one value alone when run once."""
    med = statistics.median(values)
    if len(values) < 2:
        return f"{med:.2f}{unit}"
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{med:.2f}{unit} ({q1:.2f}-{q3:.2f})"


def _cpu_table(args: argparse.Namespace, files: dict[int, Path | None]) -> list[str]:
    pairs = args.pairs
    lines = [
        f"CPU per sampling cycle (ms of process CPU, mean of {args.cycles} cycles per run"
        + (", real NVML" if args.real else ", 64 processes")
        + f"; gpupulse and the raw loop in {pairs} alternating pairs of fresh interpreters, medians; "
        "the ratio is the median of the per-pair ratios, quartiles in brackets):",
        "",
        "| GPUs | gpupulse | raw pynvml loop | nvitop-exporter | gpupulse / raw | pairs where gpupulse is "
        "cheaper | nvitop / gpupulse | NVML calls/cycle (gpupulse, raw, nvitop) | render, gzip per scraped "
        "snapshot |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in files:
        ours, raw = _alternating(
            pairs,
            functools.partial(measure_isolated, "gpupulse", n, args.cycles),
            functools.partial(measure_isolated, "raw", n, args.cycles),
        )
        nv = measure_isolated("nvitop", n, args.cycles)
        ours_ms = statistics.median(r.cpu_ms for r in ours)
        ratios = [o.cpu_ms / r.cpu_ms for o, r in zip(ours, raw, strict=True)]
        cheaper = sum(x < 1.0 for x in ratios)
        renders = [
            (r.render_ms, r.gzip_ms) for r in ours if r.render_ms is not None and r.gzip_ms is not None
        ]
        render = (
            f"{statistics.median(x for x, _ in renders):.2f}, {statistics.median(z for _, z in renders):.2f}"
            if renders
            else "n/a"
        )
        nv_cells = (
            (f"{nv.cpu_ms:.2f}", f"{nv.cpu_ms / ours_ms:.2f}x", f"{nv.nvml_calls:.0f}")
            if nv
            else ("n/a",) * 3
        )
        lines.append(
            f"| {n or 'real'} | {ours_ms:.2f} | {statistics.median(r.cpu_ms for r in raw):.2f} "
            f"| {nv_cells[0]} "
            f"| {_spread(ratios, 'x')} | {cheaper} of {pairs} | {nv_cells[1]} "
            f"| {ours[0].nvml_calls:.0f}, {raw[0].nvml_calls:.0f}, {nv_cells[2]} | {render} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def _plugins_table(args: argparse.Namespace, n: int) -> list[str]:
    # each plug-in run paired with a raw-loop run beside it: the ratio holds across the host's spells
    runs, raw = _alternating(
        args.pairs,
        functools.partial(measure_isolated, "plugins", n, args.plugin_cycles),
        functools.partial(measure_isolated, "raw", n, args.cycles),
    )
    ratios = [r.added_ms / w.cpu_ms for r, w in zip(runs, raw, strict=True)]
    target = PLUGIN_TARGET_MS / ISSUE_RAW_16_MS

    def med(name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in runs))

    lines = [
        "",
        f"Plug-in collectors' added CPU per 1 s cycle ({n} GPUs; {args.pairs} runs in fresh interpreters, "
        f"each of {PLUGIN_PAIRS} back-to-back pairs of {args.plugin_cycles} cycles with and without them, "
        f"alternating with {args.pairs} runs of the raw loop at {n} GPUs; medians of the runs, quartiles in "
        "brackets): 4 simulated engines (vLLM, SGLang, TGI, vLLM) every 5 s, attribution (110 pods, 64 "
        "processes) every 5 s, a 256 MiB model in the page cache every 30 s:",
        "",
        "| NVML collectors only, ms | with the plug-ins, ms | added per cycle, ms "
        "| round: engines (4), attribution, page cache, ms "
        "| added: tick without a round, tick with rounds (of which above the rounds alone), ms |",
        "|---|---|---|---|---|",
        f"| {med('builtins_ms'):.2f} | {med('all_ms'):.2f} | {_spread([r.added_ms for r in runs])} "
        f"| {med('engines_round_ms'):.2f}, {med('attribution_round_ms'):.2f}, "
        f"{med('pagecache_round_ms'):.2f} "
        f"| {med('idle_tick_added_ms'):.2f}, {med('round_tick_added_ms'):.2f} "
        f"({med('round_tick_over_alone_ms'):.2f}) |",
        "",
        f"| raw loop at {n} GPUs, ms | added / raw loop, per pair | target: "
        f"{PLUGIN_TARGET_MS:g} ms where the raw loop read {ISSUE_RAW_16_MS} ms | added at that machine's "
        "speed, ms | pairs under the target |",
        "|---|---|---|---|---|",
        f"| {statistics.median(w.cpu_ms for w in raw):.2f} | {_spread(ratios)} | at most {target:.3f} "
        f"| {_spread([x * ISSUE_RAW_16_MS for x in ratios])} | {sum(x <= target for x in ratios)} of "
        f"{len(ratios)} |",
    ]
    print("\n".join(lines[-7:]), file=sys.stderr, flush=True)
    return lines


def _serving_pairs(args: argparse.Namespace, pairs: int, path: Path | None, n: int) -> list[str]:
    """Exporter and bare server alternately at one GPU count: p99 and its ratio per pair."""
    lines = [
        f"Serving, {pairs} alternating pairs at {n or 'real'} GPUs ({SCRAPERS} concurrent "
        f"scrapers x {args.scrapes} scrapes, gzip): exporter, then a bare aiohttp server with its bytes",
        "",
        "| pair | exporter p50 ms | exporter p99 ms | bare p50 ms | bare p99 ms | p99 exporter / bare |",
        "|---|---|---|---|---|---|",
    ]
    ratios = []
    plugins = PLUGINS_OFF if args.core_only else ()
    for i in range(pairs):
        ours = measure_serving(path, args.scrapes, 0.0, plugins, args.scrape_pause)
        bare = measure_bare_server(ours.body, args.scrapes, args.scrape_pause)
        ratios.append(ours.p99_ms / bare.p99_ms)
        lines.append(
            f"| {i + 1} | {ours.p50_ms:.2f} | {ours.p99_ms:.2f} | {bare.p50_ms:.2f} | {bare.p99_ms:.2f} "
            f"| {ratios[-1]:.2f}x |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"p99 exporter / bare, median of the pairs (quartiles): {_spread(ratios, 'x')}."]
    return lines


def _serving_tables(args: argparse.Namespace, files: dict[int, Path | None]) -> list[str]:
    lines = [
        "",
        f"Serving (exporter subprocess, {SCRAPERS} concurrent scrapers x {args.scrapes} scrapes, "
        + (f"pauses of 0-{2000 * args.scrape_pause:.0f} ms, " if args.scrape_pause else "back to back, ")
        + "after a warm-up, loopback, gzip"
        + (", plug-in collectors off" if args.core_only else ", all collectors")
        + "; one run per GPU count, the largest soaked for --duration):",
        "",
        "| GPUs | text KiB | scrape p50 ms | scrape p99 ms | max ms | RSS MiB | CPU % of one core |",
        "|---|---|---|---|---|---|---|",
    ]
    bodies: dict[int, bytes] = {}
    soak_note = ""
    largest = max(files)
    for n, path in files.items():
        soak = args.duration if n == largest else 0.0
        plugins = PLUGINS_OFF if args.core_only else ()
        r = measure_serving(path, args.scrapes, soak, plugins, args.scrape_pause)
        rss = f"{r.rss_mib:.1f} (after {args.duration:.0f} s)" if r.rss_mib is not None else "-"
        cpu = f"{r.cpu_percent:.1f}" if r.cpu_percent is not None else "-"
        lines.append(
            f"| {n or 'real'} | {r.body_kib:.1f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.max_ms:.2f} "
            f"| {rss} | {cpu} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
        bodies[n] = r.body
        if r.rss_trace:
            trace = ", ".join(
                f"{t:.0f} s {mib:.1f} ({anon:.1f} + {file:.1f})" for t, mib, anon, file in r.rss_trace
            )
            soak_note = (
                f"RSS of the {n or 'real'}-GPU exporter over the soak, MiB (anonymous + file-backed): {trace}"
            )
    lines += ["", soak_note] if soak_note else []
    lines += [
        "",
        "Floor of the method: the same clients against a bare aiohttp app returning the same bytes:",
        "",
        "| GPUs | text KiB | scrape p50 ms | scrape p99 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for n in files:
        r = measure_bare_server(bodies[n], args.scrapes, args.scrape_pause)
        lines.append(
            f"| {n or 'real'} | {r.body_kib:.1f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.max_ms:.2f} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    if args.pairs > 1:
        # single runs of 1,000-2,000 scrapes move the p99 by a millisecond: the ratio comes from pairs
        lines += ["", *_serving_pairs(args, args.pairs, files[largest], largest)]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=40, help="measured sampling cycles per case")
    parser.add_argument(
        "--plugin-cycles",
        type=int,
        default=30,
        help="cycles per run of the plug-in measurement (30: one page-cache round)",
    )
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per concurrent scraper")
    parser.add_argument(
        "--scrape-pause", type=float, default=0.0, help="mean pause of one scraper between scrapes, seconds"
    )
    parser.add_argument("--serving-only", action="store_true", help="skip the CPU-per-cycle table")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to run the 16-GPU exporter "
                        "before reading its RSS and CPU (the issue asks for 600)")  # fmt: skip
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables to this file")
    parser.add_argument(
        "--real", action="store_true", help="use the real NVML driver instead of the simulation"
    )
    parser.add_argument(
        "--core-only",
        action="store_true",
        help="serve with the plug-in collectors (attribution, engines, pagecache) off: not imported",
    )
    parser.add_argument(
        "--serving-pairs",
        type=int,
        default=0,
        help="only this many alternating pairs (exporter, bare server) of the serving measurement at the "
        "largest GPU count: p99 and its ratio per pair, so the machine's drifting load hits both alike",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=9,
        help="repeats inside this run: gpupulse and the raw loop in this many alternating pairs per GPU "
        "count, the plug-in measurement this many times, and this many exporter/bare serving pairs at the "
        "largest count (one 16-GPU run moves by 10-30%% on a shared VM; the tables give medians of the "
        "per-pair ratios with quartiles)",
    )
    parser.add_argument("--bare-server", nargs=2, metavar=("BODY_FILE", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=3, metavar=("KIND", "GPUS", "CYCLES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_server:
        _bare_server(Path(args.bare_server[0]), int(args.bare_server[1]))
        return 0
    if args.one:
        _one(args.one[0], int(args.one[1]), int(args.one[2]))
        return 0
    if args.serving_pairs:
        n = 0 if args.real else max(GPU_COUNTS)
        with tempfile.TemporaryDirectory() as tmp:
            path = scenario_file(n, Path(tmp)) if n else None
            pair_lines = _serving_pairs(args, args.serving_pairs, path, n)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print("\n".join([*pair_lines, "", f"Load average at the end {load}."]))
        return 0
    lines: list[str] = []
    counts = (0,) if args.real else GPU_COUNTS
    with tempfile.TemporaryDirectory() as tmp:
        files = {n: scenario_file(n, Path(tmp)) if n else None for n in counts}
        if not args.serving_only:
            lines += _cpu_table(args, files)
            if not args.real:
                lines += _plugins_table(args, max(counts))
        lines += _serving_tables(args, files)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines += ["", f"Machine: {os.cpu_count()} CPUs, load average at the end {load}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
