"""`gpupulse-demo` end to end: real Prometheus, Alertmanager, controller and sim engine as children."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import get_args

import aiohttp
import pytest
import yaml

from alerts.config import load_config
from demo.dranode import DRA_SCENARIO
from demo.simnode import DEFAULT_SCENARIO
from exporter.sim.engine_spec import load_engines
from remediation.diagnosis.types import Layer
from tests.alerts.panel_queries import CONTROLLER_DASHBOARDS, PanelQuery, by_uid, has_data, panel_queries

# on the current line (Prometheus 3.x, Alertmanager 0.3x: demo/neighbours.py); with --no-install a
# missing binary ends the demo with its message and the test fails
pytestmark = pytest.mark.integration

CONSOLE_SCRIPT = Path(sys.executable).with_name("gpupulse-demo")
DEMO = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [sys.executable, "-m", "demo.cli"]
CHILDREN = {"prometheus", "alertmanager", "controller", "sim-engine", "exporter-dra"}
# The remediation dashboard's queries, with the window Grafana's $__rate_interval takes for a range of
# about an hour at the demo's 1 s scrape interval: long enough to hold the demo's few actions.
CONTROLLER_QUERIES = by_uid(panel_queries(rate_interval="1m"), CONTROLLER_DASHBOARDS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; only its parent's wait is missing
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (e.g. the demo's temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(entry.name)):
            found.append(f"{entry.name}: {cmdline}")
    return found


def _assert_nothing_left(state_file: Path, demo_pid: int) -> None:
    state = json.loads(state_file.read_text())
    assert state["pid"] == demo_pid
    assert set(state["children"]) >= CHILDREN
    left = {name: pid for name, pid in state["children"].items() if _alive(pid)}
    assert left == {}
    assert _processes_mentioning(state["workdir"]) == []
    assert not Path(state["workdir"]).exists()


async def _start(state_file: Path, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *DEMO,
        "--no-install",
        "--state-file",
        str(state_file),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def _read_until(proc: asyncio.subprocess.Process, marker: str, timeout_seconds: float) -> str:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_seconds
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), max(0.1, deadline - time.monotonic()))
        if not line:
            raise AssertionError(f"demo exited before {marker!r}:\n{''.join(seen)}")
        seen.append(line.decode())
        if marker in seen[-1]:
            return "".join(seen)


def _prometheus_url(state_file: Path) -> str | None:
    """The demo's Prometheus, once the demo has written its state file (atomically, at READY)."""
    if not state_file.exists():
        return None
    return str(json.loads(state_file.read_text())["urls"]["Prometheus"])


async def _watch_panels(state_file: Path, done: asyncio.Event) -> set[PanelQuery]:
    """Run the remediation dashboard's queries every second while the demo runs; those that had data."""
    proven: set[PanelQuery] = set()
    prometheus = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while not done.is_set() and len(proven) < len(CONTROLLER_QUERIES):
            prometheus = prometheus or _prometheus_url(state_file)
            for query in (q for q in CONTROLLER_QUERIES if prometheus and q not in proven):
                # the demo may stop between two queries: a refused connection just ends the watch
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{prometheus}/api/v1/query", params={"query": query.expr}) as r:
                        if has_data((await r.json())["data"]["result"]):
                            proven.add(query)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 1.0)
    return proven


@pytest.mark.timeout(200)
async def test_full_run_plays_the_ladder_and_leaves_nothing_running(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    started = time.monotonic()
    proc = await _start(state_file, "--duration", "120", "--stop-when-verified")
    done = asyncio.Event()
    watcher = asyncio.create_task(_watch_panels(state_file, done))
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 180)
    finally:
        done.set()
        proven = await watcher
    text = out.decode()
    assert proc.returncode == 0, text[-4000:]
    assert time.monotonic() - started < 150
    for step in ("(a) leak", "(b) GPU", "(c) restart loop", "(d) training job research/llama-train hung"):
        assert f"[ok] {step}" in text, text[-4000:]
    assert "WORLD    restarted serving/chat-" in text and "drained GPU 2" in text
    # the gang: one restart of the whole job, all three ranks at once, and never one rank's pod alone
    gang = (
        "WORLD    restarted training job PyTorchJob.kubeflow.org research/llama-train, all 3 ranks together"
    )
    assert text.count(gang) == 1, text[-4000:]
    assert "WORLD    restarted research/llama-train-" not in text
    assert "ALERT    firing   TrainingJobHung namespace=research training_job=llama-train" in text
    assert "PAGE     [CRITICAL] gpupulse-incident-" in text
    _assert_every_page_shows_its_diagnosis(text)
    _assert_nothing_left(state_file, proc.pid)
    _assert_costs_printed(text)
    # every panel of the remediation dashboard showed data from the controller during the run
    assert len(CONTROLLER_QUERIES) >= 12
    missing = [str(q) for q in CONTROLLER_QUERIES if q not in proven]
    assert not missing, "remediation dashboard queries without data during the demo:\n" + "\n".join(missing)


_LAYER_SHOWN = re.compile(rf"\(layer ({'|'.join(get_args(Layer))}); evidence: [^)]+\)$")


def _assert_every_page_shows_its_diagnosis(text: str) -> None:
    """The controller reads the demo's Prometheus over a window that fits the demo's data: every page
    that opens or escalates an incident is followed by its diagnosis, naming the layer at fault and
    its evidence; none is "no diagnosis" (a production step and lookback over a minute of data)."""
    lines = text.splitlines()
    pages = [i for i, ln in enumerate(lines) if " PAGE " in ln and "[RESOLVED]" not in ln]
    assert pages, text[-4000:]
    for i in pages:
        key = lines[i].split("] ", 1)[1].split()[0]
        shown = [ln for ln in lines[i + 1 : i + 3] if f"DIAGNOSIS {key}: " in ln]
        assert shown, f"no diagnosis after {lines[i]!r}:\n" + "\n".join(lines[i : i + 3])
        assert _LAYER_SHOWN.search(shown[0]), f"the page's diagnosis names no layer: {shown[0]!r}"
    assert "no Prometheus is configured" not in text, text[-4000:]
    print("\n".join(ln for ln in lines if " DIAGNOSIS " in ln))


def _assert_costs_printed(text: str) -> None:
    """The summary's cost per token agrees with the demo scenario's engine; the DRA node's claims, free GPU
    and namespaces are all there."""
    price = load_config().cost.price_per_gpu_hour
    engine = load_engines(str(DEFAULT_SCENARIO))[0]
    tokens = engine.curves["request_rate"].at(60) * engine.curves["output_tokens"].at(60)
    gpus = next(
        len(c.get("gpus", ()))
        for p in yaml.safe_load(DEFAULT_SCENARIO.read_text())["pods"]
        if (p["namespace"], p["name"]) == (engine.namespace, engine.pod)
        for c in p["containers"]
    )
    expected = gpus * price / 3600 * 1e6 / tokens
    pattern = rf"serving: ([0-9.]+) USD per 1M generated tokens for model {re.escape(engine.model)} "
    found = re.search(pattern, text)
    assert found, text[-3000:]
    # the demo's 1m rate window is full when the summary is read; its counters step every 2 s
    assert abs(float(found[1]) - expected) <= 0.15 * expected, f"{found[0]}: expected {expected:.3f}"
    dra = yaml.safe_load(DRA_SCENARIO.read_text())
    claims = sum(len(c["devices"]) for p in dra["pods"] for k in p["containers"] for c in k.get("claims", ()))
    line = next(ln for ln in text.splitlines() if f"DRA node {dra['node']}:" in ln)
    assert f"{claims} claims attributed to pods, 1 device-plugin allocation(s), 1 of 5 GPUs free" in line
    for ns in {p["namespace"] for p in dra["pods"]}:
        assert f"{ns} {price:.2f}" in line, line


@pytest.mark.timeout(120)
async def test_ctrl_c_stops_everything_cleanly(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    proc = await _start(state_file)
    try:
        await _read_until(proc, "READY", 90)
        await _read_until(proc, "ALERT", 30)  # the stack is running and watched
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    proc.send_signal(signal.SIGINT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()[-3000:]
    assert "all components stopped" in out.decode()
    _assert_nothing_left(state_file, proc.pid)


def _broken_scenario(tmp_path: Path) -> Path:
    """The demo scenario naming a pod that does not exist in x-demo (found after the engine started)."""
    source = Path(__file__).resolve().parents[2] / "exporter" / "scenarios" / "incident-demo.yaml"
    bad = tmp_path / "broken-demo.yaml"
    bad.write_text(source.read_text().replace("    rag-5c8d9f7b6-k2m4p:\n", "    ghost-0:\n"))
    return bad


@pytest.mark.timeout(120)
async def test_a_start_up_failure_stops_what_was_started(tmp_path: Path) -> None:
    bad = _broken_scenario(tmp_path)
    proc = await _start(tmp_path / "state.json", "--scenario", str(bad), "--duration", "30")
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    text = out.decode()
    assert proc.returncode == 2, text
    assert "could not start the stack" in text and "ghost-0" in text
    assert _processes_mentioning(str(bad)) == []
    assert not (tmp_path / "state.json").exists()
