"""Fleet scale, measured: Prometheus 3 shards and a VictoriaMetrics + vmalert global layer scraping
many simulated nodes with the chart's rules, at several fleet sizes, fitted and compared with the
arithmetic docs/scale.md used to give.

Each simulated node serves a captured exporter page (bench/fleet_pages.py: three quarters training
ranks of 2-node PyTorchJobs, a quarter vLLM serving), rewritten so no two nodes share a series, from
one in-process aiohttp server (pages pre-rendered and gzipped). Layouts, run one after the other:

  single   one Prometheus scraping every node, node and fleet rules loaded (sharding.enabled=false)
  sharded  `--shards` Prometheus shards (hashmod over the node label, the chart's advice), each with
           the chart's node PrometheusRule, remote-writing to a single-node VictoriaMetrics; vmalert
           evaluates the chart's fleet rule file against it (sharding.global=vmalert)

Read per process, from its own /metrics after a warm-up, over a `--window-seconds` window: active
series (prometheus_tsdb_head_series; VictoriaMetrics' hour_metric_ids), samples/s (rate of
prometheus_tsdb_head_samples_appended_total; vm_rows_inserted_total), RSS
(process_resident_memory_bytes), CPU, rule evaluation time per group
(prometheus_rule_group_last_duration_seconds; vmalert_iteration_duration_seconds), scrape duration.

    nice -n 10 .venv/bin/python -m bench.fleet_scale --nodes 250 --nodes 1000 --nodes 2000

A size whose predicted memory (the previous size's RSS, scaled) passes `--max-rss-gib` is not run,
and a run is stopped when its processes' RSS passes it; both are printed. The served values do not
change between scrapes, so chunks compress better than real data: memory is the series' fixed cost.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_pages import PageError, SimNode, fleet, for_node, load_pages, sample_lines
from bench.proofs.harness import free_port, rss_bytes
from demo.neighbours import MissingNeighbourError, neighbour_binary

JOB = "gpupulse-exporter"
GIB = 1024**3
MIB = 1024**2
PER_TARGET_SERIES = (
    5  # up, scrape_duration_seconds, scrape_samples_scraped, ..._post_metric_relabeling, series_added
)

# docs/scale.md before these runs: a `demo` node (587 + 5 series), 2,747 bytes RSS per series measured
# with Prometheus 2.42 at up to 237,204 series, multiplied
DOC_SERIES_PER_NODE = 592
DOC_RSS_BYTES_PER_SERIES = 2747


class FleetError(Exception):
    """A precondition of the bench failed (a binary, a process that did not start, a deadline)."""


# ---------------------------------------------------------------------------------------------- pages


@dataclass
class Pages:
    """Every simulated node's page, gzipped, by path."""

    by_path: dict[str, bytes]
    series: int  # sample lines over all pages

    @classmethod
    def build(cls, nodes: Sequence[SimNode], captured: Mapping[str, str]) -> Pages:
        by_path, series = {}, 0
        for node in nodes:
            text = for_node(captured[node.kind], node)
            series += sample_lines(text)
            by_path[f"/node/{node.name}/metrics"] = gzip.compress(text.encode(), compresslevel=1)
        return cls(by_path, series)


@asynccontextmanager
async def serve_pages(pages: Pages) -> Any:
    """The pages on one loopback port; yields the port."""

    async def metrics(request: web.Request) -> web.Response:
        body = pages.by_path.get(request.path)
        if body is None:
            return web.Response(status=404, text="no such node\n")
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            headers["Content-Encoding"] = "gzip"
            return web.Response(body=body, headers=headers)
        return web.Response(body=gzip.decompress(body), headers=headers)

    app = web.Application()
    app.router.add_get("/node/{name}/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=120)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------------------------------------- rules


async def chart_rules(workdir: Path) -> tuple[Path, Path, Path]:
    """The chart's rules with sharding on (global: vmalert): node rule file, fleet rule file, and both
    in one file as `sharding.enabled: false` renders them."""
    from tests.fakes.helm_api import FakeHelmAPI
    from tests.helm.installs import Installed, effective_values, install

    async def render(values: dict[str, Any], sub: str) -> Installed:
        (workdir / sub).mkdir()
        api = FakeHelmAPI(namespaces={"monitoring"})
        result = await install(api, workdir / sub, "monitoring", values)
        return Installed(effective_values(values), result, api.chart_objects(), api)

    base = {"enabled": True, "namespaceNodeAlerts": False}
    sharded = await render(
        {"prometheusRule": {**base, "sharding": {"enabled": True, "global": "vmalert"}}}, "h1"
    )
    single = await render({"prometheusRule": base}, "h2")
    node = sharded.named("PrometheusRule", "pulse-gpupulse")
    fleet_cm = sharded.named("ConfigMap", "pulse-gpupulse-fleet-rules")
    one = single.named("PrometheusRule", "pulse-gpupulse")
    if node is None or fleet_cm is None or one is None:
        raise FleetError("the chart did not render its PrometheusRule / fleet ConfigMap")
    paths = workdir / "node.rules.yaml", workdir / "fleet.rules.yaml", workdir / "all.rules.yaml"
    paths[0].write_text(yaml.safe_dump({"groups": node["spec"]["groups"]}, sort_keys=False))
    paths[1].write_text(fleet_cm["data"]["gpupulse-fleet.rules.yaml"])
    paths[2].write_text(yaml.safe_dump({"groups": one["spec"]["groups"]}, sort_keys=False))
    return paths


def group_count(rule_file: Path) -> tuple[int, int]:
    """(groups, rules) in a rule file."""
    groups = yaml.safe_load(rule_file.read_text())["groups"]
    return len(groups), sum(len(g["rules"]) for g in groups)


# ---------------------------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """A child process (its own process group) with its log and its metrics URL."""

    name: str
    kind: str  # prometheus, victoriametrics, vmalert
    popen: subprocess.Popen[bytes]
    url: str
    log: Path
    _out: IO[bytes]

    def rss(self) -> int:
        return rss_bytes(self.popen.pid)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._out.close()


@contextmanager
def processes() -> Iterator[list[Proc]]:
    """Every child started here, stopped (by its own PID) on the way out, newest first."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in reversed(started):
            p.stop()


def start(started: list[Proc], name: str, kind: str, args: Sequence[str], url: str, workdir: Path) -> Proc:
    log = workdir / f"{name}.log"
    out = log.open("wb")
    popen = subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT)
    proc = Proc(name, kind, popen, url, log, out)
    started.append(proc)
    return proc


async def wait_ready(
    session: aiohttp.ClientSession, proc: Proc, path: str, within_seconds: float = 120
) -> None:
    deadline = time.monotonic() + within_seconds
    while True:
        if proc.popen.poll() is not None:
            tail = proc.log.read_text(errors="replace")[-2000:]
            raise FleetError(f"{proc.name} exited with {proc.popen.returncode}: {tail}")
        try:
            async with session.get(proc.url + path) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise FleetError(f"{proc.name}: {path} not ready after {within_seconds} s")
        await asyncio.sleep(0.5)


def prometheus_config(
    page_port: int,
    nodes: Sequence[SimNode],
    interval_seconds: int,
    rule_files: Sequence[Path],
    shard: tuple[int, int] | None,
    remote_write: str | None,
) -> dict[str, Any]:
    """One Prometheus' config: every node as a target, kept by hashmod over `node` when sharded."""
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["node"], "target_label": "__metrics_path__", "replacement": "/node/$1/metrics"}
    ]
    external: dict[str, str] = {}
    if shard is not None:
        index, modulus = shard
        relabel += [
            {
                "source_labels": ["node"],
                "modulus": modulus,
                "target_label": "__tmp_hash",
                "action": "hashmod",
            },
            {"source_labels": ["__tmp_hash"], "regex": str(index), "action": "keep"},
        ]
        external["shard"] = str(index)
    every = f"{interval_seconds}s"
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": every,
            "scrape_timeout": f"{max(1, interval_seconds - 2)}s",
            "evaluation_interval": every,
            "external_labels": external,
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{page_port}"], "labels": {"node": n.name}} for n in nodes
                ],
                "relabel_configs": relabel,
            }
        ],
    }
    if remote_write:
        config["remote_write"] = [{"url": remote_write}]
    return config


# ---------------------------------------------------------------------------------------------- reading


Samples = dict[str, list[tuple[dict[str, str], float]]]


async def read_metrics(session: aiohttp.ClientSession, url: str) -> Samples:
    """A process' own /metrics: sample name -> [(labels, value)]."""
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=60)) as r:
        text = await r.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def one(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == want for k, want in labels.items()))


async def instant(session: aiohttp.ClientSession, url: str, promql: str) -> float:
    async with session.get(url + "/api/v1/query", params={"query": promql}) as r:
        body = await r.json()
    result = body.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else math.nan


@dataclass
class Figures:
    """What one process measured over the window."""

    name: str
    kind: str
    series: float = 0.0
    samples_per_second: float = 0.0
    rss_bytes: float = 0.0
    heap_bytes: float = 0.0
    cpu_cores: float = 0.0
    rule_seconds: dict[str, float] = field(default_factory=dict)  # group -> last (or mean) evaluation
    scrape_avg_seconds: float = math.nan
    scrape_max_seconds: float = math.nan
    targets_up: float = math.nan
    targets: float = math.nan
    remote_write_lag_seconds: float = math.nan
    # group evaluations skipped in the window because a round ran past the interval (nan: not read)
    rule_rounds_missed: float = math.nan


def _group_name(label: str) -> str:
    return label.rsplit(";", 1)[-1]


def _last_durations(samples: Samples) -> dict[str, float]:
    return {
        _group_name(lab["rule_group"]): v
        for lab, v in samples.get("prometheus_rule_group_last_duration_seconds", [])
    }


def figures(name: str, kind: str, before: Samples, after: Samples, seconds: float) -> Figures:
    """A process' figures (its kind: prometheus, victoriametrics, vmalert) from two readings of its
    /metrics `seconds` apart."""
    f = Figures(name, kind)
    f.rss_bytes = one(after, "process_resident_memory_bytes")
    f.heap_bytes = one(after, "go_memstats_heap_inuse_bytes")
    f.cpu_cores = (
        one(after, "process_cpu_seconds_total") - one(before, "process_cpu_seconds_total")
    ) / seconds
    if kind == "prometheus":
        f.series = one(after, "prometheus_tsdb_head_series")
        appended = "prometheus_tsdb_head_samples_appended_total"
        f.samples_per_second = (one(after, appended) - one(before, appended)) / seconds
        f.rule_seconds = _last_durations(after)
        missed = "prometheus_rule_group_iterations_missed_total"
        f.rule_rounds_missed = one(after, missed) - one(before, missed)
        highest = one(after, "prometheus_remote_storage_highest_timestamp_in_seconds")
        sent = one(after, "prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
        if sent:
            f.remote_write_lag_seconds = highest - sent
    elif kind == "victoriametrics":
        f.series = one(after, "vm_cache_entries", type="storage/hour_metric_ids")
        f.samples_per_second = (
            one(after, "vm_rows_inserted_total") - one(before, "vm_rows_inserted_total")
        ) / seconds
    elif kind == "vmalert":
        # the mean evaluation of each group over the window, from its summary's sum and count
        def per_group(samples: Samples, name: str) -> dict[str, float]:
            return {lab.get("group", ""): v for lab, v in samples.get(name, [])}

        total, count = "vmalert_iteration_duration_seconds_sum", "vmalert_iteration_duration_seconds_count"
        s1, c1, s0, c0 = (
            per_group(after, total),
            per_group(after, count),
            per_group(before, total),
            per_group(before, count),
        )
        for group in s1:
            evaluations = c1.get(group, 0.0) - c0.get(group, 0.0)
            if evaluations > 0:
                f.rule_seconds[group] = (s1[group] - s0.get(group, 0.0)) / evaluations
    return f


# ---------------------------------------------------------------------------------------------- one run


@dataclass
class Run:
    """One layout at one fleet size."""

    layout: str
    nodes: int
    page_series: int
    procs: list[Figures] = field(default_factory=list)
    seconds_to_up: float = 0.0
    stopped: str = ""  # why the run was stopped, if it was
    load_average: float = 0.0  # the machine's 1-minute load when the window opened (shared machine)

    def of(self, kind: str) -> list[Figures]:
        return [f for f in self.procs if f.kind == kind]

    def total_rss(self) -> float:
        return sum(f.rss_bytes for f in self.procs)


@dataclass(frozen=True)
class Binaries:
    prometheus: Path
    victoria: Path
    vmalert: Path


@dataclass(frozen=True)
class Settings:
    interval_seconds: int
    window_seconds: float
    shards: int
    max_rss_bytes: float


async def _guard(started: Sequence[Proc], limit: float) -> str:
    """Returns (ends) when the children's RSS passes the limit, or one exits."""
    while True:
        for p in started:
            if p.popen.poll() is not None:
                return (
                    f"{p.name} exited with {p.popen.returncode}: {p.log.read_text(errors='replace')[-600:]}"
                )
        total = sum(p.rss() for p in started)
        if total > limit:
            return f"RSS of the children reached {total / GIB:.2f} GiB (limit {limit / GIB:.2f} GiB)"
        await asyncio.sleep(1)


async def run_layout(
    layout: str,
    nodes: Sequence[SimNode],
    pages: Pages,
    rules: tuple[Path, Path, Path],
    bins: Binaries,
    s: Settings,
    workdir: Path,
) -> Run:
    """Start the layout, wait until every target is up and the head settled, measure one window."""
    node_rules, fleet_rules, all_rules = rules
    run = Run(layout, len(nodes), pages.series)
    async with serve_pages(pages) as page_port, aiohttp.ClientSession() as session:
        with processes() as started:
            proms: list[Proc] = []

            def prometheus(name: str, config: dict[str, Any]) -> Proc:
                port = free_port()
                d = workdir / name
                d.mkdir()
                (d / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
                args = [
                    str(bins.prometheus),
                    f"--config.file={d / 'prometheus.yml'}",
                    f"--storage.tsdb.path={d / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ]
                p = start(started, name, "prometheus", args, f"http://127.0.0.1:{port}", workdir)
                proms.append(p)
                return p

            if layout == "single":
                prometheus(
                    "prometheus",
                    prometheus_config(page_port, nodes, s.interval_seconds, [all_rules], None, None),
                )
            else:
                vm_port, vmalert_port = free_port(), free_port()
                vm_url = f"http://127.0.0.1:{vm_port}"
                vm = start(
                    started,
                    "victoriametrics",
                    "victoriametrics",
                    [
                        str(bins.victoria),
                        f"-httpListenAddr=127.0.0.1:{vm_port}",
                        f"-storageDataPath={workdir / 'vm'}",
                        "-search.latencyOffset=0s",
                    ],
                    vm_url,
                    workdir,
                )
                await wait_ready(session, vm, "/health")
                for i in range(s.shards):
                    prometheus(
                        f"shard-{i}",
                        prometheus_config(
                            page_port,
                            nodes,
                            s.interval_seconds,
                            [node_rules],
                            (i, s.shards),
                            f"{vm_url}/api/v1/write",
                        ),
                    )
                va = start(
                    started,
                    "vmalert",
                    "vmalert",
                    [
                        str(bins.vmalert),
                        f"-httpListenAddr=127.0.0.1:{vmalert_port}",
                        f"-rule={fleet_rules}",
                        f"-datasource.url={vm_url}",
                        f"-remoteWrite.url={vm_url}",
                        "-notifier.blackhole",
                        f"-evaluationInterval={s.interval_seconds}s",
                        "-rule.evalDelay=0s",
                    ],
                    f"http://127.0.0.1:{vmalert_port}",
                    workdir,
                )
                await wait_ready(session, va, "/health")
            for p in proms:
                await wait_ready(session, p, "/-/ready")

            guard = asyncio.create_task(_guard(started, s.max_rss_bytes))
            try:
                began = time.monotonic()

                async def all_up() -> bool:
                    ups = [await instant(session, p.url, f'sum(up{{job="{JOB}"}})') for p in proms]
                    return sum(0 if math.isnan(u) else u for u in ups) >= len(nodes)

                deadline = began + 20 * s.interval_seconds + 120
                while not await all_up():
                    if guard.done():
                        run.stopped = guard.result()
                        return run
                    if time.monotonic() > deadline:
                        # this machine could not scrape this many targets in time: a finding, not a crash
                        up = [await instant(session, p.url, f'sum(up{{job="{JOB}"}})') for p in proms]
                        run.stopped = (
                            f"{sum(0 if math.isnan(u) else u for u in up):.0f} of {len(nodes)} targets up"
                            f" after {deadline - began:.0f} s (scrapes slower than the interval)"
                        )
                        return run
                    await asyncio.sleep(1)
                run.seconds_to_up = time.monotonic() - began
                # two more scrape and evaluation rounds: every rule has run over a full head
                await asyncio.sleep(2 * s.interval_seconds)
                before = {p.name: await read_metrics(session, p.url) for p in started}
                run.load_average = os.getloadavg()[0]
                t0 = time.monotonic()
                # a group's last duration is one evaluation: read it every round, keep the median
                rounds: dict[str, list[dict[str, float]]] = {p.name: [] for p in started}
                while (left := t0 + s.window_seconds - time.monotonic()) > 0:
                    done, _ = await asyncio.wait({guard}, timeout=min(left, s.interval_seconds))
                    if done:
                        run.stopped = guard.result()
                        return run
                    for p in started:
                        if p.kind == "prometheus":
                            rounds[p.name].append(_last_durations(await read_metrics(session, p.url)))
                after = {p.name: await read_metrics(session, p.url) for p in started}
                seconds = time.monotonic() - t0
                for p in started:
                    f = figures(p.name, p.kind, before[p.name], after[p.name], seconds)
                    if rounds[p.name]:
                        f.rule_seconds = {
                            g: statistics.median(r[g] for r in rounds[p.name] if g in r)
                            for g in f.rule_seconds
                        }
                    if p.kind == "prometheus":
                        sel = f'{{job="{JOB}"}}'
                        f.scrape_avg_seconds = await instant(
                            session, p.url, f"avg(scrape_duration_seconds{sel})"
                        )
                        f.scrape_max_seconds = await instant(
                            session, p.url, f"max(scrape_duration_seconds{sel})"
                        )
                        f.targets_up = await instant(session, p.url, f"sum(up{sel})")
                        f.targets = await instant(session, p.url, f"count(up{sel})")
                    run.procs.append(f)
            finally:
                guard.cancel()
    return run


# ---------------------------------------------------------------------------------------------- fit and print


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line: (slope, intercept)."""
    n = len(xs)
    if n < 2:
        return (ys[0] / xs[0] if n and xs[0] else math.nan), 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else math.nan
    return slope, my - slope * mx


def _fmt(v: float, unit: str = "") -> str:
    if math.isnan(v):
        return "-"
    if unit == "MiB":
        return f"{v / MIB:,.0f}"
    if unit == "ms":
        return f"{v * 1000:,.1f}"
    if unit == "cores":
        return f"{v:.3f}"
    return f"{v:,.0f}"


def _row(name: str, values: Sequence[str]) -> str:
    return "| " + " | ".join([name, *values]) + " |"


def print_runs(runs: Sequence[Run], s: Settings) -> None:
    """Per-layout tables, a fit per figure and the comparison with docs/scale.md's arithmetic."""
    for layout in ("single", "sharded"):
        mine = [r for r in runs if r.layout == layout and not r.stopped]
        if not mine:
            continue
        print(
            f"\n### layout {layout}: scrape and evaluation every {s.interval_seconds} s,"
            f" window {s.window_seconds:.0f} s\n"
        )
        header = [
            "nodes",
            "load",
            "process",
            "series",
            "samples/s",
            "RSS MiB",
            "heap MiB",
            "CPU cores",
            "scrape avg ms",
            "scrape max ms",
            "up/targets",
            "slowest group",
            "its eval ms",
            "all groups ms",
            "rw lag s",
            "rounds missed",
        ]
        print("| " + " | ".join(header) + " |")
        print("|" + "---:|" * len(header))
        for r in mine:
            for f in r.procs:
                slowest = max(f.rule_seconds.items(), key=lambda kv: kv[1], default=("-", math.nan))
                print(
                    _row(
                        str(r.nodes),
                        [
                            f"{r.load_average:.1f}",
                            f.name,
                            _fmt(f.series),
                            _fmt(f.samples_per_second),
                            _fmt(f.rss_bytes, "MiB"),
                            _fmt(f.heap_bytes, "MiB"),
                            _fmt(f.cpu_cores, "cores"),
                            _fmt(f.scrape_avg_seconds, "ms"),
                            _fmt(f.scrape_max_seconds, "ms"),
                            "-" if math.isnan(f.targets) else f"{f.targets_up:.0f}/{f.targets:.0f}",
                            slowest[0],
                            _fmt(slowest[1], "ms"),
                            _fmt(sum(f.rule_seconds.values()) if f.rule_seconds else math.nan, "ms"),
                            "-"
                            if math.isnan(f.remote_write_lag_seconds)
                            else f"{f.remote_write_lag_seconds:.1f}",
                            _fmt(f.rule_rounds_missed),
                        ],
                    )
                )
    _print_fit(runs, s)


def _print_fit(runs: Sequence[Run], s: Settings) -> None:
    ok = [r for r in runs if not r.stopped]
    sizes = sorted({r.nodes for r in ok})
    if not sizes:
        return
    print("\n### growth per node (least squares over the sizes run) against docs/scale.md's arithmetic\n")
    print(
        "| layout | process | figure | "
        + " | ".join(f"{n} nodes" for n in sizes)
        + " | per node (fit) | per node, docs' arithmetic | measured / docs |"
    )
    print("|---|---|---|" + "---:|" * (len(sizes) + 3))
    doc_series = float(DOC_SERIES_PER_NODE)
    doc_rss = doc_series * DOC_RSS_BYTES_PER_SERIES
    for layout in ("single", "sharded"):
        mine = [r for r in ok if r.layout == layout]
        if not mine:
            continue
        kinds = ["prometheus"] if layout == "single" else ["prometheus", "victoriametrics", "vmalert"]
        rows: list[tuple[str, str, dict[int, float], float]] = []
        scraped = {r.nodes: float(r.page_series + PER_TARGET_SERIES * r.nodes) for r in mine}
        rows.append(("scraped", "series scraped (pages + 5 per target)", scraped, doc_series))
        for kind in kinds:
            label = f"all {s.shards} shards" if layout == "sharded" and kind == "prometheus" else kind
            by = {r.nodes: r.of(kind) for r in mine}

            def total(attr: str, by: dict[int, list[Figures]] = by) -> dict[int, float]:
                return {n: sum(getattr(f, attr) for f in fs) for n, fs in by.items()}

            if kind != "vmalert":
                rows.append((label, "active series", total("series"), doc_series))
                rows.append(
                    (label, "samples/s", total("samples_per_second"), doc_series / s.interval_seconds)
                )
            rows.append(
                (label, "RSS bytes", total("rss_bytes"), doc_rss if kind == "prometheus" else math.nan)
            )
            rows.append((label, "CPU cores", total("cpu_cores"), math.nan))
            if kind != "victoriametrics":
                evals = {n: sum(sum(f.rule_seconds.values()) for f in fs) for n, fs in by.items()}
                rows.append((label, "rule evaluation s, all groups", evals, math.nan))
            if kind == "prometheus" and layout == "sharded":
                rows.append(
                    (
                        "largest shard",
                        "RSS bytes",
                        {n: max(f.rss_bytes for f in fs) for n, fs in by.items()},
                        doc_rss / s.shards,
                    )
                )
        for label, figure, points, doc in rows:
            xs = sorted(points)
            slope, _ = fit([float(x) for x in xs], [points[x] for x in xs])
            cells = [
                (f"{points[n]:,.0f}" if abs(points[n]) >= 10 else f"{points[n]:.3f}") if n in points else "-"
                for n in sizes
            ]
            ratio = slope / doc if not math.isnan(doc) and doc and not math.isnan(slope) else math.nan
            print(
                f"| {layout} | {label} | {figure} | "
                + " | ".join(cells)
                + f" | {slope:,.4g} | "
                + ("-" if math.isnan(doc) else f"{doc:,.4g}")
                + " | "
                + ("-" if math.isnan(ratio) else f"{ratio:.2f}")
                + " |"
            )
    for r in runs:
        if r.stopped:
            print(f"\n{r.layout} at {r.nodes} nodes: {r.stopped}")


# ---------------------------------------------------------------------------------------------- main


def load_run(line: str) -> Run:
    """One Run from its --results JSON line."""
    doc = json.loads(line)
    procs = [Figures(**f) for f in doc.pop("procs")]
    return Run(**doc, procs=procs)


def _binaries() -> Binaries:
    try:
        return Binaries(
            neighbour_binary("prometheus"),
            neighbour_binary("victoriametrics", "victoria-metrics"),
            neighbour_binary("victoriametrics", "vmalert"),
        )
    except MissingNeighbourError as e:
        raise FleetError(str(e)) from e


async def bench(
    sizes: Sequence[int], layouts: Sequence[str], s: Settings, keep: bool, results: Path | None
) -> list[Run]:
    """Every layout at every size, smallest first; a size predicted past the memory limit is skipped."""
    bins = _binaries()
    captured = load_pages()
    root = Path(tempfile.mkdtemp(prefix="gp-fleet-"))
    runs: list[Run] = []
    try:
        rules = await chart_rules(root)
        for label, path in zip(("node", "fleet", "all"), rules, strict=True):
            g, n = group_count(path)
            print(f"rules {label}: {g} groups, {n} rules ({path.name})", flush=True)
        for layout in layouts:
            last: Run | None = None
            for n in sorted(sizes):
                if last is not None and last.total_rss() and not last.stopped:
                    predicted = last.total_rss() * n / last.nodes
                    if predicted > s.max_rss_bytes:
                        why = (
                            f"predicted RSS {predicted / GIB:.2f} GiB > limit"
                            f" {s.max_rss_bytes / GIB:.2f} GiB; not run"
                        )
                        runs.append(Run(layout, n, 0, stopped=why))
                        if results is not None:
                            with results.open("a") as out:
                                out.write(json.dumps(dataclasses.asdict(runs[-1])) + "\n")
                        print(f"{layout} {n}: {why}", flush=True)
                        continue
                nodes = fleet(n)
                pages = Pages.build(nodes, captured)
                workdir = root / f"{layout}-{n}"
                workdir.mkdir()
                t = time.monotonic()
                print(f"{layout} {n} nodes ({pages.series:,} page series) ...", flush=True)
                run = await run_layout(layout, nodes, pages, rules, bins, s, workdir)
                print(
                    f"  {time.monotonic() - t:.0f} s; up after {run.seconds_to_up:.0f} s;"
                    f" RSS {run.total_rss() / GIB:.2f} GiB;"
                    f" load average {run.load_average:.1f}"
                    + (f"; STOPPED: {run.stopped}" if run.stopped else ""),
                    flush=True,
                )
                runs.append(run)
                last = run
                if results is not None:
                    with results.open("a") as out:
                        out.write(json.dumps(dataclasses.asdict(run)) + "\n")
                if not keep:
                    shutil.rmtree(workdir, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--nodes", type=int, action="append", help="fleet sizes (repeat); default 500, 1000, 2000"
    )
    parser.add_argument("--layout", action="append", choices=("single", "sharded"), help="default both")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument(
        "--interval-seconds", type=int, default=30, help="scrape and rule evaluation interval"
    )
    parser.add_argument("--window-seconds", type=float, default=90.0)
    parser.add_argument("--max-rss-gib", type=float, default=8.0, help="children's RSS limit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, TSDBs)")
    parser.add_argument("--results", type=Path, help="append each run as a JSON line to this file")
    parser.add_argument(
        "--report", type=Path, action="append", help="print the tables of saved --results files; run nothing"
    )
    args = parser.parse_args(argv)
    sizes = args.nodes or [500, 1000, 2000]
    if any(n < 1 for n in sizes) or args.shards < 1 or args.interval_seconds < 2 or args.window_seconds <= 0:
        parser.error("sizes and shards must be positive, the interval at least 2 s, the window positive")
    s = Settings(args.interval_seconds, args.window_seconds, args.shards, args.max_rss_gib * GIB)
    if args.report:
        runs = [load_run(line) for path in args.report for line in path.read_text().splitlines() if line]
        print_runs(runs, s)
        return 0
    try:
        runs = asyncio.run(bench(sizes, args.layout or ["single", "sharded"], s, args.keep, args.results))
    except (FleetError, PageError) as e:
        print(f"fleet_scale: {e}", file=sys.stderr)
        return 1
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    print_runs(runs, s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
