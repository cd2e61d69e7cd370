"""PID behind a port, process tree and cold start from the procfs fixture tree."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from exporter.collectors.base import GpuProcess, NodeState
from exporter.engines.collector import EnginesCollector
from exporter.engines.settings import EngineSettings
from exporter.engines.targets import Target
from exporter.host import procfs
from exporter.host.exits import own_namespace

from .conftest import FIXTURES, FakeClock, ListSource, samples, value

ROOT = FIXTURES / "procfs"
BOOT = 1_700_000_000.0


def test_listening_port_resolves_to_owning_pid() -> None:
    assert procfs.pid_for_port(ROOT, 8000) == 4242  # 0x1F40, inode 98765; the ESTABLISHED row is ignored
    assert procfs.pid_for_port(ROOT, 22) == 4300
    assert procfs.pid_for_port(ROOT, 9999) is None
    assert procfs.pid_for_port(ROOT, 8000, candidates=[4300]) is None


def test_listener_in_a_pod_network_namespace_found_through_its_processes() -> None:
    # Port 9000 (0x2328) is only in 4250's own net/tcp, as for a pod with its own network namespace.
    assert procfs.pid_for_port(ROOT, 9000, candidates=[4242, 4250]) == 4250
    assert procfs.pid_for_port(ROOT, 9000) is None


def _tcp_row(n: int, local_port: int, state: str, inode: int, remote_port: int = 0) -> str:
    return (
        f"{n:4d}: 0100007F:{local_port:04X} 0100007F:{remote_port:04X} {state} 00000000:00000000 "
        f"00:00000000 00000000  1000        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
    )


def test_listener_found_among_thousands_of_connections_and_mangled_rows(tmp_path: Path) -> None:
    # A busy node's table: thousands of connections on the same port (accepted ones, TIME_WAIT), rows
    # cut short or mangled, lowercase hex; only a LISTEN row of that port counts.
    net = tmp_path / "net"
    net.mkdir()
    head = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    )
    rows = [_tcp_row(n, 0x1F40, "06" if n % 2 else "01", 10_000 + n, 40_000 + n) for n in range(5000)]
    rows.insert(2500, _tcp_row(5000, 0x1F40, "0A", 98765))
    rows.insert(10, "  17: 0100007F:1F40 00000000:0000 0A 00000000:00000000\n")  # cut short: no inode
    rows.insert(20, "garbage \x00\xff line 0A 1F40\n")
    rows.append(_tcp_row(5001, 0x1F41, "0A", 4444).replace("1F41", "1f41"))  # lowercase hex
    rows.append(_tcp_row(5002, 0x1F40, "0A", 5555)[:-1])  # the last row without its newline
    (net / "tcp").write_text(head + "".join(rows))
    assert procfs.listening_inodes(tmp_path, 0x1F40) == {98765, 5555}
    assert procfs.listening_inodes(tmp_path, 0x1F41) == {4444}
    assert procfs.listening_inodes(tmp_path, 0x1F42) == set()
    (net / "tcp").write_bytes(b"\xff\xfe binary \x00" * 1000)  # not a table at all
    assert procfs.listening_inodes(tmp_path, 0x1F40) == set()


def test_procfs_files_larger_than_one_read_are_read_whole(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    lines = [
        f"7f{n:010x}-7f{n + 1:010x} r--p 00000000 08:01 {n} /models/shard-{n}.safetensors\n"
        for n in range(4000)
    ]
    maps.write_text("".join(lines))  # about 300 KiB: several reads
    assert procfs.read_text(str(maps)) == "".join(lines)
    assert procfs.read_text(str(tmp_path / "gone")) is None
    (tmp_path / "bad").write_bytes(b"1 (\xff\xfe) S 1")  # a comm that is not UTF-8 is no error
    assert procfs.read_text(str(tmp_path / "bad")) == "1 (\ufffd\ufffd) S 1"


def test_process_tree_and_start_time() -> None:
    assert procfs.descendants(4242, procfs.parent_map(ROOT)) == {4242, 4250}
    assert procfs.process_start_seconds(ROOT, 4242, clock_ticks_per_second=100) == BOOT + 10.0
    assert procfs.process_start_seconds(ROOT, 99999) is None


def test_gpu_process_ancestry_is_read_without_scanning_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = procfs._stat_fields

    def counted(root: object, pid: int, kept: object = None) -> list[str] | None:
        reads.append(pid)
        return real(root, pid, kept)  # type: ignore[arg-type]

    monkeypatch.setattr(procfs, "_stat_fields", counted)
    parents = procfs.parents_of(ROOT, [4250], {})
    assert parents == {4250: 4242, 4242: 1}
    assert procfs.descendants(4242, parents) == {4242, 4250}
    assert sorted(reads) == [4242, 4250]  # the GPU process and its ancestor, not 4300 or anyone else
    reads.clear()
    assert procfs.parents_of(ROOT, [4250], parents) == parents
    assert reads == [4250]  # the ancestor came from the last round; the GPU process is read afresh
    assert procfs.parents_of(ROOT, [99999], {}) == {}  # a process that is gone


SETTINGS = EngineSettings(procfs_path=ROOT, clock_ticks_per_second=100)  # fixture starttime in 1/100 s


async def test_cold_start_is_first_success_minus_process_start(fake_engines: str) -> None:
    clock = FakeClock(BOOT + 5.0)  # the exporter was up before the engine started (BOOT + 10)
    target = Target(f"{fake_engines}/vllm-0.33.0", namespace="serving", pod="llama-0", pid=4242)
    collector = EnginesCollector([ListSource([target])], SETTINGS, clock)
    try:
        clock.now = BOOT + 55.5
        metrics = list(await collector.collect(NodeState()))
        assert value(metrics, "inference_cold_start_seconds", pod="llama-0") == pytest.approx(45.5)
        clock.now += 30  # later rounds keep the first measurement
        metrics = list(await collector.collect(NodeState()))
        assert value(metrics, "inference_cold_start_seconds", pod="llama-0") == pytest.approx(45.5)
    finally:
        await collector.close()


async def test_engine_running_before_the_exporter_has_no_cold_start(fake_engines: str) -> None:
    clock = FakeClock(BOOT + 3600.0)
    target = Target(f"{fake_engines}/vllm-0.33.0", pod="llama-0", pid=4242)
    collector = EnginesCollector([ListSource([target])], SETTINGS, clock)
    try:
        metrics = list(await collector.collect(NodeState()))
    finally:
        await collector.close()
    assert not samples(metrics, "inference_cold_start_seconds")


def test_the_same_process_seen_through_proc_later_is_not_a_restart() -> None:
    # The engine's own process_start_time_seconds first; a minute later its PID is found and /proc's
    # start time (rounded to btime's whole seconds) differs by more than a second: the cold start
    # measured stays, and from then on /proc alone tells restarts.
    from exporter.engines.collector import Endpoint, EnginesCollector
    from exporter.engines.targets import Target

    from .conftest import FakeClock

    clock = FakeClock(1000.0)
    collector = EnginesCollector([], clock=clock)
    ep = Endpoint(Target("http://127.0.0.1:1/metrics"))
    collector._note_process_start(ep, 1010.0, "engine")
    clock.now = 1013.5
    collector._note_success(ep)
    assert ep.cold_start_seconds == 3.5
    collector._note_process_start(ep, 1008.6, "procfs")  # same process, 1.4 s apart
    assert ep.cold_start_seconds == 3.5
    collector._note_process_start(ep, 1050.0, "procfs")  # a restart, seen by /proc
    assert ep.cold_start_seconds is None


async def test_a_pid_lookup_that_outlasts_its_deadline_is_not_started_again_every_round(
    fake_engines: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Finding the PID behind a local port scans every process's fds; on a busy node the scan can
    # outlast the per-item deadline and is set aside. It must count as this round's try (next one
    # after pid_retry_seconds), not be started afresh by every round once it returns.
    import threading

    from exporter.engines import collector as engines_collector

    scans: list[int] = []
    release = threading.Event()

    def slow_scan(root: object, port: int, candidates: object = None) -> int | None:
        scans.append(port)
        release.wait(5)
        return None

    monkeypatch.setattr(engines_collector.procfs, "pid_for_port", slow_scan)
    clock = FakeClock(BOOT + 100.0)
    settings = EngineSettings(procfs_path=ROOT, procfs_item_timeout_seconds=0.05, pid_retry_seconds=60.0)
    url = fake_engines.replace("localhost", "127.0.0.1") + "/vllm-0.33.0"
    collector = EnginesCollector([ListSource([Target(url, model="m")])], settings, clock)
    try:
        await collector.collect(NodeState())  # the scan starts, outlasts 50 ms, is set aside
        release.set()  # it returns before the next round
        for _ in range(3):
            clock.now += 5.0
            await collector.collect(NodeState())
        assert len(scans) == 1
        clock.now += 60.0  # the retry interval: one more try
        await collector.collect(NodeState())
        assert len(scans) == 2
    finally:
        release.set()
        await collector.close()


async def test_boot_time_is_read_once_not_every_round(
    fake_engines: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /proc/stat is generated from every CPU's counters on each read; btime in it is fixed until a
    # reboot, so the rounds read it once. The start time itself is read every round (a restart).
    from exporter.engines import collector as engines_collector

    boots: list[object] = []
    real_boot = procfs.boot_time_seconds

    def counted_boot(root: Path) -> float | None:
        boots.append(root)
        return real_boot(root)

    monkeypatch.setattr(engines_collector.procfs, "boot_time_seconds", counted_boot)
    clock = FakeClock(BOOT + 5.0)
    target = Target(f"{fake_engines}/vllm-0.33.0", namespace="serving", pod="llama-0", pid=4242)
    collector = EnginesCollector([ListSource([target])], SETTINGS, clock)
    try:
        for _ in range(3):
            clock.now += 5.0
            await collector.collect(NodeState())
        assert collector._endpoints[target.url].process_start == BOOT + 10.0
    finally:
        await collector.close()
    assert len(boots) == 1


def _copy_procfs(tmp_path: Path) -> Path:
    import shutil

    root = tmp_path / "proc"
    shutil.copytree(ROOT, root, symlinks=True)
    return root


def _set_start(root: Path, pid: int, start_ticks: int) -> None:
    """The process at pid is replaced by one started at start_ticks (a new stat file, as a new process
    has: a kept descriptor of the old one must not answer for it)."""
    stat = root / str(pid) / "stat"
    text = stat.read_text()
    head, rest = text[: text.rfind(")") + 2], text[text.rfind(")") + 2 :].split(" ")
    rest[19] = str(start_ticks)  # starttime, field 22 (the fields after comm start at field 3)
    stat.unlink()
    stat.write_text(head + " ".join(rest))


async def test_stat_files_are_kept_open_between_rounds_and_a_restart_under_the_same_pid_is_seen(
    fake_engines: str, tmp_path: Path
) -> None:
    # An engine's and its GPU processes' stat are read every round through kept descriptors; a new
    # process under the same PID (a restart) must still show as one, its start time read afresh.
    root = _copy_procfs(tmp_path)
    clock = FakeClock(BOOT + 5.0)
    target = Target(f"{fake_engines}/vllm-0.33.0", namespace="serving", pod="llama-0", pid=4242)
    settings = EngineSettings(procfs_path=root, clock_ticks_per_second=100)
    collector = EnginesCollector([ListSource([target])], settings, clock)
    state = NodeState(processes=[GpuProcess("GPU-a", "0", 4250)])
    try:
        clock.now = BOOT + 55.5
        await collector.collect(state)
        ep = collector._endpoints[target.url]
        assert ep.process_start == BOOT + 10.0 and ep.cold_start_seconds == pytest.approx(45.5)
        assert ep.tree == {4242, 4250}
        assert len(collector._stat_files) == 2  # the engine's stat and its GPU process's
        _set_start(root, 4242, 9000)  # restarted at BOOT + 90 under the same PID
        clock.now = BOOT + 95.0
        await collector.collect(state)
        assert ep.pid == 4242 and ep.process_start == BOOT + 90.0
        assert ep.cold_start_seconds == pytest.approx(5.0)  # measured afresh for the new process
        state.processes = []  # the GPU process left: its descriptor is closed
        await collector.collect(state)
        assert len(collector._stat_files) == 1
    finally:
        await collector.close()
    assert len(collector._stat_files) == 0


async def test_an_engine_process_that_is_gone_falls_back_to_its_configured_pid(
    fake_engines: str, tmp_path: Path
) -> None:
    # The PID found for an endpoint exits (its stat, read through a kept descriptor, is gone): the
    # configured PID is used again when it lives, and no start time of the gone process is kept.
    import shutil

    root = _copy_procfs(tmp_path)
    clock = FakeClock(BOOT + 5.0)
    target = Target(f"{fake_engines}/vllm-0.33.0", pod="llama-0", pid=4242)
    collector = EnginesCollector([ListSource([target])], EngineSettings(procfs_path=root), clock)
    try:
        await collector.collect(NodeState())
        ep = collector._endpoints[target.url]
        ep.pid = 4300  # as if a port lookup had found another process
        await collector.collect(NodeState())
        assert ep.pid == 4300
        shutil.rmtree(root / "4300")
        await collector.collect(NodeState())
        assert ep.pid == 4242
        shutil.rmtree(root / "4242")
        await collector.collect(NodeState())
        assert ep.pid is None and ep.tree == set()
    finally:
        await collector.close()


async def test_a_gpu_pid_missing_from_procfs_is_looked_for_again_only_after_the_retry_interval(
    fake_engines: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NVML may list PIDs of another PID namespace (no hostPID): their stat never opens, so they are
    # not looked for every round; a listed PID that is there is read every round (its parent can
    # change), and one that leaves the GPUs and comes back is looked for at once.
    reads: list[int] = []
    real = procfs._stat_fields

    def counted(root: Path, pid: int, kept: object = None) -> list[str] | None:
        reads.append(pid)
        return real(root, pid, kept)  # type: ignore[arg-type]

    monkeypatch.setattr(procfs, "_stat_fields", counted)
    clock = FakeClock(BOOT + 5.0)
    target = Target(f"{fake_engines}/vllm-0.33.0", pid=4242)
    settings = EngineSettings(procfs_path=ROOT, clock_ticks_per_second=100, pid_retry_seconds=60.0)
    collector = EnginesCollector([ListSource([target])], settings, clock)
    gpus = [GpuProcess("GPU-a", "0", 4250), GpuProcess("GPU-b", "1", 77777)]  # 77777: not in our /proc
    state = NodeState(processes=gpus)
    try:
        await collector.collect(state)
        assert reads.count(77777) == 1 and reads.count(4250) == 1
        for _ in range(3):
            clock.now += 5.0
            await collector.collect(state)
        assert reads.count(77777) == 1 and reads.count(4250) == 4
        assert collector._endpoints[target.url].tree == {4242, 4250}
        clock.now += 60.0  # the retry interval: looked for once more
        await collector.collect(state)
        assert reads.count(77777) == 2
        state.processes = gpus[:1]  # it leaves the GPUs ...
        clock.now += 5.0
        await collector.collect(state)
        state.processes = gpus  # ... and a process with that PID is listed again: looked for at once
        clock.now += 5.0
        await collector.collect(state)
        assert reads.count(77777) == 3
    finally:
        await collector.close()


def _ppid(pid: int) -> int:
    fields = procfs.stat_fields(Path(f"/proc/{pid}/stat").read_text())
    return int(fields[1])


@pytest.mark.skipif(
    not hasattr(os, "pidfd_open") or not own_namespace(Path("/proc")), reason="needs pidfds on our own /proc"
)
async def test_rounds_read_proc_only_until_a_followed_process_exits(
    fake_engines: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine (P1) whose worker (P2) runs a GPU process (P3). Once the reads are vouched for by
    # pidfds opened before them, rounds read nothing; the worker's exit reparents the GPU process,
    # and the very next round reads again and no longer counts it in the engine's tree.
    engine = await asyncio.create_subprocess_exec(
        "sh", "-c", 'sh -c "sleep 60 & echo \\$!; wait" & exec sleep 60', stdout=asyncio.subprocess.PIPE
    )  # fmt: skip
    assert engine.stdout is not None
    gpu = int(await engine.stdout.readline())
    worker = _ppid(gpu)
    assert _ppid(worker) == engine.pid
    collector = EnginesCollector(
        [ListSource([Target(f"{fake_engines}/vllm-0.33.0", pid=engine.pid)])],
        EngineSettings(procfs_path=Path("/proc")),
        FakeClock(),
    )
    reads: list[object] = []
    real_read = collector._procfs.read

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args[0])
        return await real_read(*args, **kwargs)

    monkeypatch.setattr(collector._procfs, "read", counted)
    state = NodeState(processes=[GpuProcess("GPU-a", "0", gpu)])
    try:
        await collector.collect(state)  # the worker was not watched before its child's read named it
        await collector.collect(state)  # read once more, every process watched before the reads
        assert len(reads) == 2
        for _ in range(3):
            metrics = list(await collector.collect(state))
        assert len(reads) == 2  # nothing read: nothing followed has exited
        ep = next(iter(collector._endpoints.values()))
        assert ep.pid == engine.pid and ep.tree == {engine.pid, worker, gpu}
        assert value(metrics, "inference_requests_running", gpu="0") >= 0
        state.processes = [GpuProcess("GPU-a", "0", gpu), GpuProcess("GPU-b", "1", engine.pid)]
        await collector.collect(state)  # another GPU listing: read
        assert len(reads) == 3
        state.processes = [GpuProcess("GPU-a", "0", gpu)]
        await collector.collect(state)
        await collector.collect(state)
        reads.clear()
        os.kill(worker, signal.SIGKILL)  # the GPU process is reparented
        for _ in range(200):
            if collector._exits.fired:
                break
            await asyncio.sleep(0.01)
        await collector.collect(state)
        assert len(reads) == 1 and _ppid(gpu) != worker
        assert ep.tree == {engine.pid}
    finally:
        await collector.close()
        for pid in (gpu, engine.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await engine.wait()
    assert len(collector._exits) == 0


async def test_a_procfs_of_another_pid_namespace_is_read_every_round(fake_engines: str) -> None:
    # A fixture tree (or a host /proc mounted elsewhere) names PIDs pidfd_open would not open: no
    # round is kept, every round reads.
    collector = EnginesCollector(
        [ListSource([Target(f"{fake_engines}/vllm-0.33.0", pid=4242)])], SETTINGS, FakeClock(BOOT + 5.0)
    )
    assert not collector._exits.available
    starts: list[float] = []
    try:
        for _ in range(3):
            await collector.collect(NodeState(processes=[GpuProcess("GPU-a", "0", 4250)]))
            starts.append(collector._endpoints[next(iter(collector._endpoints))].process_start or 0.0)
        assert starts == [BOOT + 10.0] * 3 and collector._settled is None
    finally:
        await collector.close()


async def test_a_kernel_without_pidfds_leaves_every_round_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    # pidfd_open answering ENOSYS (before Linux 5.3) or EPERM (a seccomp profile): nothing is watched,
    # so no round is kept, and the call is not tried again for every PID of every round.
    from exporter.host.exits import ExitWatch

    calls: list[int] = []

    def refused(pid: int, flags: int = 0) -> int:
        calls.append(pid)
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused, raising=False)
    watch = ExitWatch(Path("/proc"))
    watch.available = True  # as on a host whose /proc is ours
    assert watch.watch([os.getpid(), os.getppid()]) == frozenset()
    assert not watch.available and calls == [os.getpid()]
    assert watch.watch([os.getpid()]) == frozenset() and calls == [os.getpid()]
