"""Incident replay: the real exporter on simulated incidents, a real Prometheus with our rules, and the
alerts that fire. Each incident must raise exactly its alerts, within a deadline, and nothing else.

All incidents run at once on one Prometheus (scrape and evaluation every second) with the fast rule
profile of tests/alerts/fast-overrides.yaml: the shipped expressions and thresholds, with windows of a
few seconds and `for: 2s`. Each incident is a scenario in exporter/scenarios/incident-*.yaml served by
its own `gpupulse-exporter --simulate`; serving incidents add `gpupulse-sim-engine` processes, pod
attribution comes from the fake kubelet and a fake /proc built from the scenario's `pods` section (the
test advances the fake CPU counters), and page-cache eviction is real (posix_fadvise on a weight file
the pagecache collector watches). Afterwards every dashboard query whose metrics exist must return data.
"""

from __future__ import annotations

import asyncio
import json
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

from dashboards.alertgen import render_rules
from dashboards.build import JSON_DIR
from dashboards.rules.promql import metric_names
from tests.alerts.ruleset import TESTS_DIR
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


@dataclass(frozen=True)
class Incident:
    """One replayed incident: where its alerts come from and which must fire."""

    scenario: str
    expected: dict[str | None, frozenset[str]]  # pod (None: node-level alerts) -> alert names
    engines: tuple[tuple[str, str, str, str], ...] = ()  # (engine name, model, namespace, pod)
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
        engines=(("resnet", "resnet50", "serving", "resnet-0"),),
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
            ("p99-spike", "llama-3-8b", "serving", "llm-spike-0"),
            ("kv-drop", "llama-3-8b", "serving", "llm-kv-0"),
            ("queue", "qwen-7b", "serving", "qwen-queue-0"),
        ),
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
    """A weight file, written and synced: fully resident in the page cache until evicted."""
    directory.mkdir(parents=True)
    path = directory / "model-00001-of-00001.safetensors"
    with path.open("wb") as f:
        f.write(os.urandom(32 << 20))
        f.flush()
        os.fsync(f.fileno())
    return path


async def _evict_at(path: Path, when: float) -> None:
    """Drop the file's pages from the page cache at monotonic time `when` (what the seed's log job did)."""
    await asyncio.sleep(max(0.0, when - time.monotonic()))
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
    if incident.engines:
        targets = []
        for name, model, namespace, pod in incident.engines:
            port = free_port()
            engine = await stack.enter_async_context(
                _process(
                    [
                        str(BIN / "gpupulse-sim-engine"),
                        "--scenario",
                        str(SCENARIOS / f"{incident.scenario}.yaml"),
                        "--engine",
                        name,
                        "--listen",
                        f"127.0.0.1:{port}",
                    ],
                    tmp / f"engine-{name}.log",
                )
            )
            await _wait_http(f"http://127.0.0.1:{port}/metrics", engine)
            targets.append(
                {"url": f"http://127.0.0.1:{port}/metrics", "engine": "vllm", "model": model}
                | {"namespace": namespace, "pod": pod}
            )
        config = tmp / f"{incident.scenario}-engines.yaml"
        config.write_text(yaml.safe_dump({"engines": targets}))
        args += ["--engines.config", str(config), "--engines.interval", "1"]
    port = free_port()
    args += ["--web.listen-address", f"127.0.0.1:{port}", "--sampling.interval", "0.5"]
    exporter = await stack.enter_async_context(_process(args, tmp / f"{incident.scenario}.log"))
    return port, exporter


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


def _dashboard_targets() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every panel query, Grafana variables filled in."""
    fill = {
        "$__rate_interval": "5s",
        "$__range_s": "60",
        "$__range": "60s",
        "$node": ".*",
        "$namespace": ".*",
        "$pod": ".*",
        "$model": ".*",
    }
    out = []
    for path in sorted(JSON_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in fill.items():
                    expr = expr.replace(var, value)
                out.append((board["uid"], panel["title"], expr))
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

        await _assert_dashboard_queries_return_data(prom)


async def _assert_dashboard_queries_return_data(prom: PromHandle) -> None:
    present = set(await prom.api("label/__name__/values"))
    checked, empty, unproven = 0, [], []
    for uid, title, expr in _dashboard_targets():
        names = {n for n in metric_names(expr) if n not in {"ALERTS"}}
        # a histogram is present when its _bucket series is
        names = {n if n in present or (n + "_bucket") not in present else n + "_bucket" for n in names}
        if not names <= present:
            unproven.append(f"{uid} / {title}")
            continue
        checked += 1
        if not await prom.query(expr):
            empty.append(f"{uid} / {title}: {expr}")
    assert not empty, "dashboard queries without data although their metrics exist:\n" + "\n".join(empty)
    # the incidents cover the GPU, node and serving dashboards' core panels
    print(f"dashboard queries with data: {checked}; metrics absent in these incidents: {len(unproven)}")
    for line in unproven:
        print(f"  not proven: {line}")
    assert checked >= 55, f"only {checked} dashboard queries had their metrics; not proven: {unproven}"
