"""Process -> pod and host CPU seconds from a procfs fixture tree."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.collectors.base import GpuProcess, GpuRef, NodeState, PodRef
from exporter.host.procfs import ProcessInfo, Procfs
from tests.attribution.conftest import GPU_UUIDS, MIG_UUIDS
from tests.attribution.helpers import (
    CLOCK_TICKS,
    ProcfsTree,
    cgroup_host,
    cgroup_v1_cgroupfs,
    cgroup_v2_systemd,
    label_rows,
    samples,
    write_pod_dir,
)
from tests.fakes.kubelet import FakeKubelet, pod

CPU_TOTAL = "gpu_process_host_cpu_seconds_total"
READ_BYTES = "gpu_process_io_read_bytes_total"
WRITE_BYTES = "gpu_process_io_write_bytes_total"
UIDS = [f"aaaaaaa{i}-bbbb-cccc-dddd-eeeeeeeeeee{i}" for i in range(4)]
CIDS = [f"{i:x}" * 64 for i in range(10, 14)]


def make_collector(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, max_processes: int = 1000
) -> AttributionCollector:
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_refresh_interval_seconds=3600.0,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
        max_processes=max_processes,
    )
    return AttributionCollector(settings, procfs=Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS))


def proc(gpu: int, pid: int, mig_uuid: str = "") -> GpuProcess:
    return GpuProcess(uuid=GPU_UUIDS[gpu], index=str(gpu), pid=pid, mig_uuid=mig_uuid)


async def test_exclusive_gpu_process_gets_its_pod_and_host_cpu_seconds(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (
        pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}, "proxy": {}}),
        pod("vision", "resnet", {"triton": {"nvidia.com/gpu": [GPU_UUIDS[1]]}}),
    )
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=1234, stime_ticks=66)
    procfs.add(4002, cgroup_v1_cgroupfs(UIDS[1], CIDS[1]), utime_ticks=50, stime_ticks=50)
    state = NodeState(gpus=gpus, processes=[proc(0, 4001), proc(1, 4002)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()

    assert state.pid_pods == {
        4001: PodRef("serving", "llama-0", "vllm"),
        4002: PodRef("vision", "resnet", "triton"),
    }
    values = {
        (s.labels["pid"], s.labels["pod"], s.labels["container"]): s.value
        for s in samples(families, CPU_TOTAL)
    }
    assert values == {
        ("4001", "llama-0", "vllm"): pytest.approx(13.0),
        ("4002", "resnet", "triton"): pytest.approx(1.0),
    }


async def test_host_cpu_seconds_follow_proc_stat(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
    # A starved GPU: its process burns a whole core of preprocessing between two rounds.
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100, comm="python3 (pre) proc")
    state = NodeState(gpus=gpus, processes=[proc(0, 4001)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        first = await collector.collect(state)
        procfs.add(
            4001,
            cgroup_v2_systemd(UIDS[0], CIDS[0]),
            utime_ticks=550,
            stime_ticks=50,
            comm="python3 (pre) proc",
        )
        second = await collector.collect(state)
    finally:
        await collector.close()
    assert [s.value for s in samples(first, CPU_TOTAL)] == [pytest.approx(1.0)]
    assert [s.value for s in samples(second, CPU_TOTAL)] == [pytest.approx(6.0)]


async def test_time_sliced_gpu_processes_are_told_apart_by_pod_uid(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    shared = "nvidia.com/gpu.shared"
    kubelet.pods = (
        pod("serving", "embed", {"server": {shared: [f"{GPU_UUIDS[2]}::0"]}}),
        pod("serving", "rerank", {"server": {shared: [f"{GPU_UUIDS[2]}::1"]}}),
        pod("batch", "ocr", {"worker": {shared: [f"{GPU_UUIDS[2]}::2"]}}),
    )
    for i, (namespace, name) in enumerate([("serving", "embed"), ("serving", "rerank"), ("batch", "ocr")]):
        write_pod_dir(tmp_path / "pods", UIDS[i], namespace, name)
        procfs.add(5000 + i, cgroup_v2_systemd(UIDS[i], CIDS[i]))
    state = NodeState(gpus=gpus, processes=[proc(2, 5000), proc(2, 5001), proc(2, 5002)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()
    assert state.pid_pods == {
        5000: PodRef("serving", "embed", "server"),
        5001: PodRef("serving", "rerank", "server"),
        5002: PodRef("batch", "ocr", "worker"),
    }
    assert label_rows(families, CPU_TOTAL, "pid", "uuid", "pod") == {
        ("5000", GPU_UUIDS[2], "embed"),
        ("5001", GPU_UUIDS[2], "rerank"),
        ("5002", GPU_UUIDS[2], "ocr"),
    }


async def test_shared_gpu_without_names_is_left_unattributed_not_guessed(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    shared = "nvidia.com/gpu.shared"
    kubelet.pods = (
        pod("serving", "embed", {"server": {shared: [f"{GPU_UUIDS[2]}::0"]}}),
        pod("serving", "rerank", {"server": {shared: [f"{GPU_UUIDS[2]}::1"]}}),
    )
    procfs.add(5000, cgroup_v2_systemd(UIDS[0], CIDS[0]))  # no kubelet pod directory to name the UID
    state = NodeState(gpus=gpus, processes=[proc(2, 5000)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        await collector.collect(state)
    finally:
        await collector.close()
    assert state.pid_pods == {5000: PodRef("", "", "")}


async def test_uid_learned_from_an_exclusive_gpu_names_the_same_pod_on_a_shared_one(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    shared = "nvidia.com/gpu.shared"
    kubelet.pods = (
        pod("serving", "big", {"main": {"nvidia.com/gpu": [GPU_UUIDS[0]], shared: [f"{GPU_UUIDS[2]}::0"]}}),
        pod("serving", "small", {"main": {shared: [f"{GPU_UUIDS[2]}::1"]}}),
    )
    procfs.add(6000, cgroup_v2_systemd(UIDS[0], CIDS[0]))
    procfs.add(6001, cgroup_v2_systemd(UIDS[0], CIDS[0]))
    state = NodeState(gpus=gpus, processes=[proc(0, 6000), proc(2, 6001)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        await collector.collect(state)
    finally:
        await collector.close()
    assert state.pid_pods[6001] == PodRef("serving", "big", "main")


async def test_host_process_on_an_allocated_gpu_is_not_given_the_pod(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
    procfs.add(7000, cgroup_host(), utime_ticks=300)
    state = NodeState(gpus=gpus, processes=[proc(0, 7000)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()
    assert state.pid_pods == {7000: PodRef("", "", "")}
    assert label_rows(families, CPU_TOTAL, "pid", "namespace", "pod", "container") == {("7000", "", "", "")}


async def test_mig_process_is_matched_through_its_instance(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (
        pod("ml", "small-a", {"worker": {"nvidia.com/mig-1g.10gb": [MIG_UUIDS[0]]}}),
        pod("ml", "small-b", {"worker": {"nvidia.com/mig-1g.10gb": [MIG_UUIDS[1]]}}),
    )
    procfs.add(8000, cgroup_v2_systemd(UIDS[0], CIDS[0]))
    procfs.add(8001, cgroup_v2_systemd(UIDS[1], CIDS[1]))
    state = NodeState(gpus=gpus, processes=[proc(7, 8000, MIG_UUIDS[0]), proc(7, 8001, MIG_UUIDS[1])])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()
    assert state.pid_pods == {
        8000: PodRef("ml", "small-a", "worker"),
        8001: PodRef("ml", "small-b", "worker"),
    }
    assert label_rows(families, CPU_TOTAL, "uuid", "gpu", "pid") == {
        (GPU_UUIDS[7], "7", "8000"),
        (GPU_UUIDS[7], "7", "8001"),
    }


async def test_process_that_exited_before_the_read_has_no_series(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    state = NodeState(gpus=gpus, processes=[proc(0, 9999)])  # NVML saw it, /proc no longer has it
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        families = await collector.collect(state)
    finally:
        await collector.close()
    assert samples(families, CPU_TOTAL) == []


class _HangingProcfs(Procfs):
    """A procfs where reading one PID never returns (a process stuck in the kernel, a FUSE /proc)."""

    def __init__(self, root: str, hung_pid: int) -> None:
        super().__init__(root, clock_ticks_per_second=CLOCK_TICKS)
        self.hung_pid = hung_pid
        self.release = threading.Event()
        self.reads: list[int] = []

    def process(self, pid: int) -> ProcessInfo:
        self.reads.append(pid)
        if pid == self.hung_pid:
            self.release.wait()
        return super().process(pid)


async def test_a_hung_proc_read_costs_only_its_pid_and_keeps_its_pod(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (
        pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),
        pod("vision", "resnet", {"triton": {"nvidia.com/gpu": [GPU_UUIDS[1]]}}),
    )
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100)
    procfs.add(4002, cgroup_v2_systemd(UIDS[1], CIDS[1]), utime_ticks=200)
    hanging = _HangingProcfs(str(procfs.root), hung_pid=4001)
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_refresh_interval_seconds=3600.0,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
        procfs_item_timeout_seconds=0.1,
    )
    collector = AttributionCollector(settings, procfs=hanging)
    state = NodeState(gpus=gpus, processes=[proc(0, 4001), proc(1, 4002)])
    try:
        # a first round with both readable gives 4001 its pod
        hanging.hung_pid = 0
        await collector.collect(state)
        assert state.pid_pods[4001] == PodRef("serving", "llama-0", "vllm")
        hanging.hung_pid = 4001
        families = await collector.collect(state)  # returns although 4001's read never does
        cpu = {s.labels["pid"]: s.value for s in samples(families, CPU_TOTAL)}
        assert cpu == {"4002": pytest.approx(2.0)}  # no stale CPU value for the hung PID
        assert state.pid_pods == {
            4001: PodRef("serving", "llama-0", "vllm"),  # it keeps the pod it had
            4002: PodRef("vision", "resnet", "triton"),
        }
        reads_of_hung = hanging.reads.count(4001)
        await collector.collect(state)
        assert hanging.reads.count(4001) == reads_of_hung  # not read again while its read is out
        assert {i.labels["pod"] for i in samples(families, "gpu_allocation_info")} == {"llama-0", "resnet"}
    finally:
        hanging.release.set()
        await collector.close()


def test_a_pod_process_cgroup_is_read_once_and_a_reused_pid_afresh(procfs: ProcfsTree) -> None:
    reader = Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS)
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100, start_ticks=5000)
    first = reader.process(4001)
    assert first.identity is not None and first.identity.pod_uid == UIDS[0]
    cgroup = procfs.root / "4001" / "cgroup"
    cgroup.unlink()  # read once: the next rounds do not open it again, and CPU still moves
    procfs_stat = procfs.root / "4001" / "stat"
    procfs_stat.write_text(procfs_stat.read_text().replace(" 100 0 ", " 150 0 ", 1))
    again = reader.process(4001)
    assert again.identity == first.identity and again.cgroup_readable
    assert again.cpu_seconds == 150 / CLOCK_TICKS
    # the PID is reused by a process of another pod, which started later
    procfs.add(4001, cgroup_v2_systemd(UIDS[1], CIDS[1]), start_ticks=9000)
    reused = reader.process(4001)
    assert reused.identity is not None and reused.identity.pod_uid == UIDS[1]


def test_a_process_outside_any_pod_is_read_each_time_so_a_later_move_into_one_shows(
    procfs: ProcfsTree,
) -> None:
    reader = Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS)
    procfs.add(4002, cgroup_host(), start_ticks=7000)
    assert reader.process(4002).identity is None
    (procfs.root / "4002" / "cgroup").write_text(cgroup_v2_systemd(UIDS[2], CIDS[2]))  # same process
    moved = reader.process(4002)
    assert moved.identity is not None and moved.identity.pod_uid == UIDS[2]


def test_a_stat_without_start_time_never_serves_a_kept_cgroup(procfs: ProcfsTree) -> None:
    reader = Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS)
    procfs.add(4003, cgroup_v2_systemd(UIDS[0], CIDS[0]))
    reader.process(4003)
    (procfs.root / "4003" / "stat").write_text("4003 (python3) S 1 4003 4003 0 -1 0 0 0 0 0 1 1 0 0\n")
    (procfs.root / "4003" / "cgroup").write_text(cgroup_v2_systemd(UIDS[3], CIDS[3]))
    info = reader.process(4003)
    assert info.identity is not None and info.identity.pod_uid == UIDS[3]


async def test_a_new_kubelet_answer_moves_allocations_and_process_series_in_the_next_round(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    # Rounds reuse what an unchanged kubelet answer gave and each process's series: a new answer,
    # a process moving to another GPU, and a process leaving must each show in the very next round.
    kubelet.pods = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100)
    procfs.add(4002, cgroup_host(), utime_ticks=100)
    state = NodeState(gpus=gpus, processes=[proc(0, 4001), proc(1, 4002)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        first = await collector.collect(state)
        again = await collector.collect(state)
        kubelet.pods = (pod("serving", "llama-1", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
        assert collector.tracker is not None
        await collector.tracker.refresh_once()
        state.processes = [proc(2, 4001)]  # 4001 moved to GPU 2; 4002 left the GPUs
        moved = await collector.collect(state)
    finally:
        await collector.close()
    rows = ("pid", "gpu", "pod")
    assert label_rows(first, CPU_TOTAL, *rows) == {("4001", "0", "llama-0"), ("4002", "1", "")}
    assert label_rows(again, CPU_TOTAL, *rows) == label_rows(first, CPU_TOTAL, *rows)
    assert state.allocations == {GPU_UUIDS[0]: (PodRef("serving", "llama-1", "vllm"),)}
    assert label_rows(moved, "gpu_allocation_info", "pod") == {("llama-1",)}
    assert label_rows(moved, CPU_TOTAL, *rows) == {("4001", "2", "")}
    assert label_rows(moved, "gpu_process_state", "pid") == {("4001",)}


async def test_an_unchanged_pid_pod_map_is_published_as_the_same_object_and_a_change_as_a_new_one(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    # The processes collector reuses its rows while NodeState.pid_pods is the map they came from, so
    # a round that learned nothing new must not hand it a fresh (equal) map; any change must.
    kubelet.pods = (
        pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),
        pod("vision", "resnet", {"triton": {"nvidia.com/gpu": [GPU_UUIDS[1]]}}),
    )
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100)
    procfs.add(4002, cgroup_v2_systemd(UIDS[1], CIDS[1]), utime_ticks=100)
    state = NodeState(gpus=gpus, processes=[proc(0, 4001), proc(1, 4002)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        await collector.collect(state)
        first = state.pid_pods
        procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=500)  # new values only
        await collector.collect(state)
        assert state.pid_pods is first
        kubelet.pods = (
            pod("serving", "llama-1", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),
            pod("vision", "resnet", {"triton": {"nvidia.com/gpu": [GPU_UUIDS[1]]}}),
        )
        assert collector.tracker is not None
        await collector.tracker.refresh_once()
        await collector.collect(state)
        renamed = state.pid_pods
        assert renamed is not first and renamed[4001] == PodRef("serving", "llama-1", "vllm")
        assert first[4001] == PodRef("serving", "llama-0", "vllm")  # a published map is never changed
        state.processes = [proc(0, 4001)]  # 4002 left the GPUs
        await collector.collect(state)
        assert state.pid_pods is not renamed and set(state.pid_pods) == {4001}
    finally:
        await collector.close()


async def test_rounds_that_reuse_the_host_rows_export_what_a_fresh_collector_would(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    # While the GPU processes and their pods stay the same, a round keeps last round's host rows and
    # puts in new values; an unreadable io, a process whose read fails, one in a new state or one
    # that moves must each show exactly as a collector that never saw the node would show them.
    from tests.attribution.helpers import set_cpu_ticks, set_io

    kubelet.pods = (
        pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),
        pod("vision", "resnet", {"triton": {"nvidia.com/gpu": [GPU_UUIDS[1]]}}),
    )
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100)
    procfs.add(4002, cgroup_v2_systemd(UIDS[1], CIDS[1]), utime_ticks=200)
    for pid in (4001, 4002):
        set_io(procfs.root, pid, pid, 1)
    write_pod_dir(tmp_path / "pods", UIDS[0], "serving", "llama-0")  # a fresh collector names them too
    write_pod_dir(tmp_path / "pods", UIDS[1], "vision", "resnet")
    state = NodeState(gpus=gpus, processes=[proc(0, 4001), proc(1, 4002)])
    kept = make_collector(kubelet, procfs, tmp_path)
    names = ("gpu_process_host_cpu_seconds_total", READ_BYTES, WRITE_BYTES, "gpu_process_state")

    def exported(families: object) -> set[tuple[object, ...]]:
        return {
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for name in names
            for s in samples(families, name)  # type: ignore[arg-type]
        }

    async def same_as_fresh() -> set[tuple[object, ...]]:
        got = exported(await kept.collect(state))
        fresh = make_collector(kubelet, procfs, tmp_path)
        try:
            assert got == exported(await fresh.collect(NodeState(gpus=gpus, processes=state.processes)))
        finally:
            await fresh.close()
        return got

    try:
        first = await same_as_fresh()
        assert kept._host_memo is not None  # the rounds below reuse these rows while they can
        set_cpu_ticks(procfs.root, 4001, 500, "disk_sleep")
        set_io(procfs.root, 4002, 9999, 7)
        assert await same_as_fresh() != first  # new values through the kept rows
        (procfs.root / "4002" / "io").unlink()  # io unreadable: its io series go, the rest stay
        assert {s[0] for s in await same_as_fresh() if ("pid", "4002") in s[1]} == set(names) - {
            READ_BYTES,
            WRITE_BYTES,
        }
        (procfs.root / "4001" / "stat").unlink()  # its read fails: no host series for it
        assert not [s for s in await same_as_fresh() if ("pid", "4001") in s[1]]
        procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=700)
        await same_as_fresh()
        state.processes = [proc(2, 4001), proc(1, 4002)]  # 4001 moved to GPU 2
        assert ("gpu", "2") in next(s[1] for s in await same_as_fresh() if ("pid", "4001") in s[1])
    finally:
        await kept.close()


async def test_a_listing_that_grows_or_puts_a_pid_on_another_gpu_is_read_in_full_next_round(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    # A round keeps the last round's PIDs and devices while the listing holds the same processes;
    # a new PID, or a PID now also on another GPU, must be read and placed in the very next round.
    kubelet.pods = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0], GPU_UUIDS[1]]}}),)
    procfs.add(4001, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=100)
    procfs.add(4002, cgroup_v2_systemd(UIDS[0], CIDS[0]), utime_ticks=200)
    state = NodeState(gpus=gpus, processes=[proc(0, 4001)])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        await collector.collect(state)
        await collector.collect(state)
        state.processes = [proc(0, 4001), proc(1, 4002)]
        grown = await collector.collect(state)
        state.processes = [proc(0, 4001), proc(1, 4001), proc(1, 4002)]
        spread = await collector.collect(state)
    finally:
        await collector.close()
    rows = ("pid", "gpu", "pod")
    assert label_rows(grown, CPU_TOTAL, *rows) == {("4001", "0", "llama-0"), ("4002", "1", "llama-0")}
    assert label_rows(spread, CPU_TOTAL, *rows) == {
        ("4001", "0", "llama-0"),
        ("4001", "1", "llama-0"),
        ("4002", "1", "llama-0"),
    }
    assert state.pid_pods == {
        4001: PodRef("serving", "llama-0", "vllm"),
        4002: PodRef("serving", "llama-0", "vllm"),
    }
