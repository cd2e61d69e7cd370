"""A real Prometheus server for integration tests, started on a free loopback port.

    async with running_prometheus(config_yaml, rule_files=[path]) as prom:
        value = await prom.query_value('gpu_up{gpu="0"}')

The config may reference rule files by their base name: they are copied next to it. The binary is the
current line's (demo/neighbours.py: Prometheus 3.x) unless `line` names another; a missing binary raises
MissingNeighbourError, so a test that needs it fails rather than skips.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from demo.neighbours import CURRENT
from demo.neighbours import line as neighbour_line


class PrometheusError(Exception):
    """Prometheus did not start, or a query failed."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PromHandle:
    """A running Prometheus: its base URL and a few HTTP API helpers."""

    url: str
    workdir: Path

    async def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` field of a success response."""
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{self.url}/api/v1/{path}", params=params) as resp:
                body = await resp.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body}")
        return body["data"]

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; the result vector."""
        data = await self.api("query", query=promql)
        return list(data["result"])

    async def query_value(self, promql: str) -> float | None:
        """The single value of an instant query, None when it returns nothing."""
        result = await self.query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{promql}: {len(result)} series, expected one")
        return float(result[0]["value"][1])

    async def wait_for(self, promql: str, timeout_seconds: float = 30.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns series (deadline, not a fixed sleep)."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            result = await self.query(promql)
            if result:
                return result
            if time.monotonic() > deadline:
                raise PrometheusError(f"{promql}: still empty after {timeout_seconds} s")
            await asyncio.sleep(0.2)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, timeout_seconds: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_seconds
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.returncode is not None:
                raise PrometheusError(f"prometheus exited with {proc.returncode}: {_tail(log)}")
            try:
                async with session.get(f"{url}/-/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready after {timeout_seconds} s: {_tail(log)}")
            await asyncio.sleep(0.1)


def _prepare(workdir: Path, config_yaml: str, rule_files: Sequence[Path]) -> None:
    for rule in rule_files:
        shutil.copy(rule, workdir / rule.name)
    (workdir / "prometheus.yml").write_text(config_yaml)


@asynccontextmanager
async def running_prometheus(
    config_yaml: str,
    rule_files: Sequence[Path] = (),
    ready_timeout_seconds: float = 30.0,
    extra_args: Sequence[str] = (),
    tsdb_path: Path | None = None,
    binary: str | os.PathLike[str] | None = None,
    line: str = CURRENT,
) -> AsyncIterator[PromHandle]:
    """Start Prometheus with this config on 127.0.0.1:<free port>; stopped (and its TSDB removed) on exit.

    With `tsdb_path`, Prometheus serves that TSDB (e.g. backfilled blocks) and leaves it in place. The
    prometheus of `line` (demo.neighbours.LINES) runs, or `binary` where given."""
    command = binary if binary is not None else neighbour_line(line).prometheus
    workdir = Path(tempfile.mkdtemp(prefix="gpupulse-prom-"))
    tsdb = tsdb_path if tsdb_path is not None else workdir / "tsdb"
    try:
        _prepare(workdir, config_yaml, rule_files)
        port = free_port()
        log = workdir / "prometheus.log"
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            proc = await asyncio.create_subprocess_exec(
                command,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{port}",
                *extra_args,
                cwd=workdir,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
            )
        finally:
            os.close(log_fd)
        url = f"http://127.0.0.1:{port}"
        try:
            await _wait_ready(url, proc, ready_timeout_seconds, log)
            yield PromHandle(url=url, workdir=workdir)
        finally:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
