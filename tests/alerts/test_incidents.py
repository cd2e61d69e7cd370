"""Incident replay: the real exporter on simulated incidents, a real Prometheus with our rules, and the
alerts that fire. Each incident must raise exactly its alerts, within a deadline, and nothing else.

All incidents run at once on one Prometheus (scrape and evaluation every second) with the fast rule
profile of tests/alerts/fast-overrides.yaml: the shipped expressions and thresholds, with windows of a
few seconds and `for: 2s`. Each incident is a scenario in exporter/scenarios/incident-*.yaml served by
its own `gpupulse-exporter --simulate`; serving incidents add `gpupulse-sim-engine` processes, pod
attribution comes from the fake kubelet and a fake /proc built from the scenario's `pods` section (the
test advances the fake CPU counters), and page-cache eviction is real (posix_fadvise on a weight file
the pagecache collector watches). Afterwards every panel query of the fleet, node and serving
dashboards must return data (a finite value); the remediation dashboard, fed by the controller, is
checked the same way by tests/demo/test_demo_run.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from dashboards.alertgen import render_rules
from dashboards.rules.promql import metric_names
from exporter.engines.sim_spec import load_engines
from tests.alerts.panel_queries import CONTROLLER_DASHBOARDS, has_data, panel_queries
from tests.alerts.ruleset import ROOT, TESTS_DIR
from tests.attribution.helpers import ProcfsTree, procfs_from_scenario
from tests.fakes.kubelet import FakeKubelet, pods_from_scenario
from tests.fakes.prometheus_process import PromHandle, free_port, prometheus_available, running_prometheus

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not prometheus_available(), reason="prometheus not installed"),
]

BIN = Path(sys.executable).parent
SCENARIOS = Path(__file__).resolve().parents[2] / "exporter" / "scenarios"
DEADLINE_SECONDS = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ENGINE_FIXTURES = ROOT / "tests" / "fixtures" / "engines"


@dataclass(frozen=True)
class Engine:
    """A `gpupulse-sim-engine` playing one engine of the incident's scenario."""

    name: str  # in the scenario's `engines` section
    model: str
    namespace: str
    pod: str
    # started once the exporter runs (its /metrics answers 503 for `ready_after_seconds`), so the
    # exporter sees the whole start-up and reports inference_cold_start_seconds
    after_exporter: bool = False


@dataclass(frozen=True)
class RecordedEngine:
    """A recorded engine exposition (tests/fixtures/engines) served verbatim by the test."""

    fixture: str
    model: str
    namespace: str
    pod: str


@dataclass(frozen=True)
class Incident:
    """One replayed incident: where its alerts come from and which must fire."""

    scenario: str
    expected: dict[str | None, frozenset[str]]  # pod (None: node-level alerts) -> alert names
    engines: tuple[Engine, ...] = ()
    recorded_engines: tuple[RecordedEngine, ...] = ()
    kill_after_first_scrape: bool = False
    broken_engines_config: bool = False  # an unparsable --engines.config: that collector fails every round
    attributed: bool = False  # fake kubelet and /proc from the scenario's `pods` section
    host_cpu_cores: Mapping[int, float] = field(default_factory=dict)  # pid -> cores the fake /proc burns
    weights: tuple[str, str, str] | None = None  # (model, namespace, pod) of a real weight file
    evict_weights_at_seconds: float = 26.0  # engine-scenario time the test evicts it from the page cache

    @property
    def node(self) -> str:
        return self.scenario

    @property
    def job(self) -> str:
        return "gpupulse-" + self.scenario


INCIDENTS = (
    Incident("incident-overheat", {None: frozenset({"GPUTemperatureHigh", "GPUThermalThrottling"})}),
    Incident(
        "incident-starved",
        {"resnet-0": frozenset({"GPUStarvedByHost", "GPUIdleWhileAllocated"})},
        engines=(Engine("resnet", "resnet50", "serving", "resnet-0"),),
        attributed=True,
        host_cpu_cores={8501: 0.95, 8502: 0.3},
    ),
    Incident(
        "incident-colocated",
        {
            "small-a-7c5ddbdf54-x9z2k": frozenset(
                {"GPUProcessMemoryAboveSoftLimit", "GPUProcessMemoryAboveHardLimit"}
            ),
            "small-b-6d8f9c7b5d-q4w7p": frozenset({"GPUProcessMemoryAboveSoftLimit"}),
        },
        attributed=True,
    ),
    Incident("incident-xid79", {None: frozenset({"GPUFellOffBus"})}),
    Incident(
        "incident-hwfaults",
        {
            "xid-app-0": frozenset({"GPUXidAppError"}),
            None: frozenset(
                {
                    "GPUXidResetRequired",
                    "GPUEccUncorrectable",
                    "GPURowRemapPending",
                    "GPURowRemapFailure",
                    "GPUPcieLinkDegraded",
                    "GPUExporterStale",
                }
            ),
        },
        attributed=True,
    ),
    Incident("incident-leak", {None: frozenset({"GPUMemoryNearFull"})}),
    Incident("incident-dead-exporter", {None: frozenset({"GPUExporterDown"})}, kill_after_first_scrape=True),
    Incident(
        "incident-broken-collector", {None: frozenset({"GPUCollectorFailing"})}, broken_engines_config=True
    ),
    Incident(
        "incident-serving",
        {
            "llm-spike-0": frozenset({"InferenceLatencyP99Spike", "ModelWeightsEvictedFromPageCache"}),
            "llm-kv-0": frozenset({"KVCacheHitRateDrop"}),
            "qwen-queue-0": frozenset({"InferenceQueueGrowing"}),
        },
        engines=(
            Engine("p99-spike", "llama-3-8b", "serving", "llm-spike-0"),
            Engine("kv-drop", "llama-3-8b", "serving", "llm-kv-0"),
            Engine("queue", "qwen-7b", "serving", "qwen-queue-0"),
            Engine("cold-start", "mistral-7b", "serving", "mistral-cold-0", after_exporter=True),
        ),
        # vLLM V0 has no prefix-cache counters, only the gpu_prefix_cache_hit_rate gauge: the exporter
        # passes it through as inference_kv_cache_hit_ratio (the simulated engine always has counters)
        recorded_engines=(RecordedEngine("vllm-v0-0.7.3.prom", "llama-3.1-8b", "serving", "llm-v0-0"),),
        weights=("llama-3-8b", "serving", "llm-spike-0"),
    ),
)


async def _wait_http(url: str, proc: asyncio.subprocess.Process, timeout_seconds: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: process exited with {proc.returncode}")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not answering after {timeout_seconds} s")
            await asyncio.sleep(0.1)


@asynccontextmanager
async def _process(args: list[str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*args, stdout=out, stderr=asyncio.subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _set_cpu_ticks(root: Path, pid: int, ticks: int) -> None:
    """Rewrite utime in the fake /proc/<pid>/stat (atomically: the exporter reads it concurrently)."""
    stat = root / str(pid) / "stat"
    head, _, rest = stat.read_text().rpartition(") ")
    fields = rest.split()
    fields[11] = str(ticks)  # utime, counted from the state field
    tmp = stat.with_suffix(".tmp")
    tmp.write_text(f"{head}) {' '.join(fields)}\n")
    tmp.replace(stat)


async def _burn_cpu(root: Path, cores: Mapping[int, float]) -> None:
    """Advance the fake processes' CPU time as if they used `cores` CPUs, until cancelled."""
    start = time.monotonic()
    while True:
        for pid, n in cores.items():
            _set_cpu_ticks(root, pid, int(n * CLOCK_TICKS * (time.monotonic() - start)))
        await asyncio.sleep(0.25)


def _write_weights(directory: Path) -> Path:
    """A weight file, written and synced."""
    directory.mkdir(parents=True)
    path = directory / "model-00001-of-00001.safetensors"
    with path.open("wb") as f:
        f.write(os.urandom(32 << 20))
        f.flush()
        os.fsync(f.fileno())
    return path


def _read_through(path: Path) -> None:
    with path.open("rb") as f:
        while f.read(8 << 20):
            pass


async def _evict_at(path: Path, when: float) -> None:
    """Keep the file cached until monotonic time `when`, then drop its pages (as the seed's log job did)."""
    # An engine keeps reading its weights. The kernel may drop a few MiB of a freshly written file within a
    # second (seen: 30 of 32 MiB resident), which would stay under the alert's "was >= 95%" condition.
    while time.monotonic() < when:
        await asyncio.to_thread(_read_through, path)
        await asyncio.sleep(min(0.5, max(0.0, when - time.monotonic())))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def _attribution_args(stack: AsyncExitStack, incident: Incident, tmp: Path, short: Path) -> list[str]:
    doc = yaml.safe_load((SCENARIOS / f"{incident.scenario}.yaml").read_text())
    # unix socket paths are limited to 108 bytes, so the socket lives in a short temp dir
    kubelet = FakeKubelet(str(short / f"{incident.scenario}.sock"), pods_from_scenario(doc))
    await kubelet.start()
    stack.push_async_callback(kubelet.stop)
    tree = ProcfsTree(tmp / f"{incident.scenario}-proc")
    procfs_from_scenario(tree, tmp / f"{incident.scenario}-pods", doc)
    if incident.host_cpu_cores:
        burner = asyncio.create_task(_burn_cpu(tree.root, incident.host_cpu_cores))
        stack.callback(burner.cancel)
    return [
        "--attribution.kubelet-socket",
        kubelet.socket_path,
        "--attribution.kubelet-pods-dir",
        str(tmp / f"{incident.scenario}-pods"),
        "--path.procfs",
        str(tree.root),
        "--attribution.interval",
        "0.5",
        "--attribution.kubelet-refresh-interval",
        "1",
    ]


async def _start_incident(
    stack: AsyncExitStack, incident: Incident, tmp: Path, short: Path
) -> tuple[int, asyncio.subprocess.Process]:
    """Start the incident's engines and exporter; returns the exporter's port and process."""
    args = [str(BIN / "gpupulse-exporter"), "--simulate", str(SCENARIOS / f"{incident.scenario}.yaml")]
    if incident.attributed:
        args += await _attribution_args(stack, incident, tmp, short)
    engines_started = time.monotonic()
    if incident.weights:
        model, namespace, pod = incident.weights
        weights = _write_weights(tmp / "weights" / model)
        args += [
            "--pagecache.paths",
            f"{model}@{namespace}/{pod}={weights.parent}",
            "--pagecache.interval",
            "0.5",
        ]
        evictor = asyncio.create_task(_evict_at(weights, engines_started + incident.evict_weights_at_seconds))
        stack.callback(evictor.cancel)
    if incident.broken_engines_config:
        broken = tmp / f"{incident.scenario}-engines.yaml"
        broken.write_text("engines: [ {url: 12\n")
        args += ["--engines.config", str(broken), "--engines.interval", "1"]
    targets: list[dict[str, str]] = []
    late: list[tuple[Engine, int]] = []
    for engine in incident.engines:
        port = free_port()
        targets.append(_target(port, engine.model, engine.namespace, engine.pod))
        if engine.after_exporter:
            late.append((engine, port))
        else:
            await _start_engine(stack, incident, engine, port, tmp)
    for recorded in incident.recorded_engines:
        port = await _serve_recorded(stack, ENGINE_FIXTURES / recorded.fixture)
        targets.append(_target(port, recorded.model, recorded.namespace, recorded.pod))
    if targets:
        config = tmp / f"{incident.scenario}-engines.yaml"
        config.write_text(yaml.safe_dump({"engines": targets}))
        args += ["--engines.config", str(config), "--engines.interval", "1"]
    port = free_port()
    args += ["--web.listen-address", f"127.0.0.1:{port}", "--sampling.interval", "0.5"]
    exporter = await stack.enter_async_context(_process(args, tmp / f"{incident.scenario}.log"))
    if late:
        await _wait_http(f"http://127.0.0.1:{port}/metrics", exporter)
        for engine, engine_port in late:
            await _start_engine(stack, incident, engine, engine_port, tmp, wait_ready=False)
    return port, exporter


def _target(port: int, model: str, namespace: str, pod: str) -> dict[str, str]:
    """One entry of the exporter's --engines.config."""
    url = f"http://127.0.0.1:{port}/metrics"
    return {"url": url, "engine": "vllm", "model": model, "namespace": namespace, "pod": pod}


async def _start_engine(
    stack: AsyncExitStack, incident: Incident, engine: Engine, port: int, tmp: Path, wait_ready: bool = True
) -> None:
    proc = await stack.enter_async_context(
        _process(
            [
                str(BIN / "gpupulse-sim-engine"),
                "--scenario",
                str(SCENARIOS / f"{incident.scenario}.yaml"),
                "--engine",
                engine.name,
                "--listen",
                f"127.0.0.1:{port}",
            ],
            tmp / f"engine-{engine.name}.log",
        )
    )
    if wait_ready:
        await _wait_http(f"http://127.0.0.1:{port}/metrics", proc)


async def _serve_recorded(stack: AsyncExitStack, fixture: Path) -> int:
    """Serve a recorded exposition on a free port until the stack closes; returns the port."""
    body = await asyncio.to_thread(fixture.read_bytes)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return int(runner.addresses[0][1])


def _prometheus_config(ports: dict[str, int], rule_names: list[str]) -> str:
    scrape = [
        {
            "job_name": incident.job,
            "static_configs": [
                {"targets": [f"127.0.0.1:{ports[incident.scenario]}"], "labels": {"node": incident.node}}
            ],
        }
        for incident in INCIDENTS
    ]
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": rule_names,
            "scrape_configs": scrape,
        }
    )


def _key(labels: dict[str, str]) -> tuple[str | None, str | None]:
    return labels.get("node"), labels.get("pod") or None


def _expected() -> dict[tuple[str | None, str | None], frozenset[str]]:
    return {(i.node, pod): names for i in INCIDENTS for pod, names in i.expected.items()}


async def _alerts(prom: PromHandle, state: str) -> dict[tuple[str | None, str | None], set[str]]:
    out: dict[tuple[str | None, str | None], set[str]] = {}
    for series in await prom.query(f'ALERTS{{alertstate="{state}"}}'):
        out.setdefault(_key(series["metric"]), set()).add(series["metric"]["alertname"])
    return out


async def test_incidents_raise_exactly_their_alerts_and_dashboards_have_data(tmp_path: Path) -> None:
    overrides = yaml.safe_load((TESTS_DIR / "fast-overrides.yaml").read_text())
    rules = []
    for name, text in render_rules(overrides=overrides).items():
        (tmp_path / name).write_text(text)
        rules.append(tmp_path / name)

    async with AsyncExitStack() as stack:
        short = Path(tempfile.mkdtemp(prefix="gp-"))
        stack.callback(shutil.rmtree, short, True)
        started = await asyncio.gather(*(_start_incident(stack, i, tmp_path, short) for i in INCIDENTS))
        ports = {i.scenario: port for i, (port, _) in zip(INCIDENTS, started, strict=True)}
        procs = {i.scenario: proc for i, (_, proc) in zip(INCIDENTS, started, strict=True)}
        for incident in INCIDENTS:
            await _wait_http(f"http://127.0.0.1:{ports[incident.scenario]}/metrics", procs[incident.scenario])
        t0 = time.monotonic()
        prom = await stack.enter_async_context(
            running_prometheus(_prometheus_config(ports, [r.name for r in rules]), rule_files=rules)
        )
        for incident in INCIDENTS:
            if incident.kill_after_first_scrape:
                await prom.wait_for(f'up{{job="{incident.job}"}} == 1')
                procs[incident.scenario].terminate()

        expected = _expected()
        fired_at: dict[tuple[tuple[str | None, str | None], str], float] = {}
        while True:
            firing = await _alerts(prom, "firing")
            for key, names in firing.items():
                for name in names & expected.get(key, frozenset()):
                    fired_at.setdefault((key, name), time.monotonic() - t0)
            missing = {(k, n) for k, names in expected.items() for n in names} - set(fired_at)
            if not missing or time.monotonic() - t0 > DEADLINE_SECONDS:
                break
            await asyncio.sleep(0.5)
        assert not missing, (
            f"alerts that did not fire within {DEADLINE_SECONDS} s: {sorted(missing, key=str)}"
        )

        # nothing else fires or is about to (pending) on any incident
        for state in ("firing", "pending"):
            for key, names in (await _alerts(prom, state)).items():
                unexpected = names - expected.get(key, frozenset())
                assert not unexpected, f"{state} on {key}: {sorted(unexpected)}"
        for (key, name), seconds in sorted(fired_at.items(), key=lambda item: item[1]):
            print(f"fired after {seconds:5.1f} s: {name} {key}")

        await _assert_cold_start_measured(prom)
        await _assert_dashboard_queries_return_data(prom)


async def _assert_cold_start_measured(prom: PromHandle) -> None:
    """The late engine's cold start: at least its 503 phase, plus at most a few scrape rounds."""
    for incident in INCIDENTS:
        specs = {s.name: s for s in load_engines(str(SCENARIOS / f"{incident.scenario}.yaml"))}
        for engine in (e for e in incident.engines if e.after_exporter):
            ready = specs[engine.name].ready_after_seconds
            seconds = await prom.query_value(
                f'inference_cold_start_seconds{{node="{incident.node}", pod="{engine.pod}"}}'
            )
            assert seconds is not None, f"no cold start for {engine.pod}"
            assert ready <= seconds < ready + 15, (
                f"{engine.pod}: cold start {seconds} s, ready after {ready} s"
            )


async def _assert_dashboard_queries_return_data(prom: PromHandle) -> None:
    """Every panel query of the dashboards the exporter feeds returns a finite value."""
    present = set(await prom.api("label/__name__/values"))
    queries = [q for q in panel_queries(rate_interval="5s") if q.uid not in CONTROLLER_DASHBOARDS]
    empty = []
    for query in queries:
        if not has_data(await prom.query(query.expr)):
            # name what is missing: a metric no incident produced, or data that is there but NaN/filtered
            absent = sorted(n for n in metric_names(query.expr) if not {n, n + "_bucket"} & present)
            empty.append(f"{query} (absent metrics: {', '.join(absent) or 'none'})")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
    print(f"dashboard queries with data: {len(queries)} (remediation dashboard: tests/demo/test_demo_run.py)")
