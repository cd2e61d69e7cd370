"""Small /proc files read every round through descriptors kept open: one pread instead of open, read
and close (a third of the system calls; the path walk of each open was most of their cost).

A descriptor of /proc/<pid>/stat or io answers for its own process until that process is reaped (then
the read fails with ESRCH, whatever has taken the PID since), so a failed read drops it and the path
is opened afresh. A descriptor of a plain file (a fixture tree) is trusted only while the file is
still linked. At most `max_open` descriptors are kept (a quarter of the soft RLIMIT_NOFILE, at most
1024); past that, files are read by path as before. Blocking: call in a worker thread, like the rest
of procfs.py.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Collection

READ_BYTES = 64 * 1024
MAX_KEPT = 1024


def default_budget() -> int:
    """Descriptors one KeptFiles may hold: a quarter of the soft RLIMIT_NOFILE, at most MAX_KEPT."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_KEPT if soft == resource.RLIM_INFINITY else max(0, min(MAX_KEPT, soft // 4))


def read_rest(fd: int, first: bytes) -> str:
    """The text of a file whose first os.read gave `first`; OSError from a later read."""
    if len(first) < READ_BYTES:  # the common case: stat, io, cgroup fit in one read
        return first.decode("utf-8", "replace")
    chunks, chunk = [first], first
    while chunk:  # maps, a big net/tcp: read to the end
        chunk = os.read(fd, READ_BYTES)
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class KeptFiles:
    """Reads files by path, keeping the descriptor of each small file for the next read."""

    def __init__(self, max_open: int | None = None) -> None:
        self.max_open = default_budget() if max_open is None else max_open
        self._fds: dict[str, tuple[int, bool]] = {}  # path -> (fd, a plain file: check it is linked)
        self.kept_total = 0  # descriptors kept so far (a holder tells whether any came since it looked)

    def __len__(self) -> int:
        return len(self._fds)

    def read(self, path: str) -> str | None:
        """The file's text, or None when it cannot be read (the process exited, no access)."""
        kept = self._fds.get(path)
        if kept is not None:
            fd, plain = kept
            try:
                data = os.pread(fd, READ_BYTES, 0)
                if data and len(data) < READ_BYTES and (not plain or os.fstat(fd).st_nlink > 0):
                    return data.decode("utf-8", "replace")
            except OSError:
                pass  # the process is gone (ESRCH), or access went: as a fresh open would say
            self._close(path)
        return self._open(path)

    def _open(self, path: str) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        keep = False
        try:
            first = os.read(fd, READ_BYTES)
            if first and len(first) < READ_BYTES and len(self._fds) < self.max_open:
                # procfs files say size 0 whatever they hold; a plain file says its size
                self._fds[path] = (fd, os.fstat(fd).st_size != 0)
                self.kept_total += 1
                keep = True
            return read_rest(fd, first)
        except OSError:
            return None
        finally:
            if not keep:
                os.close(fd)

    def retain(self, paths: Collection[str]) -> None:
        """Close the descriptors of every other path (processes that left the GPUs)."""
        for path in [p for p in self._fds if p not in paths]:
            self._close(path)

    def close(self) -> None:
        """Close every kept descriptor."""
        for path in list(self._fds):
            self._close(path)

    def _close(self, path: str) -> None:
        kept = self._fds.pop(path, None)  # one pop per descriptor, whichever thread gets it
        if kept is not None:
            os.close(kept[0])
