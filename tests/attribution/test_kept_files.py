"""Small /proc files read through kept descriptors: always what the file says now, never a gone
process's text, within a descriptor budget, and nothing left open."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.collectors.base import GpuRef, NodeState
from exporter.host.kept import READ_BYTES, KeptFiles
from exporter.host.procfs import Procfs
from tests.attribution.helpers import CLOCK_TICKS, ProcfsTree, cgroup_v2_systemd, samples
from tests.attribution.test_processes import CIDS, UIDS, proc
from tests.fakes.kubelet import FakeKubelet, pod


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_kept_descriptor_reads_what_the_file_says_now(tmp_path: Path) -> None:
    f = tmp_path / "stat"
    f.write_text("one\n")
    kept = KeptFiles()
    assert kept.read(str(f)) == "one\n" and len(kept) == 1
    f.write_text("two, longer\n")  # rewritten in place, as a fixture tree does
    assert kept.read(str(f)) == "two, longer\n"
    f.write_text("3\n")  # shorter: nothing of the old text after it
    assert kept.read(str(f)) == "3\n"
    kept.close()


def test_a_file_removed_or_replaced_is_not_read_through_its_old_descriptor(tmp_path: Path) -> None:
    f = tmp_path / "stat"
    f.write_text("old process\n")
    kept = KeptFiles()
    assert kept.read(str(f)) == "old process\n"
    f.unlink()  # the process exited
    assert kept.read(str(f)) is None and len(kept) == 0
    f.write_text("first\n")
    assert kept.read(str(f)) == "first\n"
    replacement = tmp_path / "new"
    replacement.write_text("a new process with that PID\n")
    replacement.rename(f)  # another inode at the path
    assert kept.read(str(f)) == "a new process with that PID\n"
    kept.close()


def test_a_real_process_read_through_its_descriptor_until_it_is_reaped() -> None:
    child = subprocess.Popen(["sleep", "60"])
    path = f"/proc/{child.pid}/stat"
    kept = KeptFiles()
    try:
        first = kept.read(path)
        assert first is not None and first.startswith(f"{child.pid} (sleep) ") and len(kept) == 1
        child.send_signal(signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not yet reaped
        zombie = kept.read(path)
        assert zombie is not None and zombie.split(") ", 1)[1].startswith("Z ")
        child.wait()  # reaped: the old descriptor fails, the path is gone
        assert kept.read(path) is None and len(kept) == 0
    finally:
        child.kill()
        child.wait()
        kept.close()


def test_descriptors_stay_within_their_budget_and_are_all_closed(tmp_path: Path) -> None:
    before = _open_fds()
    files = []
    for i in range(5):
        files.append(str(tmp_path / f"f{i}"))
        Path(files[-1]).write_text(f"{i}\n")
    big = tmp_path / "big"
    big.write_bytes(b"x" * (READ_BYTES + 10))  # read whole, never kept
    empty = tmp_path / "empty"
    empty.write_text("")
    kept = KeptFiles(max_open=2)
    for _ in range(3):
        assert [kept.read(f) for f in files] == [f"{i}\n" for i in range(5)]
        assert kept.read(str(big)) == "x" * (READ_BYTES + 10)
        assert kept.read(str(empty)) == ""
        assert kept.read(str(tmp_path / "missing")) is None
        assert len(kept) == 2
    assert _open_fds() == before + 2
    kept.retain({files[1]})  # the others' processes left
    assert len(kept) == 1 and kept.read(files[1]) == "1\n" and kept.read(files[0]) == "0\n"
    kept.close()
    assert len(kept) == 0 and _open_fds() == before


async def test_a_round_closes_the_descriptors_of_processes_that_left(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [gpus[0].uuid, gpus[1].uuid]}}),)
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100)
    procfs.add(4002, cgroup_v2_systemd(UIDS[0], CIDS[1]), utime_ticks=200)
    for pid in (4001, 4002):
        (procfs.root / str(pid) / "io").write_text(f"rchar: {pid}\nwchar: 1\nsyscr: 1\n")
    kept = KeptFiles()
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_refresh_interval_seconds=3600.0,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
    )
    collector = AttributionCollector(
        settings, procfs=Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS, kept=kept)
    )
    state = NodeState(gpus=gpus, processes=[proc(0, 4001), proc(1, 4002)])
    try:
        await collector.collect(state)
        assert len(kept) == 4  # stat and io of each
        procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=300)
        state.processes = [proc(0, 4001)]  # 4002 left the GPU
        families = await collector.collect(state)
        assert len(kept) == 2
        cpu = {s.labels["pid"]: s.value for s in samples(families, "gpu_process_host_cpu_seconds_total")}
        assert cpu == {"4001": pytest.approx(3.0)}  # read through its kept descriptor, now
        io = {s.labels["pid"]: s.value for s in samples(families, "gpu_process_io_read_bytes_total")}
        assert io == {"4001": 4001.0}
    finally:
        await collector.close()
    assert len(kept) == 0


def test_retaining_the_same_pids_again_still_closes_a_descriptor_kept_since(procfs: ProcfsTree) -> None:
    # A round retains the PIDs it read; the next round with the same PIDs has nothing to close and
    # skips the work, but a descriptor kept in between for another PID must still be closed.
    for pid in (4001, 4002, 4003):
        procfs.add(pid, cgroup_v2_systemd(UIDS[0], CIDS[0]))
        (procfs.root / str(pid) / "io").write_text(f"rchar: {pid}\nwchar: 1\nsyscr: 1\n")
    kept = KeptFiles()
    reader = Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS, kept=kept)
    reader.process(4001)
    reader.process(4002)
    reader.retain([4001, 4002])
    assert len(kept) == 4
    calls: list[object] = []
    real_retain = kept.retain
    kept.retain = lambda paths: calls.append(paths) or real_retain(paths)  # type: ignore[method-assign]
    reader.process(4001)  # read again through the kept descriptors: nothing new kept
    reader.retain([4002, 4001])
    assert len(kept) == 4 and calls == []  # nothing to close: no pass over the descriptors
    reader.process(4003)  # read outside the retained PIDs
    assert len(kept) == 6
    reader.retain([4001, 4002])
    assert len(kept) == 4
    reader.retain([4001])
    assert len(kept) == 2
    reader.close()
