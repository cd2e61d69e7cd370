"""The demo's DRA node: a second simulated node whose exporter runs the real attribution code.

The exporter is a child process (`exporter.cli --simulate`: the simulated NVML is one per process, and
the incident node already holds this one's), reading claims from a pod-resources server
(demo/kubelet.py) on a unix socket and the node's ResourceSlice from a read-only endpoint
(demo/slices.py) with a bearer token, both served from this process.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from aiohttp import web

from demo.kubelet import DRA_DRIVER, PodResourcesServer, pods_from_scenario
from demo.procs import Child, Supervisor, free_port
from demo.slices import make_slices_app, scenario_slice
from exporter.sim.scenario import SCENARIO_DIR

DRA_SCENARIO = SCENARIO_DIR / "demo-dra.yaml"


@dataclass
class DraNode:
    """The running pieces; the exporter child is stopped by the supervisor with the others."""

    node: str
    claim_devices: int  # DRA devices the kubelet reports, one per pod holding it
    exporter: Child
    port: int
    kubelet: PodResourcesServer
    api: web.AppRunner

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    async def wait_ready(self, supervisor: Supervisor, timeout_seconds: float) -> None:
        """Until the exporter answers /metrics (StartupError if it dies or time runs out)."""
        await supervisor.wait_http_ok(self.exporter, self.metrics_url, timeout_seconds)

    async def close(self) -> None:
        """Stop the pod-resources server and the ResourceSlice endpoint."""
        await self.kubelet.stop()
        await self.api.cleanup()


def _write_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


async def start_dra_node(
    supervisor: Supervisor, workdir: Path, env: Mapping[str, str], scenario: Path = DRA_SCENARIO
) -> DraNode:
    """Serve the scenario's claims and slice, start its exporter; returns without waiting for it."""
    doc = yaml.safe_load(await asyncio.to_thread(scenario.read_text))
    node = str(doc["node"])
    pods = pods_from_scenario(doc)
    kubelet = PodResourcesServer(str(workdir / "dra-kubelet.sock"), pods)
    await kubelet.start()
    token_file = workdir / "dra-api.token"
    runner = web.AppRunner(make_slices_app([scenario_slice(doc)], _write_token(token_file)), access_log=None)
    try:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = free_port()
        child = await supervisor.start(
            "exporter-dra",
            [
                sys.executable,
                "-m",
                "exporter.cli",
                "--simulate",
                str(scenario),
                "--web.listen-address",
                f"127.0.0.1:{port}",
                "--sampling.interval",
                "1",
                "--attribution.interval",
                "1",
                "--attribution.kubelet-socket",
                kubelet.socket_path,
                "--attribution.kubelet-pods-dir",
                "",
                "--kube.node-name",
                node,
                "--kube.api-url",
                f"http://127.0.0.1:{runner.addresses[0][1]}",
                "--kube.token-file",
                str(token_file),
                # the ResourceSlice watch alone, as before --kube.* (whose node name turns every pod view on)
                "--no-attribution.pod-watch",
                "--no-collector.progress",
            ],
            env,
        )
    except BaseException:
        await kubelet.stop()
        await runner.cleanup()
        raise
    devices = sum(
        1
        for p in pods
        for c in p.containers
        for claim in c.dynamic_resources
        for d in claim.claim_resources
        if d.driver_name == DRA_DRIVER
    )
    return DraNode(node, devices, child, port, kubelet, runner)
