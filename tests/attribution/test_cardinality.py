"""Process series are capped, drops are counted, and churn leaves no series behind."""

from __future__ import annotations

from pathlib import Path

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.collectors.base import GpuProcess, GpuRef, NodeState
from exporter.host.procfs import Procfs
from tests.attribution.conftest import GPU_UUIDS
from tests.attribution.helpers import (
    CLOCK_TICKS,
    ProcfsTree,
    cgroup_v2_systemd,
    label_rows,
    samples,
    write_pod_dir,
)
from tests.fakes.kubelet import FakeKubelet, pod

CPU_TOTAL = "gpu_process_host_cpu_seconds_total"
DROPPED = "gpupulse_series_dropped_total"


def make_collector(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, max_processes: int
) -> AttributionCollector:
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_refresh_interval_seconds=3600.0,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
        max_processes=max_processes,
    )
    return AttributionCollector(settings, procfs=Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS))


def gpu_proc(pid: int) -> GpuProcess:
    gpu = pid % 8
    return GpuProcess(uuid=GPU_UUIDS[gpu], index=str(gpu), pid=pid)


async def test_cap_keeps_existing_series_and_counts_the_rest(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    for pid in range(1000, 1100):
        procfs.add(pid, "0::/system.slice/x.service\n", utime_ticks=pid)
    collector = make_collector(kubelet, procfs, tmp_path, max_processes=30)
    try:
        first = await collector.collect(
            NodeState(gpus=gpus, processes=[gpu_proc(p) for p in range(1050, 1100)])
        )
        # 50 newcomers with lower PIDs must not push the 30 exported series out.
        second = await collector.collect(
            NodeState(gpus=gpus, processes=[gpu_proc(p) for p in range(1000, 1100)])
        )
    finally:
        await collector.close()
    kept_first = label_rows(first, CPU_TOTAL, "pid")
    assert len(kept_first) == 30
    assert label_rows(second, CPU_TOTAL, "pid") == kept_first
    assert [s.value for s in samples(first, DROPPED)] == [20.0]
    assert [(s.labels, s.value) for s in samples(second, DROPPED)] == [({"collector": "attribution"}, 90.0)]


async def test_churn_of_1000_processes_leaves_no_series_or_state_behind(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    # 1,000 short-lived processes in 50 pods, 100 alive per round, on exclusively allocated GPUs.
    pods_per_round = 5
    collector = make_collector(kubelet, procfs, tmp_path, max_processes=1000)
    total_pids = 0
    try:
        for round_no in range(10):
            live = list(range(20_000 + round_no * 100, 20_000 + (round_no + 1) * 100))
            uids = [f"{round_no:08x}-0000-0000-0000-{p:012x}" for p in range(pods_per_round)]
            kubelet.pods = tuple(
                pod("churn", f"job-{round_no}-{p}", {"main": {"nvidia.com/gpu": [GPU_UUIDS[p]]}})
                for p in range(pods_per_round)
            )
            for p, uid in enumerate(uids):
                write_pod_dir(tmp_path / "pods", uid, "churn", f"job-{round_no}-{p}")
            for pid in live:
                procfs.add(pid, cgroup_v2_systemd(uids[pid % pods_per_round], f"{pid:064x}"), utime_ticks=pid)
            processes = [
                GpuProcess(
                    uuid=GPU_UUIDS[pid % pods_per_round],
                    index=str(pid % pods_per_round),
                    pid=pid,
                )
                for pid in live
            ]
            tracker = collector.tracker
            assert tracker is not None
            if round_no:
                await tracker.refresh_once()
            state = NodeState(gpus=gpus, processes=processes)
            families = await collector.collect(state)

            assert label_rows(families, CPU_TOTAL, "pid") == {(str(p),) for p in live}
            assert {s.labels["pod"] for s in samples(families, CPU_TOTAL)} == {
                f"job-{round_no}-{p}" for p in range(pods_per_round)
            }
            assert set(state.pid_pods) == set(live)
            assert collector.known_pod_uids <= pods_per_round
            total_pids += len(live)
            for pid in live:
                procfs.remove(pid)

        kubelet.pods = ()
        assert tracker is not None
        await tracker.refresh_once()
        state = NodeState(gpus=gpus, processes=[])
        families = await collector.collect(state)
    finally:
        await collector.close()
    assert total_pids == 1000
    assert samples(families, CPU_TOTAL) == []
    assert samples(families, "gpu_allocation_info") == []
    assert state.pid_pods == {} and state.allocations == {}
    assert collector.known_pod_uids == 0
    assert [s.value for s in samples(families, DROPPED)] == [0.0]
