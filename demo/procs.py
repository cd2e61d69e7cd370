"""Child processes of the demo: started in their own session, always stopped, never left behind.

Each child is the leader of a new process group (start_new_session), so Ctrl-C in the terminal
reaches only the orchestrator, which then stops every group: SIGTERM, and SIGKILL after a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp


class StartupError(Exception):
    """A component did not start; the message says which and shows the end of its log."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, chars: int = 1500) -> str:
    """The end of a log file ('' when there is none)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class Child:
    """One running child process."""

    name: str
    proc: asyncio.subprocess.Process
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


@dataclass
class Supervisor:
    """Starts children and stops all of them."""

    log_dir: Path
    stop_timeout_seconds: float = 5.0
    children: list[Child] = field(default_factory=list)

    async def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        """Start one child with stdout and stderr in <log_dir>/<name>.log."""
        log = self.log_dir / f"{name}.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env=dict(env) if env is not None else None,
                cwd=self.log_dir,
                start_new_session=True,
            )
        except OSError as exc:
            raise StartupError(f"{name}: cannot run {argv[0]}: {exc}") from exc
        finally:
            os.close(fd)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def pids(self) -> dict[str, int]:
        """Name -> PID of every child started."""
        return {c.name: c.pid for c in self.children}

    async def wait_http_ok(self, child: Child, url: str, timeout_seconds: float) -> None:
        """Poll `url` until it answers 200; raises StartupError if the child dies or time runs out."""
        deadline = time.monotonic() + timeout_seconds
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                if not child.running:
                    raise StartupError(
                        f"{child.name} exited with status {child.proc.returncode}:\n{log_tail(child.log)}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url) as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    waited = f"{child.name} not ready at {url} after {timeout_seconds:.0f} s"
                    raise StartupError(f"{waited}:\n{log_tail(child.log)}")
                await asyncio.sleep(0.1)

    async def discard(self, child: Child) -> None:
        """Stop one child (an optional component that failed) and forget it."""
        _signal_group(child, signal.SIGTERM)
        try:
            await asyncio.wait_for(child.proc.wait(), self.stop_timeout_seconds)
        except TimeoutError:
            _signal_group(child, signal.SIGKILL)
            await child.proc.wait()
        _signal_group(child, signal.SIGKILL)
        self.children.remove(child)

    async def stop_all(self) -> None:
        """SIGTERM every child's process group, SIGKILL what is left after the deadline; reap all."""
        for child in reversed(self.children):
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_seconds
        for child in reversed(self.children):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                await asyncio.wait_for(child.proc.wait(), remaining)
            except TimeoutError:
                _signal_group(child, signal.SIGKILL)
                await child.proc.wait()
            # the group may hold grandchildren (e.g. a backend command still running)
            _signal_group(child, signal.SIGKILL)


def _signal_group(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)
