"""Processes whose exit the event loop is told of (pidfd, Linux 5.3+), so a collector can tell that
nothing it read of them changed without reading /proc again.

A pidfd refers to one process, not to its PID: it becomes readable when that process exits, whatever
later takes the PID. One opened before a /proc read of the process therefore vouches for what the read
said until it fires. Only where the procfs root shows this process's own PID namespace (its `self` is
us): elsewhere a PID names another process than pidfd_open would open, and `available` is False.
Opening a pidfd touches no file, so this runs on the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterable
from pathlib import Path

MAX_WATCHED = 256  # pidfds held at most; past it, processes go unwatched (their readers read /proc)


def own_namespace(procfs_root: Path) -> bool:
    """True when procfs_root's PIDs are the PIDs this process sees (pidfd_open opens the same ones)."""
    try:
        return os.readlink(procfs_root / "self") == str(os.getpid())
    except OSError:
        return False


class ExitWatch:
    """pidfds of followed processes on the running loop; `fired` is set when one of them exits."""

    def __init__(self, procfs_root: Path, max_watched: int = MAX_WATCHED) -> None:
        self.available = hasattr(os, "pidfd_open") and own_namespace(procfs_root)
        self.max_watched = max_watched
        self.fired = False  # a watched process exited since the holder last cleared it
        self._fds: dict[int, tuple[int, asyncio.AbstractEventLoop]] = {}  # pid -> (pidfd, its loop)

    def __len__(self) -> int:
        return len(self._fds)

    def watch(self, pids: Iterable[int]) -> frozenset[int]:
        """Watch these processes too (on the loop); the ones of them watched now. A PID that has no
        process (or no pidfd to spare) is left out."""
        if not self.available:
            return frozenset()
        loop = asyncio.get_running_loop()
        watched = []
        for pid in pids:
            if pid in self._fds:
                watched.append(pid)
                continue
            if pid <= 1 or len(self._fds) >= self.max_watched:  # 1: the namespace's init never exits
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError as exc:
                if exc.errno in (errno.ENOSYS, errno.EPERM):  # a kernel before 5.3, or a seccomp filter
                    self.available = False
                    return frozenset()
                continue  # gone already (ESRCH), or no descriptor to spare
            self._fds[pid] = (fd, loop)
            loop.add_reader(fd, self._exited, pid)
            watched.append(pid)
        return frozenset(watched)

    def retain(self, pids: Iterable[int]) -> None:
        """Stop watching every other process."""
        keep = set(pids)
        for pid in [p for p in self._fds if p not in keep]:
            self._unwatch(pid)

    def close(self) -> None:
        """Stop watching every process."""
        for pid in list(self._fds):
            self._unwatch(pid)

    def _exited(self, pid: int) -> None:
        self.fired = True
        self._unwatch(pid)  # a pidfd stays readable: once is enough

    def _unwatch(self, pid: int) -> None:
        kept = self._fds.pop(pid, None)
        if kept is None:
            return
        fd, loop = kept
        if not loop.is_closed():
            loop.remove_reader(fd)
        os.close(fd)
