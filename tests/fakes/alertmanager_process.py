"""A real Alertmanager (the current line's, demo/neighbours.py: 0.3x; or Debian's 0.25 with
`line=DEBIAN`) with a given configuration, on a free loopback port:

    async with running_alertmanager(config) as am:
        await am.wait_ready()
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from demo.neighbours import CURRENT
from demo.neighbours import line as neighbour_line
from tests.fakes.prometheus_process import free_port


@dataclass(frozen=True)
class AlertmanagerHandle:
    """A running Alertmanager: its URL (host:port for Prometheus) and its log."""

    url: str
    address: str
    log: Path

    async def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts."""
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{self.url}/api/v2/alerts") as resp:
                body: list[dict[str, Any]] = await resp.json()
                return body


@asynccontextmanager
async def running_alertmanager(
    config: Mapping[str, Any], ready_timeout_seconds: float = 20.0, line: str = CURRENT
) -> AsyncIterator[AlertmanagerHandle]:
    """Start Alertmanager with this configuration; stopped and its data removed on exit. `line` is the
    neighbours' line (demo.neighbours.LINES) whose alertmanager runs."""
    binary = neighbour_line(line).alertmanager
    workdir = Path(tempfile.mkdtemp(prefix="gpupulse-am-"))
    try:
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(dict(config), sort_keys=False))
        port = free_port()
        log = workdir / "alertmanager.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            proc = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={workdir / 'alertmanager.yml'}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                stdout=fd,
                stderr=subprocess.STDOUT,
            )
        finally:
            os.close(fd)
        handle = AlertmanagerHandle(f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", log)
        try:
            await _wait_ready(handle, proc, ready_timeout_seconds)
            yield handle
        finally:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _wait_ready(
    handle: AlertmanagerHandle, proc: asyncio.subprocess.Process, within_seconds: float
) -> None:
    deadline = time.monotonic() + within_seconds
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"alertmanager exited {proc.returncode}: {handle.log.read_text()[-2000:]}")
            try:
                async with session.get(f"{handle.url}/-/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"alertmanager not ready: {handle.log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
