"""One pod store per node (issue 37): with attribution, engine discovery and progress all on, the
node's pods are listed once and watched once, and each plug-in reads its own view of them; the old
per-plug-in flags still work for one release, each saying once at start which --kube.* flag replaces it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter import cli, registry
from exporter.collectors.base import NodeState
from exporter.collectors.plugin import PluginContext
from exporter.errors import CollectorError
from exporter.kube import flags as kube_flags
from exporter.kube.client import ApiSettings
from exporter.kube.context import KubeContext
from exporter.kube.pods import PodStore
from tests.fakes.kube_api import FakeKubeAPI, parse_bool

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-a"
RANK = {"jobset.sigs.k8s.io/jobset-name": "llama"}  # a rank of a JobSet: attribution and progress read it
ENGINE = {"gpupulse.io/engine": "vllm", "gpupulse.io/port": "8000"}


def add_rank(api: FakeKubeAPI, name: str, ip: str) -> None:
    """A running rank pod that also serves an engine: every plug-in's view keeps it."""
    api.add_pod("train", name, NODE, labels=RANK, annotations=ENGINE)
    api.update_pod("train", name, lambda p: p["status"].update(podIP=ip))


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FakeKubeAPI]:
    server = FakeKubeAPI()
    await server.start()
    (tmp_path / "token").write_text(server.token)
    try:
        yield server
    finally:
        await server.stop()


def pod_requests(api: FakeKubeAPI) -> tuple[int, int]:
    """(LISTs, WATCHes) of pods the API server was asked for."""
    calls = api.calls("GET", r"^/api/v1/pods$")
    watches = sum(1 for r in calls if parse_bool(r.query.get("watch")))
    return len(calls) - watches, watches


def every_plugin_on(api: FakeKubeAPI, tmp_path: Path, *kube: str) -> list[str]:
    return [
        *kube,
        "--attribution.kubelet-socket", str(tmp_path / "no-kubelet.sock"),  # the pod view needs it set
        "--attribution.kubelet-pods-dir", "",
        "--engines.discover-pods",
        "--progress.pod-logs-dir", str(tmp_path / "logs"),
    ]  # fmt: skip


async def test_one_node_is_one_pod_list_and_one_watch_with_every_plugin_on(
    api: FakeKubeAPI, tmp_path: Path
) -> None:
    add_rank(api, "llama-0", "10.0.0.1")
    plugins = registry.available_plugins()
    kube = ("--kube.api-url", api.url, "--kube.node-name", NODE, "--kube.token-file", str(tmp_path / "token"))
    args = cli.build_parser(plugins).parse_args(every_plugin_on(api, tmp_path, *kube, "--kube.ca-file", ""))
    ctx = PluginContext(KubeContext(kube_flags.api_settings(args, environ={})))
    collectors = registry.build_plugins(args, dict(plugins), ctx)
    store = ctx.kube.pods()
    assert store is not None
    try:
        assert {c.name for c in collectors} >= {"attribution", "engines", "progress"}
        assert store.views == ("attribution", "engines", "progress")  # one store, a view each
        for collector in collectors:  # each one's first round: each waits for the pods it reads
            with contextlib.suppress(CollectorError):  # attribution: no kubelet here
                await collector.collect(NodeState())
        await store.wait_until(lambda: store.stats.watches == 1, 5)
        assert pod_requests(api) == (1, 1)
        # a change reaches every view through the one watch
        add_rank(api, "llama-1", "10.0.0.2")
        by_name = {c.name: c for c in collectors}
        attribution: Any = by_name["attribution"]
        await store.wait_until(lambda: ("train", "llama-1") in attribution.pods.value, 5)
        (engines, progress) = (v for v in store._views if v.name in ("engines", "progress"))
        await store.wait_until(lambda: len(engines.value) == 2, 5)
        assert [t.url for t in engines.value] == [
            "http://10.0.0.1:8000/metrics",
            "http://10.0.0.2:8000/metrics",
        ]
        assert [p.name for p in progress.value] == ["llama-0", "llama-1"]
        assert pod_requests(api) == (1, 1)
        assert all(
            r.query["fieldSelector"] == f"spec.nodeName={NODE}" for r in api.calls("GET", r"^/api/v1/pods$")
        )
    finally:
        for collector in collectors:
            await collector.close()
        await ctx.close()
    await api.wait_open_watches(0)  # the exporter's close ends the one watch


async def test_a_view_that_raises_keeps_its_last_value_and_spares_the_others(
    api: FakeKubeAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = PodStore(ApiSettings(NODE, api.url, token_path=tmp_path / "token", ca_path=None))

    def broken(pods: Mapping[Any, Any]) -> int:
        if len(pods) > 1:
            raise RuntimeError("a plug-in's bug")
        return len(pods)

    counted = store.view("broken", broken)
    names = store.view("names", lambda pods: sorted(name for _, name in pods))
    api.add_pod("ns", "a", NODE)
    store.start()
    try:
        await store.wait_until(lambda: names.value == ["a"], 5)
        api.add_pod("ns", "b", NODE)
        await store.wait_until(lambda: names.value == ["a", "b"], 5)
        api.add_pod("ns", "c", NODE)
        await store.wait_until(lambda: names.value == ["a", "b", "c"], 5)
        assert counted.value == 1 and store.error == "" and store.stats.failures == 0
        failed = [r for r in caplog.records if r.getMessage().startswith("pod view broken failed")]
        assert len(failed) == 1  # once, not on every event
        late = store.view("late", len)  # a view registered after the LIST starts from what is held
        assert late.value == 3
    finally:
        await store.close()


def test_kube_flags_win_over_the_old_ones_and_old_ones_that_disagree_are_refused() -> None:
    plugins = registry.available_plugins()
    parse = cli.build_parser(plugins).parse_args
    old = [
        "--attribution.kube-api-url=http://a:1",
        "--engines.kube-api-url=http://a:1",
        "--progress.node-name=n",
    ]
    got = kube_flags.api_settings(parse(old), environ={})
    assert got is not None and (got.api_url, got.node_name) == ("http://a:1", "n")
    got = kube_flags.api_settings(
        parse([*old, "--kube.api-url=http://b:2", "--kube.node-name=m"]), environ={}
    )
    assert got is not None and (got.api_url, got.node_name) == ("http://b:2", "m")
    with pytest.raises(ValueError, match=r"--engines\.kube-api-url=http://c:3.*set --kube\.api-url once"):
        kube_flags.api_settings(parse([*old, "--engines.kube-api-url=http://c:3"]), environ={})
    assert kube_flags.api_settings(parse([]), environ={}) is None  # no node name: nothing is watched
    got = kube_flags.api_settings(parse([]), environ={"NODE_NAME": "env-node"})
    assert got is not None and got.node_name == "env-node"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--simulate", "basic", "--engines.node-name=x", "--progress.node-name=y"], environ={})
    assert exit_.value.code == 2


async def test_old_flags_warn_once_at_start_and_still_watch_one_store(
    api: FakeKubeAPI, tmp_path: Path
) -> None:
    token = str(tmp_path / "token")
    old = [
        "--attribution.kube-api-url", api.url, "--attribution.node-name", NODE,
        "--attribution.kube-token-file", token,
        "--engines.kube-api-url", api.url, "--engines.node-name", NODE,
        "--progress.kube-api-url", api.url, "--progress.node-name", NODE, "--progress.kube-token-file", token,
    ]  # fmt: skip
    add_rank(api, "llama-0", "10.0.0.1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPULSE_") and k != "NODE_NAME"}
    argv = ["--simulate", "basic", "--web.listen-address", "127.0.0.1:0", "--sampling.interval", "0.2"]
    argv += ["--attribution.interval", "0.2", "--progress.interval", "0.2", "--engines.interval", "0.2"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter.cli", *argv, *every_plugin_on(api, tmp_path, *old),
        cwd=ROOT, env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not (lines and "listening on " in lines[-1]):
                raw = await proc.stderr.readline()
                assert raw, "\n".join(lines)
                lines.append(raw.decode().rstrip())
            port = int(lines[-1].rpartition(":")[2].split()[0])
            # every plug-in has run a round (each waits for the pods on its first) once all three report
            async with aiohttp.ClientSession() as http:
                while True:
                    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                        text = await response.text()
                    ran = set(re.findall(r'^gpupulse_collector_success\{collector="(\w+)"\}', text, re.M))
                    if {"attribution", "engines", "progress"} <= ran and pod_requests(api)[1] >= 1:
                        break
                    await asyncio.sleep(0.1)  # polled: the exporter runs in another process
    finally:
        proc.terminate()
        rest = await proc.stderr.read()
        await proc.wait()
    text = "\n".join(lines) + rest.decode()
    for flag in old[::2]:
        assert len(re.findall(rf"{re.escape(flag)} is deprecated .* use --kube\.", text)) == 1, (flag, text)
    assert pod_requests(api) == (1, 1), text


def test_an_exporter_without_kubernetes_plugins_never_imports_the_api_client() -> None:
    """--kube.* are core flags, yet the client and the reflector (+1.8 MiB with orjson) load only with
    a plug-in that reads the API."""
    code = """
import sys
from exporter import cli, registry
off = {"attribution", "engines", "progress"}
parser = cli.build_parser(registry.available_plugins(skip=off), also_collectors=sorted(off))
args = parser.parse_args(["--kube.node-name", "n", "--no-collector.attribution"])
assert not registry.reads_kube(registry.available_plugins(skip=off))
api = ("exporter.kube.client", "exporter.kube.reflector", "exporter.kube.pods")
print(sorted(m for m in sys.modules if m in api))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
