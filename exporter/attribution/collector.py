"""The `attribution` collector: GPU -> pod from pod-resources, process -> pod and host CPU from procfs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

from prometheus_client.core import Metric

from exporter.attribution.devices import (
    Allocation,
    ResolvedAllocation,
    allocation_map,
    allocations_from_pods,
    resolve,
    resource_matcher,
)
from exporter.attribution.kubelet import (
    DEFAULT_SOCKET_PATH,
    PodResourcesClient,
    PodResourcesTracker,
    PodResourcesView,
    TrackerSettings,
)
from exporter.attribution.poddir import DEFAULT_PODS_DIR, PodDirectory
from exporter.attribution.podmeta import PodMetas, pod_metas
from exporter.attribution.podresources_proto import PodResources
from exporter.attribution.ranks import (
    DEFAULT_MAX_RANKS,
    EnvironCache,
    RankRow,
    cap_rows,
    rank_info_family,
    rank_rows,
)
from exporter.attribution.resolve import PodResolver, ProcessDevices
from exporter.attribution.slices import DEFAULT_DRIVERS, ResourceSliceSource, SliceDevice, SliceSettings
from exporter.collectors.base import GpuProcess, GpuRef, NodeState, PodRef
from exporter.collectors.blocking import ItemReader
from exporter.collectors.flags import add_procfs_argument, collector_enabled, csv_list
from exporter.collectors.plugin import PluginContext
from exporter.collectors.series import Series, SeriesFamily, family, table
from exporter.collectors.training import PodMeta
from exporter.errors import PartialCollectorError
from exporter.host.procfs import DEFAULT_PROCFS, STATE_NAMES, ProcessInfo, Procfs
from exporter.kube import flags as kube_flags
from exporter.kube.pods import PodStore, PodView
from gpupulse.clock import Clock, SystemClock
from gpupulse.durations import duration_flag
from gpupulse.metrics import attribution as specs

NAME = "attribution"
AUTO = "auto"
log = logging.getLogger(__name__)


def resolve_socket(value: str, environ: Mapping[str, str], exists: Callable[[str], bool]) -> str:
    """The socket to use: `auto` means the kubelet default, off on hosts that are not Kubernetes nodes.

    Inside a pod (KUBERNETES_SERVICE_HOST set) a missing socket is an error to report: it is the
    missing hostPath mount behind most "no pod labels" reports against dcgm-exporter.
    """
    if value != AUTO:
        return value
    if exists(DEFAULT_SOCKET_PATH) or "KUBERNETES_SERVICE_HOST" in environ:
        return DEFAULT_SOCKET_PATH
    log.info(
        "no kubelet pod-resources socket at %s and not in a pod: GPU -> pod attribution off",
        DEFAULT_SOCKET_PATH,
    )
    return ""


@dataclass(frozen=True)
class AttributionSettings:
    interval_seconds: float = 5.0
    kubelet_socket_path: str = DEFAULT_SOCKET_PATH  # "" turns GPU -> pod off (see resolve_socket)
    kubelet_refresh_interval_seconds: float = 10.0
    kubelet_timeout_seconds: float = 5.0
    kubelet_max_stale_seconds: float = 60.0
    # How long the first round waits for the first kubelet answer, so it starts with allocations.
    kubelet_first_wait_seconds: float = 1.0
    kubelet_pods_dir: str = DEFAULT_PODS_DIR  # "" turns UID -> name hints off
    extra_resource_names: tuple[str, ...] = ()
    procfs_path: str = DEFAULT_PROCFS
    # One round's /proc reads together; the collector's deadline (round_deadline_seconds) is above.
    procfs_timeout_seconds: float = 1.0
    # One PID's reads; a PID whose read takes longer is set aside until the read returns.
    procfs_item_timeout_seconds: float = 0.2
    pod_lookup_timeout_seconds: float = 0.5  # kubelet pod directories read for UID -> name hints
    max_processes: int = 1000
    # DRA: claim devices are named through this node's ResourceSlices (a watch the collector is
    # handed, where and how --kube.* say); without it claims show `driver/pool/device` ids, no uuid.
    dra_drivers: tuple[str, ...] = DEFAULT_DRIVERS
    # Training jobs: a process's job is named from its pod's labels and owner, a view of the node's
    # shared pod store; without it the job comes from the process environment alone.
    max_ranks: int = DEFAULT_MAX_RANKS  # cap on gpu_training_rank_info series

    @property
    def round_deadline_seconds(self) -> float:
        """Above every deadline inside a round: first kubelet answer, /proc reads, pod lookups."""
        first = self.kubelet_first_wait_seconds
        return first + self.procfs_timeout_seconds + self.pod_lookup_timeout_seconds + 0.5


_Allocations = tuple[tuple[Allocation, ...], tuple[ResolvedAllocation, ...], dict[str, tuple[PodRef, ...]]]
# (kubelet answer, slice index, GPUs) -> what they gave
_AllocationMemo = tuple[
    tuple[PodResources, ...], dict[tuple[str, str, str], SliceDevice] | None, tuple[GpuRef, ...], _Allocations
]


class _RanksMemo(NamedTuple):
    """A round's rank rows and what they were made of (kept while the next round's inputs are the same)."""

    processes: tuple[GpuProcess, ...]
    pid_pods: Mapping[int, PodRef]
    environs: dict[int, Mapping[str, str]]
    metas: Mapping[tuple[str, str], PodMeta] | None
    wait: bool
    kept: list[RankRow]
    dropped: int  # rows over the cap


class _HostSeries(NamedTuple):
    """The host series of one GPU process, kept while it runs on the same GPU index in the same pod."""

    gpu_index: str
    pod: PodRef
    cpu: Series
    io_read: Series
    io_write: Series
    states: tuple[Series, ...]  # one per STATE_NAMES


# (GPU processes, PID -> pod map, PIDs in row order, their host series) of a round that gave every process
_HostMemo = tuple[tuple[GpuProcess, ...], Mapping[int, PodRef], list[int], list[_HostSeries]]


@dataclass(frozen=True)
class _ProcfsRound:
    infos: dict[int, ProcessInfo]
    pid_pods: dict[int, PodRef]


class AttributionCollector:
    """Publishes NodeState.allocations and .pid_pods; exports allocation rows and host CPU per process."""

    name = NAME

    def __init__(
        self,
        settings: AttributionSettings,
        clock: Clock | None = None,
        procfs: Procfs | None = None,
        pods: PodStore | None = None,
        slices: ResourceSliceSource | None = None,
    ) -> None:
        self.settings = settings
        self.interval_seconds: float | None = settings.interval_seconds
        self.deadline_seconds = settings.round_deadline_seconds
        self._matcher = resource_matcher(settings.extra_resource_names)
        self._procfs = procfs or Procfs(settings.procfs_path)
        directory = PodDirectory(settings.kubelet_pods_dir) if settings.kubelet_pods_dir else None
        self._resolver = PodResolver(directory.lookup if directory is not None else None)
        self._tracker: PodResourcesTracker | None = None
        if settings.kubelet_socket_path:
            client = PodResourcesClient(settings.kubelet_socket_path, settings.kubelet_timeout_seconds)
            tracker_settings = TrackerSettings(
                refresh_interval_seconds=settings.kubelet_refresh_interval_seconds,
                max_stale_seconds=settings.kubelet_max_stale_seconds,
            )
            self._tracker = PodResourcesTracker(client, tracker_settings, clock or SystemClock())
        self._pods: PodView[PodMetas] | None = None
        if pods is not None:
            self.use_pods(pods)
        self._environ = EnvironCache(settings.procfs_path)
        self._ranks_kept: set[RankRow] = set()
        self._ranks_memo: _RanksMemo | None = None
        self._info_rows: tuple[tuple[ResolvedAllocation, ...], list[Series]] | None = None
        self._ranks_capped = False
        self._slices = slices
        self._exported: set[tuple[str, int]] = set()
        self._dropped_total = 0
        self._reader: ItemReader[int, ProcessInfo | None] = ItemReader("attribution-procfs")
        self._resolver_busy = False
        self._last_pid_pods: dict[int, PodRef] = {}
        self._memo: _AllocationMemo | None = None
        self._host_series: dict[tuple[str, int], _HostSeries] = {}
        # (processes, PID -> pod map, PIDs in row order, rows) of the last round in which every GPU
        # process had its host series: while both are the same, a round only puts in new values
        self._host_memo: _HostMemo | None = None
        self._wanted: tuple[tuple[GpuProcess, ...], list[ProcessDevices], list[int]] | None = None

    @property
    def known_pod_uids(self) -> int:
        """Pod UIDs the resolver holds a name for (bounded by pods with processes on GPUs)."""
        return self._resolver.known_uids

    @property
    def slices(self) -> ResourceSliceSource | None:
        """The ResourceSlice watch (None when DRA name resolution is off)."""
        return self._slices

    def use_slices(self, source: ResourceSliceSource) -> None:
        """Replace the ResourceSlice source (tests point it at their API server)."""
        self._slices = source

    @property
    def pods(self) -> PodView[PodMetas] | None:
        """This collector's view of the node's pod store: each pod's labels and owner (None: off)."""
        return self._pods

    def use_pods(self, store: PodStore) -> None:
        """Read pod metadata from this pod store (the exporter's shared one; tests point at theirs)."""
        self._pods = store.view("attribution", pod_metas)

    def use_pod_directory(self, lookup: Callable[[str], tuple[str, str] | None]) -> None:
        """Replace the pod UID -> name hints (tests point it at a slow directory)."""
        self._resolver = PodResolver(lookup)

    def use_environ(self, cache: EnvironCache) -> None:
        """Replace the environ reader (tests point it at their fake /proc)."""
        self._environ = cache

    @property
    def tracker(self) -> PodResourcesTracker | None:
        """The background pod-resources refresher (None when the kubelet part is off)."""
        return self._tracker

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Publish allocations and pid_pods into `state`; fail the round while the kubelet is unreachable."""
        if self._starting():
            view, index, _ = await asyncio.gather(
                self._kubelet_view(), self._slice_index(), self._first_sync(self._pods)
            )
        else:  # what those give once started, without a task each
            view = self._tracker.view() if self._tracker is not None else _NO_VIEW
            index = self._slices.index() if self._slices is not None else None
        flat, rows, allocations = self._allocations(view.pods, index, tuple(state.gpus))
        state.allocations = allocations
        processes = tuple(state.processes)
        s = self.settings
        pids = {p.pid for p in processes}
        if self._environ.covers(pids):  # no environ to read: the /proc round alone, no task for it
            environs = await self._environ.read(pids, s.procfs_timeout_seconds, s.procfs_item_timeout_seconds)
            procfs_round = await self._procfs_round(processes, allocations, view)
        else:
            procfs_round, environs = await asyncio.gather(
                self._procfs_round(processes, allocations, view),
                self._environ.read(pids, s.procfs_timeout_seconds, s.procfs_item_timeout_seconds),
            )
        state.pid_pods = procfs_round.pid_pods

        info = self._allocation_info(rows)
        host = self._host_families(processes, procfs_round)
        ranks = rank_info_family(self._rank_rows(processes, procfs_round.pid_pods, environs))
        dropped = family(specs.SERIES_DROPPED_TOTAL)
        dropped.add_metric([NAME], float(self._dropped_total))
        families: list[Metric] = [f for f in (info, *host, ranks, dropped) if len(f)]
        if view.error:
            # NodeState keeps the last good mapping until it goes stale; the families stay true too.
            raise PartialCollectorError(f"pod-resources: {view.error}", families)
        unnamed = sum(
            1 for a in flat if a.resource in self.settings.dra_drivers and a.device_id.count("/") == 2
        )
        if unnamed and (self._slices is None or self._slices.error):
            why = "DRA name resolution is off" if self._slices is None else self._slices.error
            raise PartialCollectorError(f"{unnamed} DRA claim devices without a uuid: {why}", families)
        return families

    def _allocation_info(self, rows: tuple[ResolvedAllocation, ...]) -> SeriesFamily:
        """gpu_allocation_info: one series of value 1 per allocation row, the rows' series kept while
        the allocations are the same object (they are remade only when an input changed)."""
        info = family(specs.GPU_ALLOCATION_INFO)
        memo = self._info_rows
        if memo is None or memo[0] is not rows:
            info_table = table(specs.GPU_ALLOCATION_INFO)
            series = [
                info_table.series(
                    r.uuid, r.gpu, r.mig_uuid, r.pod.namespace, r.pod.pod, r.pod.container, r.resource
                )
                for r in rows
            ]
            memo = self._info_rows = (rows, series)
        info.rows = list(memo[1])
        info.values = [1.0] * len(memo[1])
        return info

    def _allocations(
        self,
        pods: tuple[PodResources, ...],
        index: dict[tuple[str, str, str], SliceDevice] | None,
        gpus: tuple[GpuRef, ...],
    ) -> _Allocations:
        """Allocations of the kubelet's answer, remade only when an input changed: the answer is
        refreshed every 10 s, the slice index on a watch event, while rounds come every 5 s."""
        memo = self._memo
        # the same objects: the tracker and the slice watch replace theirs whole on every change
        if memo is not None and memo[0] is pods and memo[1] is index and memo[2] == gpus:
            return memo[3]
        flat = allocations_from_pods(pods, self._matcher, index, self.settings.dra_drivers)
        rows = resolve(flat, gpus)
        made = (flat, rows, allocation_map(rows))
        self._memo = (pods, index, gpus, made)
        return made

    def _starting(self) -> bool:
        """Some source is still to give its first answer (the first rounds wait for it)."""
        tracker = self._tracker
        if tracker is not None and tracker.refresh_count == 0:
            return True
        return any(
            source is not None and source.stats.lists == 0 and source.stats.failures == 0
            for source in (self._slices, self._pods)
        )

    async def _first_sync(self, source: ResourceSliceSource | PodView[PodMetas] | None) -> None:
        """Start a watch; the first round waits (kubelet_first_wait_seconds at most) for its LIST."""
        if source is None or source.stats.lists > 0 or source.stats.failures > 0:
            return
        source.start()
        with contextlib.suppress(TimeoutError):
            await source.wait_until(
                lambda: source.stats.lists > 0 or source.stats.failures > 0,
                self.settings.kubelet_first_wait_seconds,
            )

    async def _slice_index(self) -> dict[tuple[str, str, str], SliceDevice] | None:
        if self._slices is None:
            return None
        await self._first_sync(self._slices)
        return self._slices.index()

    def _rank_rows(
        self,
        processes: Sequence[GpuProcess],
        pid_pods: Mapping[int, PodRef],
        environs: Mapping[int, Mapping[str, str]],
    ) -> list[RankRow]:
        """The rank rows of this round, under the max_ranks cap (the rest counted as dropped)."""
        pods = self._pods
        metas = pods.value if pods is not None else None
        lookup: Callable[[str, str], PodMeta | None] = _lookup(metas) if metas is not None else _no_meta
        # a watch that never listed and failed (403, unreachable) names ranks from the environ alone;
        # one that listed (or is still trying) is waited for: what it lacks now is late, not absent
        wait = pods is not None and pods.started and (pods.stats.lists > 0 or pods.stats.failures == 0)
        memo = self._ranks_memo
        # the same inputs as last round (pid_pods and the pod metadata are replaced whole on change)
        if (
            memo is not None
            and memo.pid_pods is pid_pods
            and memo.metas is metas
            and memo.wait == wait
            and memo.processes == processes
            and memo.environs == environs
        ):
            self._dropped_total += memo.dropped
            return memo.kept
        rows = rank_rows(processes, pid_pods, lookup, environs, wait_for_pods=wait)
        kept = cap_rows(rows, self._ranks_kept, self.settings.max_ranks)
        self._dropped_total += len(rows) - len(kept)
        capped = len(kept) < len(rows)
        if capped and not self._ranks_capped:
            log.warning(
                "%d training ranks on this node, over --attribution.max-ranks=%d: the rest are counted "
                "in gpupulse_series_dropped_total",
                len(rows),
                self.settings.max_ranks,
            )
        self._ranks_capped = capped
        self._ranks_kept = set(kept)
        self._ranks_memo = _RanksMemo(
            tuple(processes), pid_pods, dict(environs), metas, wait, kept, len(rows) - len(kept)
        )
        return kept

    async def _kubelet_view(self) -> PodResourcesView:
        tracker = self._tracker
        if tracker is None:
            return _NO_VIEW
        if tracker.refresh_count == 0:
            tracker.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tracker.wait_refreshed(0), self.settings.kubelet_first_wait_seconds)
        return tracker.view()

    async def _procfs_round(
        self,
        processes: tuple[GpuProcess, ...],
        allocations: Mapping[str, Sequence[PodRef]],
        view: PodResourcesView,
    ) -> _ProcfsRound:
        """Cgroup and CPU of every GPU process, one /proc read per PID on a worker thread.

        A read that hangs (a process stuck in the kernel, a FUSE-mounted /proc) costs only its PID:
        it is set aside, its CPU series is absent while it hangs, and its pod stays the one it had (a
        PID's pod does not change). The other PIDs are read in the same round.
        """
        wanted, keys = self._wanted_of(processes)
        procfs = self._procfs

        def read(pid: int) -> ProcessInfo | None:
            if pid == _RETAIN:  # after the reads, on their thread: descriptors of gone PIDs closed
                procfs.retain(keys[:-1])
                return None
            return procfs.process(pid)

        s = self.settings
        got = await self._reader.read(keys, read, s.procfs_timeout_seconds, s.procfs_item_timeout_seconds)
        got.unread.discard(_RETAIN)
        infos = {pid: info for pid, info in got.values.items() if info is not None}
        pid_pods = await self._resolve(wanted, infos, allocations, view)
        last = self._last_pid_pods
        for pid, ref in pid_pods.items():
            # the last round's object where the pod is the same: the processes collector, every
            # tick, tells a changed pod by identity first
            old = last.get(pid)
            if old is not None and old is not ref and old == ref:
                pid_pods[pid] = old
        for pid in got.unread:
            if pid in last:
                pid_pods[pid] = last[pid]
        if pid_pods == last:
            # the same map object while nothing changed: the processes collector reuses its rows
            # while NodeState.pid_pods is the map it made them from (a new one costs it every row)
            pid_pods = last
        self._last_pid_pods = pid_pods
        return _ProcfsRound(infos, pid_pods)

    def _wanted_of(self, processes: tuple[GpuProcess, ...]) -> tuple[list[ProcessDevices], list[int]]:
        """Each GPU process's devices, and the round's read keys (its PIDs in order, then _RETAIN);
        the last round's while the listing holds the same processes (no sets made per process)."""
        memo = self._wanted
        if memo is not None and memo[0] == processes:
            return memo[1], memo[2]
        devices: dict[int, set[str]] = {}
        for proc in processes:
            devices.setdefault(proc.pid, set()).add(proc.mig_uuid or proc.uuid)
        wanted = [ProcessDevices(pid, frozenset(keys)) for pid, keys in devices.items()]
        keys = [*sorted(devices), _RETAIN]
        self._wanted = (processes, wanted, keys)
        return wanted, keys

    async def _resolve(
        self,
        wanted: list[ProcessDevices],
        infos: dict[int, ProcessInfo],
        allocations: Mapping[str, Sequence[PodRef]],
        view: PodResourcesView,
    ) -> dict[int, PodRef]:
        """PID -> pod; reads kubelet pod directories for UID hints, so on a thread under a deadline."""
        if self._resolver_busy:
            # A timed-out lookup is still running in its thread; never stack a second one on it.
            return {p.pid: self._last_pid_pods[p.pid] for p in wanted if p.pid in self._last_pid_pods}
        # Every pod UID named already (every round once the pods are known): no file to read, so here,
        # without a thread hop (one costs 40-100 us of CPU on a loaded node).
        known = self._resolver.resolve_known(wanted, infos, allocations, view.pods)
        if known is not None:
            return known

        def work() -> dict[int, PodRef]:
            try:
                return self._resolver.resolve(wanted, infos, allocations, view.pods)
            finally:
                self._resolver_busy = False

        self._resolver_busy = True
        try:
            return await asyncio.wait_for(asyncio.to_thread(work), self.settings.procfs_timeout_seconds)
        except TimeoutError:
            log.warning(
                "pod lookups took over %s s; keeping the last PID -> pod mapping",
                self.settings.procfs_timeout_seconds,
            )
            return {p.pid: self._last_pid_pods[p.pid] for p in wanted if p.pid in self._last_pid_pods}

    def _host_families(
        self, processes: Sequence[GpuProcess], procfs_round: _ProcfsRound
    ) -> tuple[SeriesFamily, ...]:
        """Host CPU, I/O bytes and scheduler state of each GPU process, under one cap (per process)."""
        infos = procfs_round.infos
        memo = self._host_memo
        if memo is not None and memo[1] is procfs_round.pid_pods and memo[0] == processes:
            again = [infos.get(pid) for pid in memo[2]]
            # every process read again: the same rows as last round, in the same order, new values
            if None not in again and all([i.cpu_seconds is not None for i in again if i is not None]):
                return _host_values(memo[3], cast("list[ProcessInfo]", again))
        self._host_memo = None
        series: dict[tuple[str, int], tuple[str, ProcessInfo]] = {}
        for proc in processes:
            info = infos.get(proc.pid)
            if info is None or info.cpu_seconds is None:
                continue  # exited between NVML's sample and ours
            series[(proc.uuid, proc.pid)] = (proc.index, info)
        # Series already exported keep their place under the cap, so a crowd of newcomers cannot
        # make existing counters flap; the rest are taken in a stable (uuid, pid) order.
        exported = self._exported
        keys = sorted(series, key=lambda k: (k not in exported, k))
        kept = keys[: self.settings.max_processes]
        self._dropped_total += len(keys) - len(kept)
        self._exported = set(kept)
        known, self._host_series = self._host_series, {}  # processes gone since last round are dropped
        pid_pods = procfs_round.pid_pods
        rows: list[tuple[_HostSeries, ProcessInfo]] = []
        for key in kept:
            index, info = series[key]
            pod = pid_pods.get(key[1], _NO_POD)
            got = known.get(key)
            if got is None or got.gpu_index != index or (got.pod is not pod and got.pod != pod):
                got = _host_series(key, index, pod)
            self._host_series[key] = got
            rows.append((got, info))
        if len(kept) == len(processes):  # every process has its rows: the next rounds may reuse them
            self._host_memo = (
                tuple(processes),
                pid_pods,
                [key[1] for key in kept],
                [h for h, _ in rows],
            )
        return _host_values([h for h, _ in rows], [i for _, i in rows])

    async def close(self) -> None:
        """Stop the pod-resources refresher and the procfs worker."""
        if self._tracker is not None:
            await self._tracker.close()
        if self._slices is not None:
            await self._slices.close()
        # the pod store is the exporter's, shared: it closes it after every plug-in
        self._reader.close()
        self._environ.close()
        self._procfs.close()


_NO_POD = PodRef("", "", "")
_NO_VIEW = PodResourcesView(pods=(), error="", has_data=False)  # the kubelet part is off
_RETAIN = -1  # the last item of a round's /proc reads: close the kept descriptors of gone PIDs
# gpu_process_state's values for a process in each state, in STATE_NAMES order
_STATE_VALUES = {name: tuple(1.0 if other == name else 0.0 for other in STATE_NAMES) for name in STATE_NAMES}
_NO_STATE = (0.0,) * len(STATE_NAMES)


def _host_values(rows: list[_HostSeries], infos: list[ProcessInfo]) -> tuple[SeriesFamily, ...]:
    """The host families of one round: each process's rows with what was read of it this round."""
    cpu = family(specs.GPU_PROCESS_HOST_CPU_SECONDS_TOTAL)
    io_read = family(specs.GPU_PROCESS_IO_READ_BYTES_TOTAL)
    io_write = family(specs.GPU_PROCESS_IO_WRITE_BYTES_TOTAL)
    states = family(specs.GPU_PROCESS_STATE)
    both = list(zip(rows, infos, strict=True))
    # Rows and values filled a list at a time: ten series per process, every round.
    cpu.rows = [h.cpu for h in rows]
    cpu.values = [cast(float, i.cpu_seconds) for i in infos]
    io_read.rows = [h.io_read for h, i in both if i.io_read_bytes is not None]
    io_read.values = [float(i.io_read_bytes) for i in infos if i.io_read_bytes is not None]
    io_write.rows = [h.io_write for h, i in both if i.io_write_bytes is not None]
    io_write.values = [float(i.io_write_bytes) for i in infos if i.io_write_bytes is not None]
    # every state 0 or 1 (kube-state-metrics' phase style): min_over_time reads "all along"
    states.rows = [s for h, i in both if i.state is not None for s in h.states]
    states.values = [v for i in infos if i.state is not None for v in _STATE_VALUES.get(i.state, _NO_STATE)]
    return cpu, io_read, io_write, states


def _host_series(key: tuple[str, int], index: str, pod: PodRef) -> _HostSeries:
    labels = (key[0], index, str(key[1]), pod.namespace, pod.pod, pod.container)
    states = table(specs.GPU_PROCESS_STATE)
    return _HostSeries(
        index,
        pod,
        table(specs.GPU_PROCESS_HOST_CPU_SECONDS_TOTAL).series(*labels),
        table(specs.GPU_PROCESS_IO_READ_BYTES_TOTAL).series(*labels),
        table(specs.GPU_PROCESS_IO_WRITE_BYTES_TOTAL).series(*labels),
        tuple(states.series(*labels, name) for name in STATE_NAMES),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the attribution flags on exporter-core's parser."""
    d = AttributionSettings()
    group = parser.add_argument_group("attribution (GPU and process -> pod)")
    group.add_argument(
        "--attribution.interval",
        dest="attribution_interval",
        type=duration_flag,
        default=d.interval_seconds,
        help="seconds between attribution rounds (default: %(default)s)",
    )
    group.add_argument(
        "--attribution.kubelet-socket",
        dest="attribution_kubelet_socket",
        default=AUTO,
        help=f"kubelet pod-resources unix socket; empty turns GPU->pod off; `auto` uses "
        f"{DEFAULT_SOCKET_PATH}, and only where it exists unless we run in a pod (default: %(default)s)",
    )
    group.add_argument(
        "--attribution.kubelet-refresh-interval",
        dest="attribution_kubelet_refresh_interval",
        type=duration_flag,
        default=d.kubelet_refresh_interval_seconds,
        help="seconds between pod-resources List calls, in the background (default: %(default)s)",
    )
    group.add_argument(
        "--attribution.kubelet-timeout",
        dest="attribution_kubelet_timeout",
        type=duration_flag,
        default=d.kubelet_timeout_seconds,
        help="List call timeout in seconds (default: %(default)s)",
    )
    group.add_argument(
        "--attribution.kubelet-max-stale",
        dest="attribution_kubelet_max_stale",
        type=duration_flag,
        default=d.kubelet_max_stale_seconds,
        help="seconds the last good pod-resources answer is kept while the kubelet fails "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--attribution.kubelet-pods-dir",
        dest="attribution_kubelet_pods_dir",
        default=d.kubelet_pods_dir,
        help="kubelet pod directories for pod UID -> name hints; empty turns them off (default: %(default)s)",
    )
    group.add_argument(
        "--attribution.resource-names",
        dest="attribution_resource_names",
        type=csv_list,
        default=[],
        help="extra GPU resource names or globs, comma-separated "
        "(nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-* are always on)",
    )
    group.add_argument(
        "--attribution.max-processes",
        dest="attribution_max_processes",
        type=int,
        default=d.max_processes,
        help="cap on per-process host CPU series; the rest are counted in "
        "gpupulse_series_dropped_total (default: %(default)s)",
    )
    group.add_argument(
        "--attribution.slice-watch",
        dest="attribution_slice_watch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="watch this node's ResourceSlices (the node of --kube.node-name) to name DRA claim "
        "devices by UUID; needs resourceslices list/watch (default: on)",
    )
    group.add_argument(
        "--attribution.dra-drivers",
        dest="attribution_dra_drivers",
        type=csv_list,
        default=list(DEFAULT_DRIVERS),
        help=f"DRA drivers whose devices are GPUs, comma-separated (default: {','.join(DEFAULT_DRIVERS)})",
    )
    group.add_argument(
        "--attribution.pod-watch",
        dest="attribution_pod_watch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read this node's pods (the shared pod watch of --kube.node-name) for the labels and "
        "owners that name a GPU process's training job; needs pods list/watch; without it the job "
        "comes from the process environment alone (default: on)",
    )
    # --attribution.node-name, --attribution.dra-node-name, --attribution.kube-api-url,
    # --attribution.kube-token-file: now --kube.*
    kube_flags.add_aliases(parser, NAME)
    group.add_argument(
        "--attribution.max-ranks",
        dest="attribution_max_ranks",
        type=int,
        default=d.max_ranks,
        help="cap on gpu_training_rank_info series; the rest are counted in "
        "gpupulse_series_dropped_total (default: %(default)s)",
    )
    add_procfs_argument(parser)


def _no_meta(namespace: str, name: str) -> PodMeta | None:
    return None


def _lookup(metas: PodMetas) -> Callable[[str, str], PodMeta | None]:
    return lambda namespace, name: metas.get((namespace, name))


def from_args(args: argparse.Namespace, ctx: PluginContext) -> AttributionCollector | None:
    """Build the collector from parsed flags and the shared context; None when
    --no-collector.attribution was given."""
    if not collector_enabled(args, NAME):
        return None
    # both watches need the API server: only where the kubelet part is on too
    kubelet = args.attribution_kubelet_socket != ""
    kube = ctx.kube.settings
    slices = None
    if kube is not None and kubelet and args.attribution_slice_watch:
        if not kube_flags.turned_off(args, "--attribution.dra-node-name"):
            slice_settings = SliceSettings(**vars(kube), drivers=tuple(args.attribution_dra_drivers))
            slices = ResourceSliceSource(slice_settings)
    pods = None
    if kubelet and args.attribution_pod_watch and not kube_flags.turned_off(args, "--attribution.node-name"):
        pods = ctx.kube.pods()
    settings = AttributionSettings(
        interval_seconds=args.attribution_interval,
        kubelet_socket_path=resolve_socket(args.attribution_kubelet_socket, os.environ, os.path.exists),
        kubelet_refresh_interval_seconds=args.attribution_kubelet_refresh_interval,
        kubelet_timeout_seconds=args.attribution_kubelet_timeout,
        kubelet_max_stale_seconds=args.attribution_kubelet_max_stale,
        kubelet_pods_dir=args.attribution_kubelet_pods_dir,
        extra_resource_names=tuple(args.attribution_resource_names),
        procfs_path=args.path_procfs,
        max_processes=args.attribution_max_processes,
        dra_drivers=tuple(args.attribution_dra_drivers),
        max_ranks=args.attribution_max_ranks,
    )
    return AttributionCollector(settings, pods=pods, slices=slices)
