"""Reads of /proc/<pid>/{cgroup,stat,maps} under a configurable procfs root (blocking; call in a thread)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from exporter.attribution.cgroup import CgroupIdentity, parse_cgroup

DEFAULT_PROCFS = "/proc"


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    cgroup_readable: bool  # False: process gone or procfs not ours (no hostPID); pod unknown
    identity: CgroupIdentity | None  # None with cgroup_readable: a process outside any pod
    cpu_seconds: float | None  # utime + stime


class Procfs:
    """One procfs tree: the host's /proc, or a fixture tree in tests."""

    def __init__(self, root: str = DEFAULT_PROCFS, clock_ticks_per_second: int | None = None) -> None:
        self.root = root
        self._ticks = float(clock_ticks_per_second or os.sysconf("SC_CLK_TCK"))

    def _read(self, pid: int, name: str) -> str | None:
        try:
            with open(os.path.join(self.root, str(pid), name), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def process(self, pid: int) -> ProcessInfo:
        """Cgroup identity and CPU seconds of one process; missing parts are None."""
        text = self._read(pid, "cgroup")
        return ProcessInfo(
            pid=pid,
            cgroup_readable=text is not None,
            identity=parse_cgroup(text) if text is not None else None,
            cpu_seconds=self.cpu_seconds(pid),
        )

    def cpu_seconds(self, pid: int) -> float | None:
        """User + system CPU seconds of all threads of the process, from /proc/<pid>/stat."""
        text = self._read(pid, "stat")
        if text is None:
            return None
        # comm (field 2) may contain spaces and parentheses; fields resume after the last ')'.
        fields = text[text.rfind(")") + 2 :].split()
        try:
            return (int(fields[11]) + int(fields[12])) / self._ticks  # fields 14 and 15: utime, stime
        except (IndexError, ValueError):
            return None

    def mapped_files(self, pid: int) -> set[str]:
        """Paths of files the process has mapped (as the process sees them)."""
        text = self._read(pid, "maps")
        if text is None:
            return set()
        paths = set()
        for line in text.splitlines():
            # address perms offset dev inode pathname; the path may contain spaces.
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                paths.add(parts[5].removesuffix(" (deleted)"))
        return paths

    def host_path(self, pid: int, path: str) -> str:
        """Where a path the process sees can be opened from here (through its mount namespace)."""
        via_root = os.path.join(self.root, str(pid), "root", path.lstrip("/"))
        return via_root if os.path.exists(via_root) else path
