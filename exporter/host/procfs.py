"""The one procfs reader: processes, their pods, CPU, I/O, state, maps, sockets, parents and start times.

Everything here is blocking; collectors call it in a thread. The procfs root is configurable, so
tests use a fixture tree and a containerised exporter reads the host's /proc mounted elsewhere.
`Procfs` serves attribution and the page cache (/proc/<pid>/{cgroup,stat,io,maps,root}); the functions
below it serve the engines collector (the PID behind a listening port, the process tree, start time).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from exporter.host.cgroup import CgroupIdentity, parse_cgroup
from exporter.host.kept import READ_BYTES, KeptFiles, read_rest
from gpupulse.metrics.attribution import PROCESS_STATE_NAMES

DEFAULT_PROCFS = "/proc"

# The scheduler state of /proc/<pid>/stat (field 3) by name, as gpu_process_state{state} exports it:
# a bounded set, whatever a kernel writes (an unknown letter is "other").
PROCESS_STATES: dict[str, str] = {
    "R": "running",
    "S": "sleeping",
    "D": "disk_sleep",  # uninterruptible: waiting in the kernel, e.g. on a hung NFS mount
    "T": "stopped",
    "t": "stopped",  # traced
    "Z": "zombie",
    "I": "idle",  # an idle kernel thread
}
STATE_OTHER = "other"
_IO_HEAD = re.compile(r"rchar: ([0-9]{1,20})\nwchar: ([0-9]{1,20})\n")
_START_FIELD = 19  # starttime (field 22 of /proc/<pid>/stat) in stat_fields, which start at field 3
_MAX_KEPT_CGROUPS = 4096
STATE_NAMES = PROCESS_STATE_NAMES


class ProcessInfo(NamedTuple):
    """What one round read of a process (a tuple: a round makes one per GPU process)."""

    pid: int
    cgroup_readable: bool  # False: process gone or procfs not ours (no hostPID); pod unknown
    identity: CgroupIdentity | None  # None with cgroup_readable: a process outside any pod
    cpu_seconds: float | None  # utime + stime
    # bytes through read()/write() system calls (rchar, wchar of /proc/<pid>/io): files on any
    # filesystem, network filesystems and sockets alike; None where io is unreadable (no ptrace access)
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    state: str | None = None  # a name of STATE_NAMES


def read_text(path: str) -> str | None:
    """A procfs file's text, or None when it cannot be read (the process exited, no access).

    os.read on a raw descriptor: about 2.5x cheaper than open() with its buffered text layers, and
    a round reads a few hundred of these small files.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return read_rest(fd, os.read(fd, READ_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)


class Procfs:
    """One procfs tree: the host's /proc, or a fixture tree in tests."""

    def __init__(
        self,
        root: str = DEFAULT_PROCFS,
        clock_ticks_per_second: int | None = None,
        kept: KeptFiles | None = None,
    ) -> None:
        self.root = root
        self._ticks = float(clock_ticks_per_second or os.sysconf("SC_CLK_TCK"))
        self._pod_cgroups: dict[int, tuple[str, CgroupIdentity]] = {}  # pid -> (start time, its pod)
        # stat and io are read every round for every GPU process: through kept descriptors
        self._kept = kept if kept is not None else KeptFiles()
        self._retained: tuple[frozenset[int], int] | None = None  # (PIDs, kept_total) of the last retain

    def _read(self, pid: int, name: str) -> str | None:
        return read_text(f"{self.root}/{pid}/{name}")

    def _read_kept(self, pid: int, name: str) -> str | None:
        return self._kept.read(f"{self.root}/{pid}/{name}")

    def retain(self, pids: Iterable[int]) -> None:
        """Close the kept descriptors of every other PID (blocking: from the thread that reads)."""
        wanted = frozenset(pids)
        if self._retained == (wanted, self._kept.kept_total):
            return  # the same PIDs as last time and no descriptor kept since: nothing to close
        self._kept.retain({f"{self.root}/{pid}/{name}" for pid in wanted for name in ("stat", "io")})
        self._retained = (wanted, self._kept.kept_total)

    def close(self) -> None:
        """Close the kept descriptors."""
        self._kept.close()

    def process(self, pid: int) -> ProcessInfo:
        """Cgroup identity, CPU seconds, I/O bytes and state of one process; missing parts are None.

        The cgroup of a process in a pod is read once: the container runtime puts it there before it
        runs, and it stays. It is kept by (PID, start time), so a reused PID is read afresh, and a
        process outside any pod (a runtime may move it in later) is read every time.
        """
        root, kept = self.root, self._kept
        stat = kept.read(f"{root}/{pid}/stat")
        # up to starttime only: the 30 fields after it are not read here
        fields = stat[stat.rfind(")") + 2 :].split(None, _START_FIELD + 1) if stat is not None else []
        start = fields[_START_FIELD] if len(fields) > _START_FIELD else None
        known = self._pod_cgroups.get(pid)
        identity: CgroupIdentity | None
        if known is not None and start is not None and known[0] == start:
            readable, identity = True, known[1]
        else:
            text = self._read(pid, "cgroup")
            readable, identity = text is not None, parse_cgroup(text) if text is not None else None
            if identity is not None and start is not None:
                if len(self._pod_cgroups) >= _MAX_KEPT_CGROUPS:
                    self._pod_cgroups.clear()  # PIDs come and go: start over rather than grow
                self._pod_cgroups[pid] = (start, identity)
            else:
                self._pod_cgroups.pop(pid, None)
        read_bytes, write_bytes = _io_of(kept.read(f"{root}/{pid}/io"))
        state = PROCESS_STATES.get(fields[0], STATE_OTHER) if fields and fields[0] else None
        # positional: a round makes one per GPU process
        return ProcessInfo(pid, readable, identity, self._cpu_of(fields), read_bytes, write_bytes, state)

    def cpu_seconds(self, pid: int) -> float | None:
        """User + system CPU seconds of all threads of the process, from /proc/<pid>/stat."""
        text = self._read(pid, "stat")
        return None if text is None else self._cpu_of(stat_fields(text))

    def _cpu_of(self, fields: list[str]) -> float | None:
        try:
            return (int(fields[11]) + int(fields[12])) / self._ticks  # fields 14 and 15: utime, stime
        except (IndexError, ValueError):
            return None

    def io_bytes(self, pid: int) -> tuple[int | None, int | None]:
        """(rchar, wchar) of /proc/<pid>/io: bytes read and written through system calls, all threads.

        rchar/wchar rather than read_bytes/write_bytes: those count only what reached a block device,
        so a checkpoint written to NFS, a FUSE mount or an object store (a socket) shows none."""
        return _io_of(self._read_kept(pid, "io"))

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


def _io_of(text: str | None) -> tuple[int | None, int | None]:
    """(rchar, wchar) of an io file's text; (None, None) when it could not be read."""
    if text is None:
        return None, None
    # The kernel writes rchar and wchar first, once each: those two lines alone, in one match.
    head = _IO_HEAD.match(text)
    if head is not None and "char" not in text[head.end() :]:
        return int(head[1]), int(head[2])
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key in ("rchar", "wchar") and value.isdigit() and len(value) <= 20:
            values[key] = int(value)
    return values.get("rchar"), values.get("wchar")


def stat_fields(text: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line from field 3 (state) on."""
    # comm (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    return text[text.rfind(")") + 2 :].split()


# ---- engines: the process behind a port, its tree and start time (procfs root as a Path) ----------
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def _listening_inodes_in(table: Path, port: int) -> set[int]:
    text = read_text(os.fspath(table))
    if text is None:
        return set()
    # One regex over the table instead of a split per row: a node's table holds thousands of rows
    # (every connection, TIME_WAIT included) and only a few listeners. Columns: sl, local address,
    # remote address, st, tx:rx queues, timer, retransmits, uid, timeout, inode.
    row = re.compile(
        rf"^ *\d+: [0-9A-F]+:{port:04X} [0-9A-F]+:[0-9A-F]+ {_LISTEN}(?: +\S+){{5}} +(\d+)",
        re.MULTILINE | re.IGNORECASE,
    )
    return {int(m.group(1)) for m in row.finditer(text)}


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
    root = os.fspath(procfs)
    for pid in sorted(candidates):
        # links read relative to the open fd directory: no path built per descriptor (a node's
        # processes hold thousands of them)
        try:
            dir_fd = os.open(f"{root}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            names = os.listdir(dir_fd)
            for name in names:
                try:
                    if os.readlink(name, dir_fd=dir_fd) in wanted:
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
        finally:
            os.close(dir_fd)
    return None


def pid_for_port(procfs: Path, port: int, candidates: Iterable[int] | None = None) -> int | None:
    """PID listening on TCP port; candidates limit the fd scan (and add their network namespaces)."""
    pool = list(candidates) if candidates is not None else all_pids(procfs)
    inodes = listening_inodes(procfs, port, pool if candidates is not None else ())
    if not inodes:
        return None
    return pid_owning_socket(procfs, inodes, pool)


def _stat_fields(procfs: Path, pid: int, kept: KeptFiles | None = None) -> list[str] | None:
    path = f"{procfs}/{pid}/stat"
    raw = read_text(path) if kept is None else kept.read(path)
    return None if raw is None else stat_fields(raw)


def stat_paths(procfs: Path, pids: Iterable[int]) -> set[str]:
    """The /proc/<pid>/stat paths _stat_fields reads for these PIDs (to retain their kept descriptors)."""
    return {f"{procfs}/{pid}/stat" for pid in pids}


def parent_map(procfs: Path) -> dict[int, int]:
    """PID -> parent PID for every process."""
    out: dict[int, int] = {}
    for pid in all_pids(procfs):
        fields = _stat_fields(procfs, pid)
        if fields and len(fields) > 1:
            out[pid] = int(fields[1])
    return out


def parents_of(
    procfs: Path, pids: Iterable[int], known: Mapping[int, int], kept: KeptFiles | None = None
) -> dict[int, int]:
    """PID -> parent PID for each pid and its ancestors.

    A few reads per GPU process instead of a scan of every process on the node (thousands on a busy
    one). The pids themselves are read afresh (through `kept` descriptors when given); ancestors come
    from `known` (earlier rounds) when there, as a process's parent changes only when its parent dies,
    and then its child's entry changes too.
    """
    out: dict[int, int] = {}
    for pid in pids:
        fields = _stat_fields(procfs, pid, kept)
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
    text = read_text(f"{procfs}/stat")
    for line in (text or "").splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def process_start_seconds(
    procfs: Path,
    pid: int,
    clock_ticks_per_second: int | None = None,
    boot_seconds: float | None = None,
    kept: KeptFiles | None = None,
) -> float | None:
    """Process start time (epoch seconds): starttime (field 22, ticks since boot) + btime.

    `boot_seconds`: btime read earlier (it is fixed until a reboot); /proc/stat is generated from
    every CPU's counters on each read, which costs on a node with many cores. `kept`: stat read
    through a kept descriptor (None once the process is gone, as by path)."""
    fields = _stat_fields(procfs, pid, kept)
    boot = boot_seconds if boot_seconds is not None else boot_time_seconds(procfs)
    if not fields or len(fields) < 20 or boot is None:
        return None
    ticks = clock_ticks_per_second or os.sysconf("SC_CLK_TCK")
    return boot + int(fields[19]) / ticks  # field 22 overall; fields here start at field 3


def alive(procfs: Path, pid: int) -> bool:
    """True while /proc/<pid> exists."""
    return os.path.isdir(f"{procfs}/{pid}")
