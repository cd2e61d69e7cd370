"""Incident replay: the real exporter on simulated incidents, a real Prometheus with our rules, and the
alerts that fire. Each incident must raise exactly its alerts, within a deadline, and nothing else.

All incidents run at once on one Prometheus (scrape and evaluation every second) with the fast rule
profile of tests/alerts/fast-overrides.yaml: the shipped expressions and thresholds, with windows of a
few seconds and `for: 2s`. Each incident is a scenario in exporter/scenarios/incident-*.yaml served by
its own `gpupulse-exporter --simulate`; serving incidents add `gpupulse-sim-engine` processes, pod
attribution comes from the fake kubelet and a fake /proc built from the scenario's `pods` section (its
CPU counters follow each process's `host_cpu_cores`), and page-cache eviction is real (the scenario's
`page_cache` section: a weight file the pagecache collector watches, evicted with posix_fadvise). A DRA
incident's claims come the same way (the fake kubelet's `dynamic_resources`), named through the node's
ResourceSlice, which the exporter watches on the in-process API server of tests/fakes/kube_api.py.
Nothing but the scenario files says what happens when.

Over the whole run (from before Prometheus's first scrape), no alert outside the expected ones may be
pending or firing at any moment: read back from Prometheus's own ALERTS series. Afterwards every panel
query of the fleet, node and serving dashboards must return data (a finite value); the remediation
dashboard, fed by the controller, is checked the same way by tests/demo/test_demo_run.py. The DRA
node's allocation rows, GPU families and per-namespace costs, and the serving node's energy and cost per
generated token per model (expected values derived from the scenario files and alerts/config.yaml), are
checked too.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from alerts.config import load_config
from alerts.generate import render_rules
from alerts.rules.promql import metric_names
from alerts.rules.recording import HARD_LIMIT
from exporter.sim import load_scenario
from exporter.sim.engine_spec import load_engines
from exporter.sim.pagecache import PageCacheScenario, parse_section
from exporter.sim.scenario import ProcessSpec
from tests.alerts.children import child_process, wait_http
from tests.alerts.panel_queries import CONTROLLER_DASHBOARDS, has_data, panel_queries
from tests.alerts.ruleset import ROOT, TESTS_DIR
from tests.attribution.helpers import ProcfsTree, advance_host_cpu, procfs_from_scenario
from tests.fakes.kube_api import FakeKubeAPI, resourceslices_from_scenario
from tests.fakes.kubelet import DRA_DRIVER, FakeKubelet, pods_from_scenario
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus

pytestmark = [
    pytest.mark.integration,
    # start-up, up to DEADLINE_SECONDS of replay, then the whole-run and dashboard queries: the
    # suite's 120 s default is below what a passing run needs on a busy machine (101 s on a quiet one)
    pytest.mark.timeout(240),
]

BIN = Path(sys.executable).parent
SCENARIOS = Path(__file__).resolve().parents[2] / "exporter" / "scenarios"
DEADLINE_SECONDS = 110.0  # the leak replay's third return fires about 90 s in
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
    dra: bool = False  # with attribution: the node's ResourceSlice served by an in-process API server
    # alerts that fire, resolve and fire again: (pod, alert name, at least how many times)
    recurring: tuple[tuple[str, str, int], ...] = ()

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
        "incident-dra",
        {
            # named only through the DRA claim: the XID alert joins gpu_allocation_info's sole holder
            "llama-0": frozenset({"GPUXidAppError"}),
            # both pods of the shared claim hold the idle GPU
            "embed-0": frozenset({"GPUIdleWhileAllocated"}),
            "rerank-0": frozenset({"GPUIdleWhileAllocated"}),
        },
        attributed=True,
        dra=True,
    ),
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
    Incident(
        "incident-leak-returns",
        {"leaky-0": frozenset({"GPUProcessMemoryAboveHardLimit", "GPUProcessMemoryAboveSoftLimit"})},
        attributed=True,
        recurring=(("leaky-0", "GPUProcessMemoryAboveHardLimit", 3),),
    ),
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
        attributed=True,  # the engines' pods hold GPUs: the per-model token rules charge them
    ),
)


async def _follow_host_cpu(root: Path, processes: Sequence[ProcessSpec], started: float) -> None:
    """Advance the fake processes' CPU time along their host_cpu_cores curves, until cancelled."""
    while True:
        advance_host_cpu(root, processes, time.monotonic() - started, CLOCK_TICKS)
        await asyncio.sleep(0.25)


async def _play_page_cache(driver: PageCacheScenario, started: float) -> None:
    """Apply the page_cache section's evictions and warm-ups as scenario time passes, until cancelled."""
    while True:
        await asyncio.to_thread(driver.apply, time.monotonic() - started)
        await asyncio.sleep(0.25)


async def _attribution_args(stack: AsyncExitStack, incident: Incident, tmp: Path, short: Path) -> list[str]:
    doc = yaml.safe_load((SCENARIOS / f"{incident.scenario}.yaml").read_text())
    # unix socket paths are limited to 108 bytes, so the socket lives in a short temp dir
    kubelet = FakeKubelet(str(short / f"{incident.scenario}.sock"), pods_from_scenario(doc))
    await kubelet.start()
    stack.push_async_callback(kubelet.stop)
    tree = ProcfsTree(tmp / f"{incident.scenario}-proc")
    procfs_from_scenario(tree, tmp / f"{incident.scenario}-pods", doc)
    processes = load_scenario(str(SCENARIOS / f"{incident.scenario}.yaml")).processes
    if any(p.host_cpu_cores.const != 0.0 for p in processes):
        follower = asyncio.create_task(_follow_host_cpu(tree.root, processes, time.monotonic()))
        stack.callback(follower.cancel)
    dra: list[str] = []
    if incident.dra:
        api = FakeKubeAPI()
        await api.start()
        stack.push_async_callback(api.stop)
        resourceslices_from_scenario(api, doc)
        token = tmp / f"{incident.scenario}-token"
        token.write_text(api.token)
        dra = [
            "--kube.node-name",
            str(doc["node"]),
            "--kube.api-url",
            api.url,
            "--kube.token-file",
            str(token),
            # the ResourceSlice watch alone, as before --kube.* (whose node name turns every pod view on)
            "--no-attribution.pod-watch",
            "--no-collector.progress",
        ]
    return [
        *dra,
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
    section = load_scenario(str(SCENARIOS / f"{incident.scenario}.yaml")).extra.get("page_cache")
    if section:
        driver = PageCacheScenario(parse_section(section), tmp / f"{incident.scenario}-weights")
        await asyncio.to_thread(driver.prepare)
        for flag in driver.flags():
            args += ["--pagecache.paths", flag]
        args += ["--pagecache.interval", "0.5"]
        player = asyncio.create_task(_play_page_cache(driver, engines_started))
        stack.callback(player.cancel)
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
    exporter = await stack.enter_async_context(child_process(args, tmp / f"{incident.scenario}.log"))
    if late:
        await wait_http(f"http://127.0.0.1:{port}/metrics", exporter)
        for engine, engine_port in late:
            await _start_engine(stack, incident, engine, engine_port, tmp, wait_ready=False)
    return port, exporter


def _start_order(incidents: Sequence[Incident]) -> list[list[Incident]]:
    """The incidents in start-up batches: those without a page_cache section, then those with one."""
    late = [
        i for i in incidents if load_scenario(str(SCENARIOS / f"{i.scenario}.yaml")).extra.get("page_cache")
    ]
    return [batch for batch in ([i for i in incidents if i not in late], late) if batch]


def _target(port: int, model: str, namespace: str, pod: str) -> dict[str, str]:
    """One entry of the exporter's --engines.config."""
    url = f"http://127.0.0.1:{port}/metrics"
    return {"url": url, "engine": "vllm", "model": model, "namespace": namespace, "pod": pod}


async def _start_engine(
    stack: AsyncExitStack, incident: Incident, engine: Engine, port: int, tmp: Path, wait_ready: bool = True
) -> None:
    proc = await stack.enter_async_context(
        child_process(
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
        await wait_http(f"http://127.0.0.1:{port}/metrics", proc)


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
        ports: dict[str, int] = {}
        procs: dict[str, asyncio.subprocess.Process] = {}
        begin = time.monotonic()
        # Incidents that evict page cache start once the others answer: the eviction (45 s into the
        # scenario) needs a residency baseline in Prometheus, and on a loaded machine starting a dozen
        # exporters at once can take most of those 45 s.
        for batch in _start_order(INCIDENTS):
            started = await asyncio.gather(*(_start_incident(stack, i, tmp_path, short) for i in batch))
            for incident, (port, proc) in zip(batch, started, strict=True):
                ports[incident.scenario], procs[incident.scenario] = port, proc
            for incident in batch:
                # a dozen exporters start at once on two cores (as training_rig.py's eight): 60 s, not 20
                await wait_http(
                    f"http://127.0.0.1:{ports[incident.scenario]}/metrics", procs[incident.scenario], 60.0
                )
        t0 = time.monotonic()
        print(f"start-up of {len(INCIDENTS)} incidents: {t0 - begin:.1f} s")
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
            if time.monotonic() - t0 > DEADLINE_SECONDS:
                break
            if not missing and await _recurring_done(prom, time.monotonic() - t0):
                break
            await asyncio.sleep(0.5)
        assert not missing, (
            f"alerts that did not fire within {DEADLINE_SECONDS} s: {sorted(missing, key=str)}"
        )

        for (key, name), seconds in sorted(fired_at.items(), key=lambda item: item[1]):
            print(f"fired after {seconds:5.1f} s: {name} {key}")
        # nothing else fired, or was about to (pending), on any incident at any moment of the run
        await _assert_nothing_unexpected_during_the_run(prom, time.monotonic() - t0, expected)
        await _assert_recurring_alerts_fire_at_the_same_limit(prom, time.monotonic() - t0)

        await _assert_cold_start_measured(prom)
        await _assert_dra_node(prom)
        await _assert_token_costs(prom)
        await _assert_dashboard_queries_return_data(prom)


async def _assert_nothing_unexpected_during_the_run(
    prom: PromHandle, run_seconds: float, expected: dict[tuple[str | None, str | None], frozenset[str]]
) -> None:
    """Every ALERTS sample Prometheus wrote since before its first scrape is an expected alert."""
    window = int(run_seconds) + 5
    seen: dict[tuple[tuple[str | None, str | None], str, str], float] = {}
    for series in await prom.query(f"ALERTS[{window}s]"):
        labels = series["metric"]
        key, name, state = _key(labels), labels["alertname"], labels["alertstate"]
        if name not in expected.get(key, frozenset()):
            first = min(float(ts) for ts, _ in series["values"])
            seen[(key, name, state)] = min(first, seen.get((key, name, state), first))
    assert not seen, "unexpected alerts during the run (first seen at unix time): " + ", ".join(
        f"{name} {state} on {key} at {ts:.0f}" for (key, name, state), ts in sorted(seen.items(), key=str)
    )


async def _firing_starts(prom: PromHandle, node: str, pod: str, name: str, run_seconds: float) -> list[float]:
    """Unix times at which the alert started firing, each time, during the run."""
    selector = f'alertname="{name}", alertstate="firing", node="{node}", pod="{pod}"'
    found = await prom.query(f"ALERTS{{{selector}}}[{int(run_seconds) + 5}s]")
    stamps = sorted(float(ts) for series in found for ts, _ in series["values"])
    # a new firing period starts where the samples (one per second) have a gap
    return [ts for i, ts in enumerate(stamps) if i == 0 or ts - stamps[i - 1] > 2.5]


async def _recurring_done(prom: PromHandle, run_seconds: float) -> bool:
    for incident in INCIDENTS:
        for pod, name, times in incident.recurring:
            if len(await _firing_starts(prom, incident.node, pod, name, run_seconds)) < times:
                return False
    return True


async def _assert_recurring_alerts_fire_at_the_same_limit(prom: PromHandle, run_seconds: float) -> None:
    """A leak that returns after every restart fires every time, at the same hard limit each time."""
    for incident in INCIDENTS:
        for pod, name, times in incident.recurring:
            starts = await _firing_starts(prom, incident.node, pod, name, run_seconds)
            assert len(starts) >= times, f"{name} on {pod} fired {len(starts)} times, expected {times}"
            limits = []
            for ts in starts:
                data = await prom.api(
                    "query",
                    query=f'{HARD_LIMIT}{{namespace="serving", workload="{pod.rsplit("-", 1)[0]}"}}',
                    time=str(ts),
                )
                assert data["result"], f"no hard limit at the firing at {ts}"
                limits.append(float(data["result"][0]["value"][1]))
            gib = ", ".join(f"{v / 2**30:.2f}" for v in limits)
            print(f"{name} on {pod}: fired {len(starts)} times, hard limits (GiB) {gib}")
            assert max(limits) <= min(limits) * 1.01, f"the hard limit moved between returns: {limits}"


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


# The recording rules are averaged over this window before they are compared with the scenario: a 5 s
# rate of counters that step once a second (the exporter's engine scrapes) is within a few per cent only
# on average.
COST_AVERAGE = "30s"
COST_TOLERANCE = 0.10  # relative


def _close(measured: float | None, expected: float, tolerance: float = COST_TOLERANCE) -> bool:
    if measured is None or not math.isfinite(measured):
        return False
    return abs(measured - expected) <= tolerance * expected


def _dra_allocations(doc: dict[str, Any]) -> set[tuple[str, str, str, str, str]]:
    """(namespace, pod, uuid, mig_uuid, resource) per device a scenario pod holds, as the exporter must
    report them: claim devices named as resourceslices_from_scenario publishes them, plugin GPUs by index."""
    gpus = doc["gpus"]
    out = set()
    for pod in doc["pods"]:
        for container in pod["containers"]:
            for claim in container.get("claims", ()):
                for device in claim["devices"]:
                    index, _, mig = str(device).removeprefix("gpu-").partition("-mig-")
                    gpu = gpus[int(index)]
                    mig_uuid = gpu["mig"]["instances"][int(mig)]["uuid"] if mig else ""
                    out.add((pod["namespace"], pod["name"], str(gpu["uuid"]), str(mig_uuid), DRA_DRIVER))
            for index in container.get("gpus", ()):
                out.add((pod["namespace"], pod["name"], str(gpus[index]["uuid"]), "", "nvidia.com/gpu"))
    return out


async def _assert_dra_node(prom: PromHandle) -> None:
    """The DRA node: one allocation row per claim holder, the free GPU in every GPU family, the XID alert
    naming the claim's pod, and per-namespace costs with the shared and the MIG claim."""
    for incident in (i for i in INCIDENTS if i.dra):
        doc = yaml.safe_load((SCENARIOS / f"{incident.scenario}.yaml").read_text())
        node = incident.node
        rows = {
            (m["namespace"], m["pod"], m["uuid"], m.get("mig_uuid", ""), m["resource"])
            for m in (s["metric"] for s in await prom.query(f'gpu_allocation_info{{node="{node}"}}'))
        }
        expected = _dra_allocations(doc)
        assert rows == expected, f"{node}: allocation rows {sorted(rows)}, expected {sorted(expected)}"

        # every GPU family (a series per uuid, no pod) reports the GPU nobody holds as it reports a held one
        families: dict[str, set[str]] = {}
        for s in await prom.query(f'group by (__name__, uuid) ({{node="{node}", uuid!="", pod=""}})'):
            families.setdefault(s["metric"]["uuid"], set()).add(s["metric"]["__name__"])
        held = {uuid for _, _, uuid, _, _ in rows}
        free = [str(g["uuid"]) for g in doc["gpus"] if g["uuid"] not in held]
        plugin_gpu = next(uuid for _, _, uuid, _, resource in rows if resource != DRA_DRIVER)
        assert free, f"{node}: the scenario has no unallocated GPU"
        assert len(families[plugin_gpu]) >= 10, f"{node}: GPU families {sorted(families[plugin_gpu])}"
        for uuid in free:
            lacks = sorted(families[plugin_gpu] - families.get(uuid, set()))
            assert families.get(uuid) == families[plugin_gpu], f"{node}: the free GPU {uuid} lacks {lacks}"

        # the XID alert names the pod of the GPU's own claim, with its namespace, and nothing else
        xid = await prom.query(
            f'last_over_time(ALERTS{{alertname="GPUXidAppError", alertstate="firing", node="{node}"}}[10m])'
        )
        named = {(s["metric"].get("namespace"), s["metric"].get("pod"), s["metric"].get("uuid")) for s in xid}
        xid_pods = {pod for pod, names in incident.expected.items() if "GPUXidAppError" in names}
        owner = next((ns, pod, uuid) for ns, pod, uuid, _, _ in rows if pod in xid_pods)
        assert named == {owner}, f"{node}: GPUXidAppError labels {named}, expected {owner}"

        # GPU-hours by namespace: each GPU's holders share it (the shared claim by SM share, here 3:1),
        # a MIG claim charges its parent GPU; the shared claim's GPU is idle, so its cost is idle cost too
        price = load_config().cost.price_per_gpu_hour
        holders: dict[str, set[tuple[str, str]]] = {}
        for ns, pod, uuid, _, _ in rows:
            holders.setdefault(uuid, set()).add((ns, pod))
        for ns in sorted({ns for ns, *_ in rows}):
            gpus = sum(1 for uuid, pods in holders.items() if any(n == ns for n, _ in pods))
            cost = await prom.query_value(f'namespace:gpu_allocated_cost_per_hour:sum{{namespace="{ns}"}}')
            assert cost is not None and abs(cost - gpus * price) < 1e-6, f"{node}: {ns} costs {cost}/h"
        shares = {
            s["metric"]["pod"]: float(s["value"][1])
            for s in await prom.query(f'uuid_namespace_pod:gpu_usage:share{{node="{node}"}}')
        }
        procs = {p["pid"]: p for p in doc["processes"]}
        for pods in (pods for pods in holders.values() if len(pods) > 1):
            sm = {pod: sum(_sm_of(doc, procs, ns, pod)) for ns, pod in pods}
            for pod, value in sm.items():
                expected_share = value / sum(sm.values())
                assert abs(shares[pod] - expected_share) < 0.01, f"{node}: {pod}'s share {shares[pod]}"
            ns = next(iter(pods))[0]
            idle = await prom.query_value(f'namespace:gpu_idle_cost_per_hour:sum{{namespace="{ns}"}}')
            assert idle is not None and abs(idle - price) < 1e-6, f"{node}: shared claim idle cost {idle}"
        print(f"{node}: {len(rows)} allocation rows, free GPUs {free}, usage shares {shares}")


def _sm_of(doc: dict[str, Any], procs: dict[int, Any], namespace: str, pod: str) -> list[float]:
    """The scenario's sm_utilization of each process of a pod."""
    entry = next(e for e in doc["pods"] if e["namespace"] == namespace and e["name"] == pod)
    return [float(procs[pid].get("sm_utilization", 0.0)) for c in entry["containers"] for pid in c["pids"]]


async def _assert_token_costs(prom: PromHandle) -> None:
    """Energy per generated token and GPU cost per million generated tokens, per model, as the scenario
    implies: tokens/s from the engines' curves, watts and GPUs from the GPUs their pods hold, the price
    from alerts/config.yaml."""
    cost = load_config().cost
    checked = 0
    for incident in (i for i in INCIDENTS if i.engines and i.attributed):
        path = str(SCENARIOS / f"{incident.scenario}.yaml")
        doc = yaml.safe_load((SCENARIOS / f"{incident.scenario}.yaml").read_text())
        scenario = load_scenario(path)
        held = {
            (entry["namespace"], entry["name"]): [i for c in entry["containers"] for i in c.get("gpus", ())]
            for entry in doc.get("pods") or ()
        }
        models: dict[tuple[str, str], list[float]] = {}  # (namespace, model) -> [tokens/s, GPUs, watts]
        for spec in load_engines(path):
            gpus = held.get((spec.namespace, spec.pod), [])
            if not gpus:
                continue  # an engine on no GPU of a pod is charged nothing
            t = scenario.duration_seconds / 2  # the curves the test compares are flat by then
            acc = models.setdefault((spec.namespace, spec.model), [0.0, 0.0, 0.0])
            acc[0] += spec.curves["request_rate"].at(t) * spec.curves["output_tokens"].at(t)
            acc[1] += len(gpus)
            acc[2] += sum(scenario.gpus[i].power_watts.at(t) for i in gpus)
        for (ns, model), (tokens, gpus, watts) in sorted(models.items()):
            selector = f'{{namespace="{ns}", model="{model}"}}'
            joules = watts / tokens
            dollars = gpus * cost.price_per_gpu_hour / 3600 * 1e6 / tokens
            for rule, expected in (
                ("namespace_model:gpu_energy_joules_per_generated_token:ratio", joules),
                ("namespace_model:gpu_cost_per_million_generated_tokens:ratio", dollars),
            ):
                now = await prom.query_value(rule + selector)
                assert now is not None and math.isfinite(now) and now > 0, f"{rule}{selector} = {now}"
                measured = await prom.query_value(f"avg_over_time({rule}{selector}[{COST_AVERAGE}])")
                print(f"{rule}{selector}: {measured:.4f} (expected {expected:.4f}, now {now:.4f})")
                assert _close(measured, expected), (
                    f"{rule}{selector}: {measured} over {COST_AVERAGE}, "
                    f"expected {expected} ± {COST_TOLERANCE:.0%}"
                )
                checked += 1
    assert checked >= 4, "no serving model with GPUs and token counters in the replay"
