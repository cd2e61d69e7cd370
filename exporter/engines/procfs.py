"""Engine processes seen through procfs: PID behind a listening port, process tree, start time.

All functions are blocking; the collector runs them in a thread. The procfs root is configurable so
tests use a fixture tree and a containerised exporter can read the host's /proc mounted elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def _listening_inodes_in(table: Path, port: int) -> set[int]:
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return set()
    found: set[int] = set()
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == port:
            found.add(int(fields[9]))
    return found


def listening_inodes(procfs: Path, port: int, netns_pids: Iterable[int] = ()) -> set[int]:
    """Socket inodes listening on port, in the root netns and in the netns of the given PIDs."""
    tables = [procfs / "net" / "tcp", procfs / "net" / "tcp6"]
    for pid in netns_pids:
        tables += [procfs / str(pid) / "net" / "tcp", procfs / str(pid) / "net" / "tcp6"]
    inodes: set[int] = set()
    for table in tables:
        inodes |= _listening_inodes_in(table, port)
    return inodes


def all_pids(procfs: Path) -> list[int]:
    """Every numeric entry under procfs."""
    try:
        return [int(e) for e in os.listdir(procfs) if e.isdigit()]
    except OSError:
        return []


def pid_owning_socket(procfs: Path, inodes: set[int], candidates: Iterable[int]) -> int | None:
    """Lowest candidate PID holding one of the socket inodes (the parent of forked servers)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in sorted(candidates):
        fd_dir = procfs / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(fd_dir / name) in wanted:
                    return pid
            except OSError:
                continue
    return None


def pid_for_port(procfs: Path, port: int, candidates: Iterable[int] | None = None) -> int | None:
    """PID listening on TCP port; candidates limit the fd scan (and add their network namespaces)."""
    pool = list(candidates) if candidates is not None else all_pids(procfs)
    inodes = listening_inodes(procfs, port, pool if candidates is not None else ())
    if not inodes:
        return None
    return pid_owning_socket(procfs, inodes, pool)


def _stat_fields(procfs: Path, pid: int) -> list[str] | None:
    try:
        raw = (procfs / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def parent_map(procfs: Path) -> dict[int, int]:
    """PID -> parent PID for every process."""
    out: dict[int, int] = {}
    for pid in all_pids(procfs):
        fields = _stat_fields(procfs, pid)
        if fields and len(fields) > 1:
            out[pid] = int(fields[1])
    return out


def parents_of(procfs: Path, pids: Iterable[int], known: Mapping[int, int]) -> dict[int, int]:
    """PID -> parent PID for each pid and its ancestors.

    A few reads per GPU process instead of a scan of every process on the node (thousands on a busy
    one). The pids themselves are read afresh; ancestors come from `known` (earlier rounds) when there,
    as a process's parent changes only when its parent dies, and then its child's entry changes too.
    """
    out: dict[int, int] = {}
    for pid in pids:
        fields = _stat_fields(procfs, pid)
        if not fields or len(fields) < 2:
            continue
        out[pid] = parent = int(fields[1])
        for _ in range(64):  # a chain deeper than this is not a process tree we know
            if parent <= 1 or parent in out:
                break
            grand = known.get(parent)
            if grand is None:
                more = _stat_fields(procfs, parent)
                if not more or len(more) < 2:
                    break
                grand = int(more[1])
            out[parent] = grand
            parent = grand
    return out


def descendants(pid: int, parents: dict[int, int]) -> set[int]:
    """pid and every process below it."""
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    seen = {pid}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def boot_time_seconds(procfs: Path) -> float | None:
    """Boot time (epoch seconds) from the `btime` line of /proc/stat."""
    try:
        for line in (procfs / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def process_start_seconds(procfs: Path, pid: int, clock_ticks_per_second: int | None = None) -> float | None:
    """Process start time (epoch seconds): starttime (field 22, ticks since boot) + btime."""
    fields = _stat_fields(procfs, pid)
    boot = boot_time_seconds(procfs)
    if not fields or len(fields) < 20 or boot is None:
        return None
    ticks = clock_ticks_per_second or os.sysconf("SC_CLK_TCK")
    return boot + int(fields[19]) / ticks  # field 22 overall; fields here start at field 3


def alive(procfs: Path, pid: int) -> bool:
    """True while /proc/<pid> exists."""
    return (procfs / str(pid)).is_dir()
