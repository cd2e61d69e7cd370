"""The progress collector against the in-process API server (real pod watch), real log files in a
kubelet-shaped directory and real HTTP endpoints: rank pods' steps, annotated counters, gone pods,
and the hostile endpoints and files."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.plugin import PluginContext
from exporter.kube import flags as kube_flags
from exporter.kube.client import ApiSettings
from exporter.kube.context import KubeContext
from exporter.kube.pods import PodStore
from exporter.progress.collector import ProgressCollector, ProgressSettings
from exporter.progress.pods import progress_pod
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI

NODE = "gpu-node-a"
NS = "train"
STEPS = "gpu_training_progress_steps_total"
LAST = "gpu_training_progress_last_step_timestamp_seconds"
INTERVAL = "gpu_training_progress_update_interval_seconds"
ERRORS = "gpupulse_progress_read_errors_total"


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    server = FakeKubeAPI()
    await server.start()
    yield server
    await server.stop()


def rank_pod(api: FakeKubeAPI, name: str, rank: int, annotations: dict[str, str] | None = None) -> Any:
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "llama",
        "uid": str(uuid.uuid4()),
        "controller": True,
    }
    return api.add_pod(
        NS,
        name,
        NODE,
        labels={"training.kubeflow.org/replica-index": str(rank)},
        annotations=annotations,
        owner_references=[owner],
    )


def log_dir(root: Path, pod: Any, container: str = "main") -> Path:
    meta = pod["metadata"]
    d = root / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
    d.mkdir(parents=True, exist_ok=True)
    return d


def cri(text: str, second: int) -> bytes:
    return f"2026-12-01T10:00:{second:02d}.5Z stdout F {text}\n".encode()


T = 1796119200.5  # 2026-12-01T10:00:00.5Z


class Node:
    def __init__(self, api: FakeKubeAPI, tmp_path: Path) -> None:
        self.api, self.logs = api, tmp_path / "pods"
        self.logs.mkdir()
        self.token = tmp_path / "token"
        self.token.write_text(api.token)
        self.clock = FakeClock(start=T + 3600)
        self.stores: list[PodStore] = []

    def collector(self, **overrides: Any) -> ProgressCollector:
        settings = ProgressSettings(pod_logs_dir=str(self.logs), first_wait_seconds=10.0, **overrides)
        store = PodStore(
            ApiSettings(NODE, self.api.url, token_path=self.token, ca_path=None, retry_seconds=0.05)
        )
        self.stores.append(store)
        return ProgressCollector(settings, store, self.clock)


@pytest.fixture
async def node(api: FakeKubeAPI, tmp_path: Path) -> AsyncIterator[Node]:
    made = Node(api, tmp_path)
    yield made
    for store in made.stores:  # the exporter's, shared: it closes them after the collectors
        await store.close()


def samples(families: Sequence[Metric], name: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for fam in families:
        for s in fam.samples:
            if s.name == name:
                keys = ("pod", "container", "rank", "source") if name != ERRORS else ("source", "reason")
                out[tuple(s.labels[k] for k in keys)] = s.value
    return out


async def until(collector: ProgressCollector, done: Any, rounds: int = 200) -> Sequence[Metric]:
    """Rounds until `done(families)`: the pod watch delivers changes asynchronously."""
    for _ in range(rounds):
        fams = await collector.collect(NodeState())
        if done(fams):
            return fams
        await asyncio.sleep(0.02)
    raise AssertionError(f"never reached; last: {[s for f in fams for s in f.samples]}")


async def test_a_rank_pods_step_lines_give_its_step_when_it_changed_and_how_often(node: Node) -> None:
    pod = rank_pod(node.api, "llama-worker-0", 0)
    log = log_dir(node.logs, pod) / "0.log"
    log.write_bytes(cri("step=10, skipped=0", 0))
    collector = node.collector()
    try:
        fams = await until(collector, lambda f: samples(f, STEPS))
        key = ("llama-worker-0", "main", "0", "log")
        assert samples(fams, STEPS) == {key: 10.0}
        assert samples(fams, LAST) == {key: T}
        (labels,) = [s.labels for f in fams for s in f.samples if s.name == STEPS]
        assert labels["training_job_kind"] == "PyTorchJob.kubeflow.org" and labels["training_job"] == "llama"
        with log.open("ab") as f:
            f.write(cri("step=20, skipped=0", 8) + cri("saving checkpoint", 9))
        fams = await collector.collect(NodeState())
        assert samples(fams, STEPS) == {key: 20.0}
        assert samples(fams, LAST) == {key: T + 8}
        assert samples(fams, INTERVAL) == {key: 8.0}
        # nothing new: the step and its time stay (a hung job shows exactly this)
        fams = await collector.collect(NodeState())
        assert samples(fams, LAST) == {key: T + 8}
    finally:
        await collector.close()


async def test_the_series_of_a_pod_that_is_gone_are_dropped(node: Node) -> None:
    for rank in (0, 1):
        pod = rank_pod(node.api, f"llama-worker-{rank}", rank)
        (log_dir(node.logs, pod) / "0.log").write_bytes(cri(f"iteration {rank + 5}/100 |", 1))
    collector = node.collector()
    try:
        await until(collector, lambda f: len(samples(f, STEPS)) == 2)
        node.api.remove_pod(NS, "llama-worker-1")
        fams = await until(collector, lambda f: len(samples(f, STEPS)) == 1)
        assert set(samples(fams, LAST)) == {("llama-worker-0", "main", "0", "log")}
    finally:
        await collector.close()


async def test_pods_that_are_no_rank_or_opt_out_are_not_read(node: Node) -> None:
    web_pod = node.api.add_pod(NS, "web-1", NODE, owner=("Deployment", "web"))
    out = rank_pod(node.api, "llama-worker-0", 0, {"gpupulse.io/progress-log": "false"})
    for pod in (web_pod, out):
        (log_dir(node.logs, pod) / "0.log").write_bytes(cri("step=3", 1))
    assert progress_pod(web_pod) is None and progress_pod(out) is None
    other = rank_pod(node.api, "llama-worker-1", 1)
    (log_dir(node.logs, other) / "0.log").write_bytes(cri("step=3", 1))
    collector = node.collector()
    try:
        fams = await until(collector, lambda f: samples(f, STEPS))
        assert set(samples(fams, STEPS)) == {("llama-worker-1", "main", "1", "log")}
    finally:
        await collector.close()


async def test_a_missing_log_is_counted_and_gives_no_series(node: Node) -> None:
    rank_pod(node.api, "llama-worker-0", 0)  # no directory under the log root
    collector = node.collector()
    try:
        fams = await until(collector, lambda f: samples(f, ERRORS))
        assert samples(fams, ERRORS) == {("log", "missing"): 1.0}
        assert samples(fams, STEPS) == {}
    finally:
        await collector.close()


class Endpoint:
    """A job's own metrics page; `hang` makes it accept and never answer."""

    def __init__(self) -> None:
        self.body = "# TYPE train_steps counter\ntrain_steps_total 12\n"
        self.hang = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        if self.hang.is_set():
            await self.release.wait()
        return web.Response(text=self.body)


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[Endpoint, int]]:
    ep = Endpoint()
    app = web.Application()
    app.router.add_get("/metrics", ep.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield ep, port
    ep.release.set()
    await runner.cleanup()


async def test_an_annotated_counter_is_read_and_a_counter_going_backwards_is_a_restart(
    node: Node, endpoint: tuple[Endpoint, int]
) -> None:
    ep, port = endpoint
    ann = {"gpupulse.io/progress-metric": "train_steps_total", "gpupulse.io/progress-port": str(port)}
    rank_pod(node.api, "llama-worker-0", 0, ann)
    node.api.update_pod(NS, "llama-worker-0", lambda p: p["status"].update({"podIP": "127.0.0.1"}))
    collector = node.collector()
    key = ("llama-worker-0", "", "0", "metric")
    try:
        fams = await until(collector, lambda f: samples(f, STEPS))
        assert samples(fams, STEPS) == {key: 12.0}
        first = node.clock.time()
        assert samples(fams, LAST) == {key: first}
        node.clock.advance(30)
        fams = await collector.collect(NodeState())
        assert samples(fams, LAST) == {key: first}  # unchanged value: no progress
        ep.body = "train_steps_total 20\n"
        node.clock.advance(30)
        fams = await collector.collect(NodeState())
        assert samples(fams, STEPS) == {key: 20.0}
        assert samples(fams, INTERVAL) == {key: 60.0}
        ep.body = "train_steps_total 3\n"  # the rank restarted from an early checkpoint
        node.clock.advance(5)
        fams = await collector.collect(NodeState())
        assert samples(fams, STEPS) == {key: 3.0}
        assert samples(fams, LAST) == {key: first + 65}
        assert samples(fams, INTERVAL) == {key: 60.0}
    finally:
        await collector.close()


async def test_an_endpoint_that_hangs_costs_its_deadline_and_keeps_the_last_step(
    node: Node, endpoint: tuple[Endpoint, int]
) -> None:
    ep, port = endpoint
    ann = {"gpupulse.io/progress-metric": "train_steps_total", "gpupulse.io/progress-port": str(port)}
    rank_pod(node.api, "llama-worker-0", 0, ann)
    node.api.update_pod(NS, "llama-worker-0", lambda p: p["status"].update({"podIP": "127.0.0.1"}))
    collector = node.collector(scrape_timeout_seconds=0.2)
    key = ("llama-worker-0", "", "0", "metric")
    try:
        await until(collector, lambda f: samples(f, STEPS))
        ep.hang.set()
        fams = await asyncio.wait_for(collector.collect(NodeState()), collector.deadline_seconds)
        assert samples(fams, ERRORS) == {("metric", "timeout"): 1.0}
        assert samples(fams, STEPS) == {key: 12.0}  # a hung job's hung endpoint: still no progress
        ep.hang.clear()
        ep.release.set()
        ep.body = "# a page without the counter\nother_total 1\n"
        fams = await collector.collect(NodeState())
        assert samples(fams, ERRORS)[("metric", "no_metric")] == 1.0
    finally:
        await collector.close()


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpupulse.io/progress-metric": "steps_total"},  # no port
        {"gpupulse.io/progress-metric": "steps_total", "gpupulse.io/progress-port": "70000"},
        {"gpupulse.io/progress-metric": "not a name{}", "gpupulse.io/progress-port": "9000"},
        {
            "gpupulse.io/progress-metric": "s",
            "gpupulse.io/progress-port": "9000",
            "gpupulse.io/progress-scheme": "ftp",
        },
    ],
)
def test_a_malformed_annotation_falls_back_to_the_logs(annotations: dict[str, str]) -> None:
    pod = {
        "metadata": {
            "namespace": NS,
            "name": "w-0",
            "uid": "u",
            "annotations": annotations,
            "labels": {"jobset.sigs.k8s.io/jobset-name": "j"},
        },
        "spec": {"containers": [{"name": "main"}, {"name": "../etc"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.5"},
    }
    got = progress_pod(pod)
    assert got is not None and got.metric is None and got.containers == ("main",)


def _args(*argv: str) -> Any:
    from exporter import registry
    from exporter.cli import build_parser

    plugins = registry.available_plugins()
    return build_parser(plugins).parse_args(list(argv)), plugins


def _context(args: Any) -> PluginContext:
    return PluginContext(KubeContext(kube_flags.api_settings(args, environ={})))


async def test_the_collector_is_off_without_a_node_name_and_on_with_one() -> None:
    from exporter.progress import collector as module

    for off in ([], ["--kube.node-name", ""], ["--kube.node-name", NODE, "--progress.node-name", ""]):
        args, _ = _args(*off)
        assert module.from_args(args, _context(args)) is None
    for flag in ("--kube.node-name", "--progress.node-name"):  # the second deprecated, still read
        args, _ = _args(flag, NODE, "--progress.step-pattern", r"epoch \d+ batch (\d+)")
        ctx = _context(args)
        built = module.from_args(args, ctx)
        assert built is not None and built.settings.patterns == (r"epoch \d+ batch (\d+)",)
        store = ctx.kube.pods()
        assert store is not None and store.views == ("progress",) and store.settings.node_name == NODE
        await built.close()
        await ctx.close()
    args = _args("--no-collector.progress", "--kube.node-name", NODE)[0]
    assert module.from_args(args, _context(args)) is None


@pytest.mark.parametrize("pattern", [r"step \d+", r"step=(\d+"])
def test_a_bad_step_pattern_is_a_clear_error_at_start(pattern: str) -> None:
    from exporter.progress import collector as module

    args, _ = _args("--kube.node-name", NODE, "--progress.step-pattern", pattern)
    with pytest.raises(SystemExit, match=r"--progress\.step-pattern: step pattern"):
        module.from_args(args, _context(args))


class _HungRead:
    """A log read stuck in the kernel (a hung mount) until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def read(self, patterns: Any) -> Any:
        self.release.wait(30)
        raise OSError("released")


async def test_a_hung_log_read_costs_its_deadline_and_keeps_the_last_step(node: Node) -> None:
    pod = rank_pod(node.api, "llama-worker-0", 0)
    (log_dir(node.logs, pod) / "0.log").write_bytes(cri("step=10, skipped=0", 0))
    collector = node.collector(log_timeout_seconds=0.3, log_item_timeout_seconds=0.1)
    key = ("llama-worker-0", "main", "0", "log")
    hung = _HungRead()
    try:
        await until(collector, lambda f: samples(f, STEPS))
        collector._tails[(NS, "llama-worker-0", "main", "log")] = hung  # type: ignore[assignment]
        fams = await asyncio.wait_for(collector.collect(NodeState()), collector.deadline_seconds)
        assert samples(fams, ERRORS) == {("log", "timeout"): 1.0}
        assert samples(fams, STEPS) == {key: 10.0}
    finally:
        hung.release.set()
        await collector.close()
