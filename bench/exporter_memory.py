"""What the exporter's memory is made of, and whether it grows (not a test): a table of RSS and traced
bytes per part, on the simulated 16-GPU node with every collector, pods and engines churning.

    .venv/bin/python -m bench.exporter_memory [--gpus 16] [--ticks 600] [--scrape-every 15]

Two fresh interpreters run the same sequence: one reads VmRSS from /proc after each stage (no
tracing: tracemalloc's own bookkeeping would inflate the RSS), the other runs under tracemalloc and
groups what is still allocated at each stage by the part of the code that allocated it. The stages:

1. the imports of an exporter with every collector on (the CLI, the three plug-ins, the simulation);
2. the node: simulated NVML for the `large` scenario cut to --gpus GPUs (64 processes), 16 GPU worker
   threads, every collector; for the plug-ins a fake kubelet (110 pods, its own process), a fake
   /proc for the 64 processes, 4 simulated engines (their own processes) and a 64 MiB weight file;
3. --ticks sampling ticks, the scenario clock moving 1 s per tick (so --ticks 600 is the sampling
   work of 10 minutes, done as fast as the CPU allows; the plug-ins run on their shipped intervals
   of scenario time), a scrape (render + gzip) every --scrape-every ticks, and churn: every 30 ticks
   one engine leaves the target list (the one that left before comes back) and 8 processes move to
   other pods (their cgroup in the fake /proc changes), so series appear and disappear.

RSS and traced bytes are printed every 100 ticks: a leak shows as a rise between those rows. The
simulated NVML lives in the measured process, so its memory is part of the totals (its own row).

`--imports` prints what each import costs instead: one fresh interpreter imports the groups below
in order and reads VmRSS after each, twice: as this checkout runs (this machine sets
PYTHONDONTWRITEBYTECODE, so every module of ours is compiled in the measured process) and with
bytecode caches written beforehand (in a temporary PYTHONPYCACHEPREFIX), as an installed image runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1 << 20
CHURN_TICKS = 30
# (part, path fragments of the allocating file); the first match names an allocation
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("simulated NVML (exporter/sim)", ("/exporter/sim/",)),
    ("NVML seam and GPU workers (exporter/nvml.py, collectors/gpus.py)",
     ("/exporter/nvml.py", "/collectors/gpus.py")),
    ("series tables and their text (collectors/series.py)", ("/collectors/series.py",)),
    ("NVML collectors (collectors/*)", ("/exporter/collectors/",)),
    ("engines: pages, histograms, derived series (exporter/engines)", ("/exporter/engines/",)),
    ("attribution: pods, PIDs, devices (exporter/attribution)", ("/exporter/attribution/",)),
    ("reflector caches (exporter/kube; off without an API server)", ("/exporter/kube/",)),
    ("page cache (exporter/pagecache)", ("/exporter/pagecache/",)),
    ("snapshots: families and rendered bytes (exporter/snapshot.py, sampler.py)",
     ("/exporter/snapshot.py", "/exporter/sampler.py")),
    ("kubernetes_asyncio (the exporter should never import it)", ("/kubernetes_asyncio/",)),
    ("prometheus_client", ("/prometheus_client/",)),
    ("aiohttp and its parts", ("/aiohttp/", "/multidict/", "/yarl/", "/aiohappyeyeballs/")),
    ("h2, hpack, hyperframe (kubelet client)", ("/h2/", "/hpack/", "/hyperframe/")),
    ("h11 (engine pages' HTTP/1.1)", ("/h11/",)),
    ("transports (exporter/wire)", ("/exporter/wire/",)),
    ("grpc and protobuf (fake kubelets)", ("/grpc/", "/google/protobuf/")),
    ("pynvml", ("/pynvml.py",)),
    ("asyncio, threading and the rest of the standard library", ("/lib/python3",)),
)  # fmt: skip


def _rss_mib() -> float:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) / 1024
    return float("nan")


def _part_of(filename: str) -> str:
    if filename.startswith("<frozen importlib"):
        return "code of imported modules (<frozen importlib>)"
    for part, fragments in PARTS:
        if any(f in filename for f in fragments):
            return part
    if "site-packages/" in filename:
        return "other site-packages: " + filename.split("site-packages/", 1)[1].split("/", 1)[0]
    return "other"


def _traced_parts() -> dict[str, float]:
    snap = tracemalloc.take_snapshot()
    out: dict[str, float] = {}
    for stat in snap.statistics("filename"):
        part = _part_of(stat.traceback[0].filename)
        out[part] = out.get(part, 0.0) + stat.size / MIB
    return out


def _run(gpus: int, ticks: int, scrape_every: int, trace: bool) -> dict[str, Any]:
    """One interpreter's sequence; returns {stage: value} (RSS MiB, or traced MiB per part)."""
    report: dict[str, Any] = {"stages": [], "ticks": [], "rendered": {}}

    def stage(name: str) -> None:
        gc.collect()
        if trace:
            report["stages"].append((name, _traced_parts()))
        else:
            report["stages"].append((name, _rss_mib()))

    if trace:
        tracemalloc.start(1)
    stage("interpreter and this script")
    import asyncio

    from exporter import cli, registry  # noqa: F401  (what the exporter imports at start)
    from exporter.sim import install  # noqa: F401

    plugins = registry.available_plugins()
    stage("imports: exporter, the three plug-ins, the simulation")

    import yaml

    from bench.engines_bench import _KINDS, _start_engines, _Targets
    from bench.exporter import ROOT as BENCH_ROOT
    from bench.exporter import Target, _fake_proc, scenario_file
    from exporter.attribution.collector import AttributionCollector, AttributionSettings
    from exporter.collectors.gpus import GpuFleet
    from exporter.collectors.xid import XidCounter
    from exporter.config import ExporterSettings
    from exporter.engines.collector import EnginesCollector
    from exporter.nvml import Nvml
    from exporter.pagecache.collector import PageCacheCollector, PageCacheSettings
    from exporter.sampler import Sampler

    # the plug-ins built below; `progress` (training step lines from pod logs) needs rank pods and
    # their logs, which this node has none of: it is off here, as on a serving node
    assert {"attribution", "engines", "pagecache"} <= set(plugins), plugins
    workdir = Path(tempfile.mkdtemp(prefix="gpm"))
    weights = BENCH_ROOT / ".work" / "bench" / "memory" / "model-00001-of-00001.safetensors"
    weights.parent.mkdir(parents=True, exist_ok=True)
    if not weights.exists() or weights.stat().st_size != 64 * MIB:
        weights.write_bytes(os.urandom(64 * MIB))
    kubelet_socket = str(workdir / "kubelet.sock")
    kubelet = subprocess.Popen(
        [sys.executable, "-m", "bench.attribution_bench", "--serve", kubelet_socket, "--pods", "110"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    loop = asyncio.new_event_loop()
    engines_yaml = workdir / "engines.yaml"
    engines_yaml.write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "gpus": [{"model": "H100-SXM5-80GB"}],
                "engines": [{"name": f"e{i}", "kind": _KINDS[i], "model": f"model-{i}"} for i in range(4)],
            }
        )
    )
    procs, all_targets = loop.run_until_complete(_start_engines(4, engines_yaml))
    try:
        assert kubelet.stdout is not None
        kubelet.stdout.readline()  # "ready"
        with Target(scenario_file(gpus, workdir)) as target:
            nvml = Nvml()
            nvml.init()
            nvml.discover()
            settings = ExporterSettings()
            fleet = GpuFleet(nvml, target.clock, settings.gpu_call_timeout_seconds)
            ctx = registry.BuiltinContext(fleet, XidCounter(), settings)
            assert target.sim is not None
            pids = sorted({p.pid for p in target.sim.scenario.processes})
            _fake_proc(workdir / "proc", workdir / "pods", pids)
            targets = _Targets(list(all_targets))
            collectors: list[Any] = [f(ctx) for f in registry.BUILTINS.values()]
            collectors += [
                AttributionCollector(
                    AttributionSettings(
                        kubelet_socket_path=kubelet_socket,
                        kubelet_pods_dir=str(workdir / "pods"),
                        procfs_path=str(workdir / "proc"),
                    )
                ),
                EnginesCollector([targets]),
                PageCacheCollector(PageCacheSettings(paths=(str(weights.parent),), scan_mapped=False)),
            ]
            sampler = Sampler(collectors, settings, target.clock, gpu_status=fleet)
            stage("the node: simulated NVML, 16 GPU workers, every collector (before the first tick)")
            gone: Any = None
            t0 = time.monotonic()
            for tick in range(1, ticks + 1):
                target.advance()
                snap = loop.run_until_complete(sampler.sample_once())
                if tick % scrape_every == 0:
                    snap.gzipped()
                if tick % CHURN_TICKS == 0:
                    _churn(tick, targets, all_targets, workdir / "proc", pids, gone)
                    gone = all_targets[(tick // CHURN_TICKS) % len(all_targets)]
                if tick == 10:
                    stage("after 10 ticks (first rounds of every collector)")
                if tick % 100 == 0 or tick == ticks:
                    gc.collect()
                    total = sum(_traced_parts().values()) if trace else _rss_mib()
                    report["ticks"].append((tick, total, time.monotonic() - t0))
            snap.gzipped()
            report["rendered"] = {
                "text_kib": len(snap.body) / 1024,
                "gzip_kib": len(snap.gzipped()) / 1024,
                "families": len(snap.families),
            }
            stage(f"after {ticks} ticks with churn")
            for c in collectors:
                loop.run_until_complete(c.close())
            fleet.close()
            nvml.shutdown()
    finally:
        for p in procs:
            p.terminate()
            loop.run_until_complete(p.wait())
        loop.close()
        kubelet.terminate()
        kubelet.wait(10)
    return report


def _churn(tick: int, targets: Any, all_targets: list[Any], proc: Path, pids: list[int], gone: Any) -> None:
    """One engine leaves (the one that left last time comes back); 8 processes change pods."""
    listed = [t for t in all_targets if t is not all_targets[(tick // CHURN_TICKS) % len(all_targets)]]
    targets._targets = listed
    for k in range(8):
        n = (tick // CHURN_TICKS * 8 + k) % len(pids)
        pod = (n + tick // CHURN_TICKS) % 32
        uid = f"{pod:08x}-0000-4000-8000-{pod:012x}"
        (proc / str(pids[n]) / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{uid.replace('-', '_')}.slice/cri-containerd-{pids[n]:064x}.scope\n"
        )


# (group, modules): what an exporter with every collector imports, in the order it imports them, then
# what only some configurations import on first use
IMPORT_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("aiohttp (server and engine client; ssl, asyncio, http parsers)", ("aiohttp",)),
    ("prometheus_client, yaml, orjson", ("prometheus_client", "yaml", "orjson")),
    ("pynvml", ("pynvml",)),
    ("exporter core: CLI, sampler, server, NVML collectors", ("exporter.cli", "exporter.registry")),
    ("engines plug-in (with h11, its HTTP/1.1)", ("exporter.engines.collector",)),
    ("attribution plug-in (without grpc or protobuf)", ("exporter.attribution.collector",)),
    ("page-cache plug-in", ("exporter.pagecache.collector",)),
    ("OTLP push (--otlp.endpoint only)", ("exporter.otlp.push",)),
    ("h2 (first kubelet List; a kubelet socket only)", ("h2.connection",)),
    ("protobuf (fake kubelets only; the exporter decodes without it)", ("google.protobuf.json_format",)),
    # the API watches (pods, ResourceSlices) use exporter/kube's own client on aiohttp: no
    # kubernetes_asyncio (+37.4 MiB here before it went); the attribution plug-in imports most of this
    (
        "API watches: exporter/kube client, reflector and pod store, pod discovery, progress pods",
        ("exporter.kube.pods", "exporter.engines.kube_pods", "exporter.progress.pods"),
    ),
    ("grpc.aio (fake kubelets only; the exporter's client was grpc.aio before h2)", ("grpc.aio",)),
)


def _imports_child() -> None:
    import importlib

    for group, modules in IMPORT_GROUPS:
        before = _rss_mib()
        for module in modules:
            importlib.import_module(module)
        print(json.dumps([group, before, _rss_mib()]))


def _imports_table() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = cache
        cmd = [sys.executable, "-m", "bench.exporter_memory", "--imports-child"]
        rows = []
        for run_env in (env, cached, cached):  # the second run writes the caches, the third reads them
            out = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, check=True)
            rows.append([json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")])
    plain, _, compiled = rows
    print("RSS added by each import group, one fresh interpreter importing them in this order:\n")
    print("| group | as run here (compiled at import), MiB | with bytecode caches, MiB | total with caches |")
    print("|---|---|---|---|")
    print(f"| interpreter | {plain[0][1]:.1f} | {compiled[0][1]:.1f} | {compiled[0][1]:.1f} |")
    for (group, b0, a0), (_, b1, a1) in zip(plain, compiled, strict=True):
        print(f"| {group} | +{a0 - b0:.1f} | +{a1 - b1:.1f} | {a1:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--ticks", type=int, default=600, help="sampling ticks (1 s of scenario time each)")
    parser.add_argument("--scrape-every", type=int, default=15, help="render + gzip every this many ticks")
    parser.add_argument("--imports", action="store_true", help="only the RSS each import group adds")
    parser.add_argument("--one", choices=("rss", "trace"), help=argparse.SUPPRESS)
    parser.add_argument("--imports-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.imports_child:
        _imports_child()
        return 0
    if args.imports:
        _imports_table()
        return 0
    if args.one:
        print(json.dumps(_run(args.gpus, args.ticks, args.scrape_every, args.one == "trace")))
        return 0
    runs = {}
    for kind in ("rss", "trace"):
        cmd = [sys.executable, "-m", "bench.exporter_memory", "--one", kind, "--gpus", str(args.gpus),
               "--ticks", str(args.ticks), "--scrape-every", str(args.scrape_every)]  # fmt: skip
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, timeout=3600)
        runs[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    rss, traced = runs["rss"], runs["trace"]
    print(f"Exporter memory, {args.gpus} simulated GPUs, every collector, {args.ticks} ticks, churn every "
          f"{CHURN_TICKS} ticks, a scrape every {args.scrape_every} ticks:\n")  # fmt: skip
    print("| stage | RSS MiB | RSS added MiB | traced MiB (Python allocations) |")
    print("|---|---|---|---|")
    prev = 0.0
    for (name, mib), (_, parts) in zip(rss["stages"], traced["stages"], strict=True):
        print(f"| {name} | {mib:.1f} | {mib - prev:+.1f} | {sum(parts.values()):.1f} |")
        prev = mib
    first, last = traced["stages"][1][1], traced["stages"][-1][1]
    imports = traced["stages"][1][1]
    print("\nWhat is allocated at the end, by the part of the code that allocated it (tracemalloc), and how")
    print("much of it was there after the imports:\n")
    print("| part | traced MiB at the end | of which after the imports | added by running |")
    print("|---|---|---|---|")
    for part in sorted(set(first) | set(last), key=lambda p: -last.get(p, 0.0)):
        end, imp = last.get(part, 0.0), imports.get(part, 0.0)
        print(f"| {part} | {end:.2f} | {imp:.2f} | {end - imp:+.2f} |")
    r = traced["rendered"]
    print(f"\nRendered exposition of the last snapshot: {r['text_kib']:.1f} KiB text, "
          f"{r['gzip_kib']:.1f} KiB gzip, {r['families']} families (a snapshot holds its own until the "
          "next replaces it).")  # fmt: skip
    print("\nGrowth over the run (RSS from the untraced run, traced bytes from the traced one):\n")
    print("| tick | RSS MiB | traced MiB |")
    print("|---|---|---|")
    for (tick, mib, _), (_, traced_mib, _) in zip(rss["ticks"], traced["ticks"], strict=True):
        print(f"| {tick} | {mib:.1f} | {traced_mib:.2f} |")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nMachine: {os.cpu_count()} CPUs, load average at the end {load}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
