"""Starting the demo stack: every component on 127.0.0.1, started in order and stopped as a whole."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import shlex
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from demo.act import FIELDS as ACT_FIELDS
from demo.binaries import ensure_binaries
from demo.configs import EXPORTER_JOB, ScrapeTarget, alertmanager_config, prometheus_config, write_yaml
from demo.control import ActionRequest, make_control_app
from demo.dranode import DraNode, start_dra_node
from demo.neighbours import CURRENT
from demo.pager_sink import PagerSink
from demo.procs import StartupError, Supervisor, free_port
from demo.rules import write_demo_rules
from demo.signatures import write_demo_signatures
from demo.simnode import DEFAULT_SCENARIO, SimNode, start_sim_node
from demo.timeline import Timeline
from demo.world import World

READY_TIMEOUT_SECONDS = 60.0
REAL_EXPORTER_READY_SECONDS = 20.0
LOOP_MAX_RESTARTS = 2
# what the controller's diagnosis reads: the demo's whole history at its 1 s scrape interval
# (demo/configs.py), so each signal's change lines up with the symptom to the second
DIAGNOSIS_LOOKBACK = "2m"
DIAGNOSIS_STEP = "1s"
# gpupulse-sim-engine's entry point, run with this interpreter (the console script may not be on PATH)
_SIM_ENGINE_MAIN = "import sys; from exporter.sim.engines import main; main(sys.argv[1:])"
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DemoOptions:
    """What the command line chose."""

    duration_seconds: float | None = None
    stop_when_verified: bool = False
    scenario: Path = DEFAULT_SCENARIO
    state_file: Path | None = None
    keep_temp: bool = False
    install_missing: bool = True
    real_gpus: str = "auto"  # auto | on | off
    neighbours: str = CURRENT  # the line of Prometheus and Alertmanager (demo/neighbours.py)


@dataclass
class Stack:
    """Everything started, so that everything can be stopped."""

    workdir: Path
    supervisor: Supervisor
    timeline: Timeline
    sink: PagerSink = field(default_factory=PagerSink)
    control_runner: web.AppRunner | None = None
    node: SimNode | None = None
    dra_node: DraNode | None = None
    urls: dict[str, str] = field(default_factory=dict)

    async def close(self, keep_temp: bool) -> None:
        """Stop children, the simulated node and the in-process servers; remove the temp dir."""
        await self.supervisor.stop_all()
        if self.node is not None:
            await self.node.close()
        if self.dra_node is not None:
            await self.dra_node.close()
        if self.control_runner is not None:
            await self.control_runner.cleanup()
        await self.sink.stop()
        if not keep_temp:
            shutil.rmtree(self.workdir, ignore_errors=True)


def nvml_present() -> bool:
    """Whether the NVIDIA driver's NVML library can be loaded on this machine."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _write_secret(path: Path, value: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return path


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # the children import our packages from the same checkout as this process
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _act_command(action: str) -> str:
    argv = [sys.executable, "-m", "demo.act", action]
    for name in ACT_FIELDS:
        argv += [f"--{name.replace('_', '-')}", f"{{{name}}}"]
    return shlex.join(argv)


async def _start_control(stack: Stack, world: World, token: str) -> str:
    def handle(req: ActionRequest) -> str:
        try:
            if req.action == "restart":
                summary = world.restart(
                    req.kind, req.node, req.namespace, req.pod, req.training_job_kind, req.training_job
                )
            else:
                summary = world.migrate(req.kind, req.node, req.namespace, req.pod, req.uuid)
        except ValueError as exc:
            stack.timeline.line("WORLD", f"{req.action} refused: {exc}")
            raise
        stack.timeline.line("WORLD", summary)
        return summary

    runner = web.AppRunner(make_control_app(token, handle), access_log=None)
    await runner.setup()
    stack.control_runner = runner
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _start_engine(stack: Stack, scenario: Path) -> str:
    port = free_port()
    child = await stack.supervisor.start(
        "sim-engine",
        [
            sys.executable,
            "-c",
            _SIM_ENGINE_MAIN,
            "--scenario",
            str(scenario),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        _child_env(),
    )
    url = f"http://127.0.0.1:{port}/metrics"
    await stack.supervisor.wait_http_ok(child, url, READY_TIMEOUT_SECONDS)
    return url


def _engines_config(workdir: Path, engine_url: str, scenario: Path) -> Path:
    raw = yaml.safe_load(scenario.read_text())
    spec = (raw.get("engines") or [{}])[0]
    entry = {"url": engine_url, "engine": spec.get("kind", "auto")}
    for key in ("model", "namespace", "pod"):
        if spec.get(key):
            entry[key] = spec[key]
    return write_yaml(workdir / "engines.yaml", {"engines": [entry]})


async def _start_real_exporter(stack: Stack) -> ScrapeTarget | None:
    port = free_port()
    child = await stack.supervisor.start(
        "exporter-real",
        [sys.executable, "-m", "exporter.cli", "--web.listen-address", f"127.0.0.1:{port}"],
        _child_env(),
    )
    try:
        await stack.supervisor.wait_http_ok(
            child, f"http://127.0.0.1:{port}/metrics", REAL_EXPORTER_READY_SECONDS
        )
    except StartupError as exc:
        await stack.supervisor.discard(child)
        stack.timeline.line("NOTE", f"real-GPU exporter did not start; continuing without it: {exc}")
        return None
    stack.urls["exporter (real GPUs)"] = f"http://127.0.0.1:{port}/metrics"
    return ScrapeTarget(f"127.0.0.1:{port}", socket.gethostname())


async def start_stack(stack: Stack, opts: DemoOptions) -> tuple[str, str, World]:
    """Start every component; returns the Prometheus URL, the controller URL and its token."""
    # apt-get may take minutes: off the event loop, so Ctrl-C is still handled
    binaries = await asyncio.to_thread(
        ensure_binaries,
        opts.install_missing,
        lambda text: stack.timeline.line("SETUP", text),
        opts.neighbours,
    )
    wd = stack.workdir
    controller_token = secrets.token_urlsafe(32)
    control_token = secrets.token_urlsafe(32)
    token_file = _write_secret(wd / "controller.token", controller_token)

    await stack.sink.start()
    stack.urls["pager sink"] = f"http://127.0.0.1:{stack.sink.port}/pages/<secret>"
    pager_url_file = _write_secret(wd / "pager.url", stack.sink.url)

    engine_url = await _start_engine(stack, opts.scenario)
    stack.urls["inference engine (simulated vLLM)"] = engine_url
    engines_config = _engines_config(wd, engine_url, opts.scenario)
    stack.node = await start_sim_node(
        opts.scenario, engines_config, lambda text: stack.timeline.line("WORLD", text)
    )
    world = stack.node.world
    stack.urls[f"exporter (simulated node {world.node})"] = stack.node.metrics_url
    control_url = await _start_control(stack, world, control_token)

    targets = [ScrapeTarget(f"127.0.0.1:{stack.node.port}", world.node)]
    # a second node, on DRA: its exporter runs the real attribution code (demo/dranode.py)
    dra = stack.dra_node = await start_dra_node(stack.supervisor, wd, _child_env())
    stack.urls[f"exporter (simulated DRA node {dra.node})"] = dra.metrics_url
    targets.append(ScrapeTarget(f"127.0.0.1:{dra.port}", dra.node))
    if opts.real_gpus == "on" or (opts.real_gpus == "auto" and nvml_present()):
        real = await _start_real_exporter(stack)
        if real is not None:
            targets.append(real)

    rules = write_demo_rules(wd / "rules")
    signatures_dir = wd / "signatures"
    write_demo_signatures(signatures_dir)
    ctl_port, am_port, prom_port = free_port(), free_port(), free_port()
    controller_url = f"http://127.0.0.1:{ctl_port}"
    ctl = await stack.supervisor.start(
        "controller",
        [
            sys.executable,
            "-m",
            "remediation",
            "serve",
            "--web.listen-address",
            f"127.0.0.1:{ctl_port}",
            "--auth.token-file",
            str(token_file),
            "--storage.path",
            str(wd / "controller"),
            "--storage.synchronous",
            "NORMAL",
            "--signatures",
            str(signatures_dir),
            "--backend",
            "local",
            "--backend.local.restart-command",
            _act_command("restart"),
            "--backend.local.migrate-command",
            _act_command("migrate"),
            "--backend.local.timeout",
            "30s",
            "--pager",
            "webhook",
            "--pager.url-file",
            str(pager_url_file),
            "--loops.max-restarts",
            str(LOOP_MAX_RESTARTS),
            "--loops.restart-window",
            "10m",
            # the simulated node's namespaces: an empty scope would restart no pod
            "--scope.namespaces",
            ",".join(sorted({p.namespace for p in world.pods})),
            # the demo's Prometheus (started below on this port): each incident's diagnosis reads it
            "--diagnosis.prometheus-url",
            f"http://127.0.0.1:{prom_port}",
            # the demo's minute of data at its 1 s scrape: the production 40m at 15 s would read
            # four points of it and find no change in line with any onset
            "--diagnosis.lookback",
            DIAGNOSIS_LOOKBACK,
            "--diagnosis.step",
            DIAGNOSIS_STEP,
        ],
        _child_env({"GPUPULSE_DEMO_CONTROL_URL": control_url, "GPUPULSE_DEMO_CONTROL_TOKEN": control_token}),
    )
    am_yml = write_yaml(
        wd / "alertmanager.yml", alertmanager_config(f"{controller_url}/api/v1/alerts", token_file)
    )
    am = await stack.supervisor.start(
        "alertmanager",
        [
            binaries.alertmanager,
            f"--config.file={am_yml}",
            f"--storage.path={wd / 'alertmanager'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ],
    )
    prom_yml = write_yaml(
        wd / "prometheus.yml",
        prometheus_config(targets, f"127.0.0.1:{ctl_port}", f"127.0.0.1:{am_port}", rules),
    )
    prom = await stack.supervisor.start(
        "prometheus",
        [
            binaries.prometheus,
            f"--config.file={prom_yml}",
            f"--storage.tsdb.path={wd / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--rules.alert.resend-delay=5s",
        ],
    )
    prometheus_url = f"http://127.0.0.1:{prom_port}"
    await asyncio.gather(
        stack.supervisor.wait_http_ok(ctl, f"{controller_url}/readyz", READY_TIMEOUT_SECONDS),
        stack.supervisor.wait_http_ok(am, f"http://127.0.0.1:{am_port}/-/ready", READY_TIMEOUT_SECONDS),
        stack.supervisor.wait_http_ok(prom, f"{prometheus_url}/-/ready", READY_TIMEOUT_SECONDS),
        dra.wait_ready(stack.supervisor, READY_TIMEOUT_SECONDS),
    )
    await _wait_first_scrape(prometheus_url, READY_TIMEOUT_SECONDS)
    stack.urls["Prometheus"] = prometheus_url
    stack.urls["Alertmanager"] = f"http://127.0.0.1:{am_port}"
    stack.urls[f"controller API (bearer token in {token_file})"] = f"{controller_url}/api/v1/incidents"
    return prometheus_url, controller_url, world


async def _wait_first_scrape(prometheus_url: str, timeout_seconds: float) -> None:
    """Wait until Prometheus has scraped the exporters once, so the script starts on data."""
    url, params = f"{prometheus_url}/api/v1/query", {"query": f'up{{job="{EXPORTER_JOB}"}} == 1'}
    deadline = time.monotonic() + timeout_seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with session.get(url, params=params) as resp:
                    if resp.status == 200 and (await resp.json())["data"]["result"]:
                        return
            await asyncio.sleep(0.2)
    raise StartupError(
        f"Prometheus at {prometheus_url} has not scraped the exporter after {timeout_seconds:.0f} s"
    )
