"""gpu_training_rank_info: one row per (GPU, rank) of a training job on this node.

A GPU process's job comes from its pod's labels and controller (podmeta.py's view of the node's pod
store) and from the launcher variables in its environment (/proc/<pid>/environ);
exporter/collectors/training.py decides. The environ is
read once per PID on a worker thread under deadlines and kept until the PID is gone: a process's
environment is fixed at exec, so re-reading it every round would only cost syscalls.

`rank_info_family(rows)` is pure, so the demo can publish the same family from its own world.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.collectors.base import GpuProcess, PodRef
from exporter.collectors.blocking import ItemReader
from exporter.collectors.series import SeriesFamily, family
from exporter.collectors.training import PodMeta, RankIdentity, rank_identity, read_environ
from gpupulse.metrics import attribution as specs

log = logging.getLogger(__name__)

DEFAULT_MAX_RANKS = 1024  # 8 GPUs x 128 processes each: far above any real node, a bound on a bug


@dataclass(frozen=True, order=True)
class RankRow:
    """One gpu_training_rank_info series (its label values, in the spec's order)."""

    uuid: str
    gpu: str
    namespace: str
    pod: str
    training_job_kind: str
    training_job: str
    rank: str
    local_rank: str
    world_size: str

    @classmethod
    def of(cls, proc: GpuProcess, pod: PodRef | None, identity: RankIdentity) -> RankRow:
        return cls(
            proc.uuid,
            proc.index,
            pod.namespace if pod else "",
            pod.pod if pod else "",
            identity.training_job_kind,
            identity.training_job,
            identity.rank,
            identity.local_rank,
            identity.world_size,
        )


def rank_rows(
    processes: Iterable[GpuProcess],
    pid_pods: Mapping[int, PodRef],
    pod_meta: Callable[[str, str], PodMeta | None],
    environs: Mapping[int, Mapping[str, str]],
    wait_for_pods: bool = False,
) -> list[RankRow]:
    """The rank rows of these GPU processes, sorted and without duplicates (a rank holding several
    GPUs has one row per GPU; two processes of one rank on one GPU share a row).

    wait_for_pods: the pod watch is healthy, so a pod it has not seen yet is only late (the kubelet
    can list a pod before the watch delivers it): its processes get no row this round rather than an
    environ-only identity (`torchrun`) that would flip to the owner's a round later, a second job.
    """
    rows: set[RankRow] = set()
    for proc in processes:
        pod = pid_pods.get(proc.pid)
        meta = pod_meta(pod.namespace, pod.pod) if pod is not None and pod.pod else None
        if meta is None and pod is not None and pod.pod and wait_for_pods:
            continue
        labels = meta.labels if meta is not None else {}
        owners = meta.owner_refs if meta is not None else ()
        identity = rank_identity(labels, owners, environs.get(proc.pid, {}))
        if identity is not None:
            rows.add(RankRow.of(proc, pod, identity))
    return sorted(rows)


def cap_rows(rows: Sequence[RankRow], kept_before: set[RankRow], max_rows: int) -> list[RankRow]:
    """At most max_rows rows; rows exported last round keep their place, so newcomers cannot make
    existing series flap, and the rest are taken in their stable order."""
    ordered = sorted(rows, key=lambda r: (r not in kept_before, r))
    return sorted(ordered[: max(max_rows, 0)])


def rank_info_family(rows: Iterable[RankRow]) -> SeriesFamily:
    """gpu_training_rank_info with one series of value 1 per row."""
    info = family(specs.GPU_TRAINING_RANK_INFO)
    for row in rows:
        info.add_metric(
            [
                row.uuid,
                row.gpu,
                row.namespace,
                row.pod,
                row.training_job_kind,
                row.training_job,
                row.rank,
                row.local_rank,
                row.world_size,
            ],
            1.0,
        )
    return info


class EnvironCache:
    """Launcher variables of each GPU process, read once per PID off the event loop."""

    def __init__(self, procfs_path: str) -> None:
        self._proc = Path(procfs_path)
        self._reader: ItemReader[int, dict[str, str]] = ItemReader("attribution-environ")
        self._env: dict[int, dict[str, str]] = {}

    def __len__(self) -> int:
        return len(self._env)

    def covers(self, pids: Collection[int]) -> bool:
        """Every one of these PIDs read already: read() would read nothing."""
        return all(pid in self._env for pid in pids)

    async def read(
        self, pids: Iterable[int], timeout_seconds: float, item_timeout_seconds: float
    ) -> dict[int, dict[str, str]]:
        """PID -> variables for these PIDs; entries of other PIDs are dropped (they are gone). A PID
        whose read is late or hung has none this round and is tried again next round; one that cannot
        be read (permission denied, exited) has none for good."""
        wanted = set(pids)
        self._env = {pid: env for pid, env in self._env.items() if pid in wanted}
        todo = sorted(wanted - self._env.keys())
        if todo:
            got = await self._reader.read(
                todo, lambda pid: read_environ(self._proc, pid), timeout_seconds, item_timeout_seconds
            )
            self._env.update(got.values)
            for pid in got.errors:
                self._env[pid] = {}
        return dict(self._env)

    def close(self) -> None:
        self._reader.close()
