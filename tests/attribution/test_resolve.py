"""PID -> pod without blocking: once a pod UID is named, a round needs no pod directory read (and no
thread); a UID that needs one leaves the resolver as it was; a hung read keeps the last mapping and
is not stacked on."""

from __future__ import annotations

import threading
from pathlib import Path

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.attribution.podresources_proto import ContainerResources, PodResources
from exporter.attribution.resolve import PodResolver, ProcessDevices
from exporter.collectors.base import GpuProcess, GpuRef, NodeState, PodRef
from exporter.host.cgroup import CgroupIdentity
from exporter.host.procfs import ProcessInfo, Procfs
from tests.attribution.conftest import GPU_UUIDS
from tests.attribution.helpers import CLOCK_TICKS, ProcfsTree, cgroup_v2_systemd, write_pod_dir
from tests.fakes.kubelet import FakeKubelet, pod

UIDS = [f"aaaaaaa{i}-bbbb-cccc-dddd-eeeeeeeeeee{i}" for i in range(3)]
SHARED = [f"{GPU_UUIDS[0]}::{i}" for i in range(3)]
PODS = tuple(PodResources(f"p{i}", "ns", (ContainerResources("main", ()),)) for i in range(3))


def _info(pid: int, uid: str) -> ProcessInfo:
    return ProcessInfo(pid, True, CgroupIdentity(uid, "c" * 64), 1.0)


class _Lookups:
    """A pod directory that names each UID and counts the reads."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def __call__(self, uid: str) -> tuple[str, str] | None:
        self.reads.append(uid)
        return "ns", f"p{UIDS.index(uid)}"


def test_named_uids_resolve_without_a_read_and_as_resolve_would() -> None:
    lookups = _Lookups()
    resolver = PodResolver(lookups)
    twin = PodResolver(_Lookups())
    procs = [ProcessDevices(100 + i, frozenset({GPU_UUIDS[0]})) for i in range(3)]
    infos = {100 + i: _info(100 + i, UIDS[i]) for i in range(3)}
    first = resolver.resolve(procs, infos, {}, PODS)
    assert first == {100 + i: PodRef("ns", f"p{i}", "main") for i in range(3)}
    assert len(lookups.reads) == 3
    twin.resolve(procs, infos, {}, PODS)
    for _ in range(2):  # the same answer as a blocking resolve, and no read
        assert resolver.resolve_known(procs, infos, {}, PODS) == twin.resolve(procs, infos, {}, PODS)
    assert len(lookups.reads) == 3


def test_a_uid_that_needs_a_read_gives_none_and_leaves_the_resolver_as_it_was() -> None:
    lookups = _Lookups()
    resolver, twin = PodResolver(lookups), PodResolver(_Lookups())
    known = [ProcessDevices(100, frozenset({GPU_UUIDS[0]}))]
    infos = {100: _info(100, UIDS[0]), 101: _info(101, UIDS[1])}
    for r in (resolver, twin):
        r.resolve(known, infos, {}, PODS)
    # a new process of another pod UID, listed first: resolve_known meets it before the known one
    both = [ProcessDevices(101, frozenset({GPU_UUIDS[0]})), *known]
    assert resolver.resolve_known(both, infos, {}, PODS) is None
    assert lookups.reads == [UIDS[0]]  # not read: the caller reads it on a thread
    assert resolver.known_uids == twin.known_uids == 1
    assert resolver.resolve(both, infos, {}, PODS) == twin.resolve(both, infos, {}, PODS)


def test_an_answer_kept_between_rounds_follows_each_of_its_inputs() -> None:
    lookups = _Lookups()
    resolver = PodResolver(lookups)
    two = (PodResources("p0", "ns", (ContainerResources("main", ()), ContainerResources("side", ()))),)
    pods = two + PODS[1:]
    alloc = {GPU_UUIDS[0]: [PodRef("ns", "p0", "main")], GPU_UUIDS[1]: [PodRef("ns", "p0", "side")]}
    on = [ProcessDevices(100, frozenset({GPU_UUIDS[0]}))]
    infos = {100: _info(100, UIDS[0])}
    assert resolver.resolve(on, infos, alloc, pods)[100] == PodRef("ns", "p0", "main")
    named = resolver.resolve(on, infos, alloc, pods)[100]  # now by the name it learned
    assert resolver.resolve(on, infos, alloc, pods)[100] is named  # kept, not remade
    moved = [ProcessDevices(100, frozenset({GPU_UUIDS[1]}))]
    assert resolver.resolve(moved, infos, alloc, pods)[100] == PodRef("ns", "p0", "side")
    freed = {GPU_UUIDS[0]: [PodRef("ns", "p0", "main")], GPU_UUIDS[1]: []}  # a new kubelet answer
    assert resolver.resolve(moved, infos, freed, pods)[100] == PodRef("ns", "p0", "")
    reused = {100: _info(100, UIDS[1])}  # the PID now belongs to a process of pod p1
    assert resolver.resolve(moved, reused, freed, pods)[100] == PodRef("ns", "p1", "main")
    assert resolver.resolve(moved, reused, freed, pods[:1])[100] == PodRef("", "", "")  # p1 is gone
    host = {100: ProcessInfo(100, True, None, 1.0)}  # outside any pod
    assert resolver.resolve(moved, host, freed, pods)[100] == PodRef("", "", "")
    assert lookups.reads == [UIDS[0], UIDS[1], UIDS[1]]


def test_hostile_lookup_that_raises_still_propagates_from_resolve() -> None:
    def broken(uid: str) -> tuple[str, str] | None:
        raise OSError("pod directory unreadable")

    resolver = PodResolver(broken)
    procs = [ProcessDevices(100, frozenset({GPU_UUIDS[0]}))]
    assert resolver.resolve_known(procs, {100: _info(100, UIDS[0])}, {}, PODS) is None
    try:
        resolver.resolve(procs, {100: _info(100, UIDS[0])}, {}, PODS)
    except OSError:
        pass
    else:
        raise AssertionError("the blocking resolve must still see the lookup's own error")


class _SlowPodDir:
    """Pod directories whose reads block until released (a hung network mount)."""

    def __init__(self, pods_dir: Path) -> None:
        from exporter.attribution.poddir import PodDirectory

        self.inner = PodDirectory(str(pods_dir))
        self.release = threading.Event()
        self.release.set()
        self.reads = 0

    def lookup(self, uid: str) -> tuple[str, str] | None:
        self.reads += 1
        self.release.wait()
        return self.inner.lookup(uid)


async def test_a_hung_pod_directory_read_keeps_the_last_mapping_and_known_pods_need_no_read(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = tuple(
        pod("ns", f"p{i}", {"main": {"nvidia.com/gpu.shared": [SHARED[i]]}}) for i in range(3)
    )
    for i in range(3):
        write_pod_dir(tmp_path / "pods", UIDS[i], "ns", f"p{i}")
        procfs.add(4000 + i, cgroup_v2_systemd(UIDS[i], f"{i + 10:x}" * 32))
    settings = AttributionSettings(
        kubelet_socket_path=kubelet.socket_path,
        kubelet_refresh_interval_seconds=3600.0,
        kubelet_pods_dir=str(tmp_path / "pods"),
        procfs_path=str(procfs.root),
        procfs_timeout_seconds=0.3,
    )
    collector = AttributionCollector(
        settings, procfs=Procfs(str(procfs.root), clock_ticks_per_second=CLOCK_TICKS)
    )
    slow = _SlowPodDir(tmp_path / "pods")
    collector.use_pod_directory(slow.lookup)
    two = [GpuProcess(GPU_UUIDS[0], "0", 4000 + i) for i in range(2)]
    state = NodeState(gpus=gpus, processes=two)
    try:
        await collector.collect(state)
        named = {4000 + i: PodRef("ns", f"p{i}", "main") for i in range(2)}
        assert state.pid_pods == named and slow.reads == 2
        for _ in range(3):  # pods known: no directory read, the same answer
            await collector.collect(state)
            assert state.pid_pods == named and slow.reads == 2
        # a third pod's process, and its directory read hangs: the round ends with the last mapping
        slow.release.clear()
        state.processes = [*two, GpuProcess(GPU_UUIDS[0], "0", 4002)]
        await collector.collect(state)
        assert state.pid_pods == named and slow.reads == 3
        await collector.collect(state)  # the hung read is not stacked on
        assert state.pid_pods == named and slow.reads == 3
    finally:
        slow.release.set()
        await collector.close()
