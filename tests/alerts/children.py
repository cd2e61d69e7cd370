"""Child processes of the replays (exporters, engines, the controller): started with their output in a
log file, stopped as a group at the end, and awaited until they answer HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp


async def wait_http(url: str, proc: asyncio.subprocess.Process, timeout_seconds: float = 20.0) -> None:
    """Until `url` answers 200; fails at once if the process exits, or after timeout_seconds."""
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
async def child_process(
    args: list[str], log: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A child writing stdout and stderr to `log`; terminated (killed after 10 s) on exit."""
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=out, stderr=asyncio.subprocess.STDOUT, env=dict(env) if env is not None else None
        )
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
