"""The simulated world of the demo: which pod runs where, and how it reacts to restart and migrate.

The scenario's `pods` section says which pod holds which GPUs and PIDs (and, for a training job's
pods, their labels, controller and launcher environment); its `x-demo` section says how the faults
behave (see exporter/scenarios/incident-demo.yaml). Restart and migrate requests from the controller's
local backend arrive through the control endpoint and change the running simulation through
exporter.sim.interventions.

A training job is a gang: its ranks are the pods its controller owns, each rank's job and rank worked
out from the pod as the exporter does (exporter.collectors.training). When one rank's process dies
the others wait for it in the collective forever; restarting one pod does not help (the new process
cannot join the old collective), restarting the job restarts every rank and the job runs again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.attribution.ranks import RankRow, rank_rows
from exporter.collectors.base import GpuProcess, NodeState, PodRef
from exporter.collectors.training import PodMeta, RankIdentity, rank_identity
from exporter.sim import SimulatedNvml
from exporter.sim.curve import Curve
from exporter.sim.interventions import (
    delay_processes,
    end_process,
    inject_xid,
    move_process,
    restart_process,
    set_curves,
    start_process,
    swap_activity,
)
from exporter.sim.scenario_types import ProcessSpec

FIRST_NEW_PID = 40001
GIB = float(1 << 30)


class WorldError(ValueError):
    """A request names a pod, GPU or node the world does not have, or cannot be carried out."""


@dataclass
class PodState:
    """One pod of the simulated node (one container per pod in the demo)."""

    namespace: str
    name: str
    container: str
    gpus: list[int]
    pids: list[int]
    started_at: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    # the controller ownerReference (apiVersion, kind, name, uid), as on the pod object
    owner: dict[str, str] | None = None
    env: dict[str, str] = field(default_factory=dict)  # the container's launcher environment
    exited: list[ProcessSpec] = field(default_factory=list)  # processes that died, not yet restarted

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def meta(self) -> PodMeta:
        """The pod's labels and controller reference, as the exporter's pod watch keeps them."""
        return PodMeta(dict(self.labels), ({**self.owner, "controller": True},) if self.owner else ())

    def rank(self) -> RankIdentity | None:
        """The training job and rank of this pod's processes, or None when it is no rank of a job."""
        meta = self.meta()
        return rank_identity(meta.labels, meta.owner_refs, self.env)


@dataclass(frozen=True)
class RepeatXid:
    """A GPU that reports `xid` every `every_seconds` from `from_seconds` on (it is never reset)."""

    gpu: int
    xid: int
    from_seconds: float
    every_seconds: float


@dataclass(frozen=True)
class XidLoop:
    """An application fault: every process of the pod hits `xid` `after_start_seconds` after start."""

    xid: int
    from_seconds: float
    every_seconds: float
    after_start_seconds: float


# What the GPUs of a dead rank do: nothing (its process is gone, its pod still holds them)
IDLE_CURVES: Mapping[str, float] = {
    "utilization": 0.0,
    "sm_active": 0.0,
    "sm_occupancy": 0.0,
    "tensor_active": 0.0,
    "dram_active": 0.0,
    "pcie_tx_bytes_per_second": 0.0,
    "pcie_rx_bytes_per_second": 0.0,
    "nvlink_tx_bytes_per_second": 0.0,
    "nvlink_rx_bytes_per_second": 0.0,
}
# x-demo.jobs.<job>.hung keys -> the GPU curves each sets
_HUNG_KEYS: Mapping[str, tuple[str, ...]] = {
    "utilization": ("utilization",),
    "sm_active": ("sm_active", "sm_occupancy"),
    "tensor_active": ("tensor_active",),
    "pcie_bytes_per_second": ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"),
    "nvlink_bytes_per_second": ("nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"),
}


@dataclass
class GangHang:
    """A training job whose rank `rank` dies at `at_seconds`; the other ranks then hang with `hung`."""

    namespace: str
    job: str  # the controller's name
    rank: str
    at_seconds: float
    hung: dict[str, float]
    state: str = "running"  # running -> hung -> restarted
    # GPU index -> its curves before the fault, put back when the job restarts
    saved: dict[int, dict[str, Curve]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.job}"


@dataclass
class Behaviour:
    """How one pod reacts to actions."""

    restart_memory_bytes: float | None = None
    xid_loop: XidLoop | None = None
    next_xid_at: float = 0.0


@dataclass
class DemoSpec:
    """The `pods` and `x-demo` sections of a scenario, validated."""

    pods: list[PodState]
    repeat_xids: list[RepeatXid] = field(default_factory=list)
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    hangs: list[GangHang] = field(default_factory=list)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorldError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _strings(value: Any, where: str) -> dict[str, str]:
    """A mapping of string to string (labels, env); YAML numbers must be quoted, as in a pod spec."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise WorldError(f"{where}: expected a mapping of strings to strings, got {value!r}")
    return dict(value)


def _owner(value: Any, where: str) -> dict[str, str] | None:
    if value is None:
        return None
    owner = _strings(value, where)
    missing = [k for k in ("apiVersion", "kind", "name", "uid") if not owner.get(k)]
    if missing:
        raise WorldError(f"{where}: needs {', '.join(missing)}")
    return owner


def _hang(key: str, doc: Any, pods: Sequence[PodState]) -> GangHang:
    where = f"x-demo.jobs.{key}"
    namespace, _, job = key.partition("/")
    ranks = {
        r.rank
        for p in pods
        if p.namespace == namespace and p.owner and p.owner["name"] == job and (r := p.rank()) is not None
    }
    if not job or not ranks:
        raise WorldError(f"{where}: no pods of a training job {key} in `pods`")
    if not isinstance(doc, Mapping) or not isinstance(doc.get("rank_dies"), Mapping):
        raise WorldError(f"{where}: needs rank_dies: {{rank, at}}")
    dies = doc["rank_dies"]
    rank = str(dies.get("rank", ""))
    if rank not in ranks:
        raise WorldError(f"{where}.rank_dies.rank: {rank!r} is not one of the job's ranks {sorted(ranks)}")
    hung = doc.get("hung") or {}
    if not isinstance(hung, Mapping) or set(hung) - set(_HUNG_KEYS):
        raise WorldError(f"{where}.hung: expected some of {', '.join(_HUNG_KEYS)}")
    return GangHang(
        namespace=namespace,
        job=job,
        rank=rank,
        at_seconds=_number(dies.get("at"), f"{where}.rank_dies.at"),
        hung={k: _number(v, f"{where}.hung.{k}") for k, v in hung.items()},
    )


def parse_demo_spec(raw: Mapping[str, Any]) -> DemoSpec:
    """Read `pods` and `x-demo` from a parsed scenario document; raises WorldError."""
    pods: list[PodState] = []
    for i, doc in enumerate(raw.get("pods") or []):
        containers = doc.get("containers") or []
        if not doc.get("name") or not containers:
            raise WorldError(f"pods[{i}]: needs a name and at least one container")
        c = containers[0]
        pods.append(
            PodState(
                namespace=str(doc.get("namespace", "default")),
                name=str(doc["name"]),
                container=str(c.get("name", "main")),
                gpus=[int(g) for g in c.get("gpus", [])],
                pids=[int(p) for p in c.get("pids", [])],
                labels=_strings(doc.get("labels"), f"pods[{i}].labels"),
                owner=_owner(doc.get("owner"), f"pods[{i}].owner"),
                env=_strings(c.get("env"), f"pods[{i}].containers[0].env"),
            )
        )
    extra = raw.get("x-demo") or {}
    repeats = [
        RepeatXid(
            gpu=int(r["gpu"]),
            xid=int(r["xid"]),
            from_seconds=_number(r.get("from", 0), f"x-demo.repeat_xids[{i}].from"),
            every_seconds=_number(r["every_seconds"], f"x-demo.repeat_xids[{i}].every_seconds"),
        )
        for i, r in enumerate(extra.get("repeat_xids") or [])
    ]
    names = {p.name for p in pods}
    behaviours: dict[str, Behaviour] = {}
    for name, doc in (extra.get("pods") or {}).items():
        if name not in names:
            raise WorldError(f"x-demo.pods.{name}: no such pod in `pods`")
        b = Behaviour()
        if "restart_memory_bytes" in doc:
            b.restart_memory_bytes = _number(doc["restart_memory_bytes"], f"x-demo.pods.{name}")
        if "xid_loop" in doc:
            loop = doc["xid_loop"]
            b.xid_loop = XidLoop(
                xid=int(loop["xid"]),
                from_seconds=_number(loop.get("from", 0), f"x-demo.pods.{name}.xid_loop.from"),
                every_seconds=_number(loop["every_seconds"], f"x-demo.pods.{name}.xid_loop.every_seconds"),
                after_start_seconds=_number(
                    loop.get("after_start_seconds", 0), f"x-demo.pods.{name}.xid_loop.after_start_seconds"
                ),
            )
            b.next_xid_at = b.xid_loop.from_seconds
        behaviours[name] = b
    hangs = [_hang(str(key), doc, pods) for key, doc in (extra.get("jobs") or {}).items()]
    return DemoSpec(pods=pods, repeat_xids=repeats, behaviours=behaviours, hangs=hangs)


class World:
    """The simulated node as pods see it; every change is applied to the running simulation."""

    def __init__(
        self, sim: SimulatedNvml, spec: DemoSpec, log: Callable[[str], None] = lambda _line: None
    ) -> None:
        self.sim = sim
        self.node = sim.scenario.node
        self.pods = spec.pods
        self.repeats = spec.repeat_xids
        self.behaviours = spec.behaviours
        self.hangs = spec.hangs
        self.log = log
        self._pids = itertools.count(FIRST_NEW_PID)
        self._repeat_due = {i: r.from_seconds for i, r in enumerate(self.repeats)}
        self._state: NodeState | None = None
        self.actions: list[str] = []
        # scenario time at which the script started (start_script); faults wait until then
        self.offset: float | None = None

    def start_script(self) -> float:
        """Start the scripted faults now: the scenario's times count from this moment on."""
        if self.offset is not None:
            return self.offset
        offset = self.sim.clock.monotonic()
        delay_processes(self.sim, offset)
        self._repeat_due = {i: due + offset for i, due in self._repeat_due.items()}
        for b in self.behaviours.values():
            b.next_xid_at += offset
        for h in self.hangs:
            h.at_seconds += offset
        self.offset = offset
        return offset

    # ---------------------------------------------------------------- what the exporter sees

    def uuid(self, gpu: int) -> str:
        """The UUID of GPU `gpu`."""
        return self.sim.state.gpus[gpu].uuid

    def pid_pods(self) -> dict[int, PodRef]:
        """Host PID -> pod, for the processes collector."""
        return {pid: PodRef(p.namespace, p.name, p.container) for p in self.pods for pid in p.pids}

    def pod_meta(self, namespace: str, name: str) -> PodMeta | None:
        """A pod's labels and controller, for exporter.attribution.ranks (the pod watch's lookup)."""
        return next((p.meta() for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)

    def environs(self) -> dict[int, dict[str, str]]:
        """Host PID -> its launcher environment (what /proc/<pid>/environ would hold)."""
        return {pid: dict(p.env) for p in self.pods for pid in p.pids}

    def gpu_processes(self) -> list[GpuProcess]:
        """The processes the simulated NVML lists now, per GPU."""
        now = self.sim.clock.monotonic()
        return [
            GpuProcess(self.uuid(gpu.index), str(gpu.index), p.pid)
            for gpu in self.sim.state.gpus
            if not gpu.mig_enabled
            for p in gpu.processes
            if p.start_seconds <= now < p.end_seconds
        ]

    def rank_rows(self) -> list[RankRow]:
        """The rows of gpu_training_rank_info, worked out as the exporter does from the live GPU
        processes: a rank whose process died has none."""
        return rank_rows(self.gpu_processes(), self.pid_pods(), self.pod_meta, self.environs())

    def allocations(self) -> dict[str, list[PodRef]]:
        """GPU UUID -> pods holding it."""
        out: dict[str, list[PodRef]] = {}
        for p in self.pods:
            for g in p.gpus:
                out.setdefault(self.uuid(g), []).append(PodRef(p.namespace, p.name, p.container))
        return out

    def attach(self, state: NodeState) -> None:
        """Publish pods into the exporter's NodeState now and after every change."""
        self._state = state
        self._publish()

    def _publish(self) -> None:
        if self._state is not None:
            # whole-field replacement: the sampler thread reads these without a lock
            self._state.pid_pods = self.pid_pods()
            self._state.allocations = self.allocations()

    # ---------------------------------------------------------------- faults over time

    def tick(self) -> None:
        """Deliver the XIDs that are due (call about twice a second)."""
        if self.offset is None:
            return
        now = self.sim.clock.monotonic()
        for i, r in enumerate(self.repeats):
            if now >= self._repeat_due[i]:
                inject_xid(self.sim, r.gpu, r.xid)
                self._repeat_due[i] = now + r.every_seconds
        for pod in self.pods:
            b = self.behaviours.get(pod.name)
            if b is None or b.xid_loop is None or now < b.next_xid_at:
                continue
            for g in pod.gpus:
                inject_xid(self.sim, g, b.xid_loop.xid)
            b.next_xid_at = now + b.xid_loop.every_seconds
        for h in self.hangs:
            if h.state == "running" and now >= h.at_seconds:
                self._rank_dies(h)

    # ---------------------------------------------------------------- training jobs

    def job_pods(self, namespace: str, kind: str, job: str) -> list[PodState]:
        """The pods of a training job (its ranks), in rank order."""
        pods = [
            (int(r.rank or 0), p)
            for p in self.pods
            if p.namespace == namespace
            and (r := p.rank()) is not None
            and (r.training_job_kind, r.training_job) == (kind, job)
        ]
        return [p for _, p in sorted(pods, key=lambda rp: rp[0])]

    def gang_pods(self, h: GangHang) -> list[PodState]:
        """The pods the hang's job controls (every rank, the dead one too)."""
        return [p for p in self.pods if p.namespace == h.namespace and p.owner and p.owner["name"] == h.job]

    def _set(self, h: GangHang, gpu: int, values: Mapping[str, float]) -> None:
        before = set_curves(self.sim, gpu, {k: Curve.constant(v) for k, v in values.items()})
        # the first change of a GPU saves what it did before the fault
        h.saved.setdefault(gpu, {}).update({k: v for k, v in before.items() if k not in h.saved[gpu]})

    def _rank_dies(self, h: GangHang) -> None:
        """Rank h.rank's processes exit; every other rank's GPU spins in the collective, moving no data."""
        hung = {name: v for key, v in h.hung.items() for name in _HUNG_KEYS[key]}
        survivors = []
        for pod in self.gang_pods(h):
            identity = pod.rank()
            if identity is not None and identity.rank == h.rank:
                pod.exited = [*pod.exited, *(end_process(self.sim, pid) for pid in pod.pids)]
                pod.pids = []
                for g in pod.gpus:
                    self._set(h, g, IDLE_CURVES)
            else:
                survivors.append(pod)
                for g in pod.gpus:
                    self._set(h, g, hung)
        h.state = "hung"
        self._publish()
        self.log(
            f"training job {h.key}: rank {h.rank}'s process exited; "
            f"{', '.join(p.key for p in survivors)} wait for it in the collective"
        )

    def _restart_job(self, namespace: str, kind: str, job: str) -> str:
        pods = self.job_pods(namespace, kind, job)
        if not pods:
            raise WorldError(f"no training job {kind} {namespace}/{job} on {self.node}")
        for h in self.hangs:
            if (h.namespace, h.job) == (namespace, job) and h.state == "hung":
                for gpu, curves in h.saved.items():
                    set_curves(self.sim, gpu, curves)
                h.saved = {}
                h.state = "restarted"
        changes = []
        for pod in pods:
            identity = pod.rank()
            moves = self._new_processes(pod)
            changes.append(f"rank {identity.rank if identity else '?'} {', '.join(moves)}")
        self._publish()
        return (
            f"restarted training job {kind} {namespace}/{job}, all {len(pods)} ranks together: "
            + "; ".join(changes)
        )

    # ---------------------------------------------------------------- actions

    def _pod(self, namespace: str, name: str) -> PodState:
        for p in self.pods:
            if p.namespace == namespace and p.name == name:
                return p
        raise WorldError(f"no pod {namespace}/{name} on {self.node}")

    def _check_node(self, node: str) -> None:
        if node and node != self.node:
            raise WorldError(f"node {node} is not the simulated node {self.node}")

    def _bad_gpus(self) -> set[int]:
        return {r.gpu for r in self.repeats}

    def _free_gpu(self, exclude: Sequence[int] = ()) -> int:
        used = {g for p in self.pods for g in p.gpus} | self._bad_gpus() | set(exclude)
        for gpu in self.sim.state.gpus:
            if gpu.index not in used and not gpu.mig_enabled:
                return gpu.index
        raise WorldError(f"no free GPU left on {self.node} to migrate to")

    def _new_processes(self, pod: PodState) -> list[str]:
        """Replace every process of the pod by a fresh one (what a container restart does); processes
        that died start again."""
        b = self.behaviours.get(pod.name, Behaviour())
        pairs = [(pid, next(self._pids)) for pid in pod.pids]
        revived = [(like, next(self._pids)) for like in pod.exited]
        # the new PIDs are owned before they exist, so no sample shows them without their pod
        pod.pids = [*pod.pids, *(new for _, new in pairs), *(new for _, new in revived)]
        self._publish()
        for pid, new_pid in pairs:
            restart_process(self.sim, pid, new_pid, b.restart_memory_bytes)
        for like, new_pid in revived:
            start_process(self.sim, like, new_pid, b.restart_memory_bytes)
        pod.pids = [new for _, new in pairs] + [new for _, new in revived]
        pod.exited = []
        changes = [f"PID {pid} -> {new}" for pid, new in pairs]
        changes += [f"PID {like.pid} (exited) -> {new}" for like, new in revived]
        pod.started_at = self.sim.clock.monotonic()
        loop = b.xid_loop
        if loop is not None and self.offset is not None and pod.started_at >= loop.from_seconds + self.offset:
            # the bug is in the application: the new process hits it again soon after starting
            b.next_xid_at = pod.started_at + loop.after_start_seconds
        return changes

    def restart(
        self,
        kind: str,
        node: str,
        namespace: str,
        pod_name: str,
        training_job_kind: str = "",
        training_job: str = "",
    ) -> str:
        """Restart a pod's container in place (new PIDs, same GPUs), or every rank of a training job
        (kind `job`); returns what happened."""
        self._check_node(node)
        if kind == "job":
            text = self._restart_job(namespace, training_job_kind, training_job)
            self.actions.append(text)
            return text
        if kind != "pod":
            raise WorldError(f"restart needs a pod or job target, got {kind!r}")
        pod = self._pod(namespace, pod_name)
        old_pids = [*pod.pids, *(p.pid for p in pod.exited)]
        changes = self._new_processes(pod)
        self._publish()
        identity = pod.rank()
        hang = next(
            (
                h
                for h in self.hangs
                if h.state == "hung"
                and identity is not None
                and (h.namespace, h.job) == (pod.namespace, identity.training_job)
            ),
            None,
        )
        if hang is not None:
            # a new rank process cannot join the collective its peers wait in: it waits too
            hung = {name: v for key, v in hang.hung.items() for name in _HUNG_KEYS[key]}
            for g in pod.gpus:
                self._set(hang, g, hung)
        b = self.behaviours.get(pod.name)
        memory = ""
        if b is not None and b.restart_memory_bytes is not None:
            memory = f", GPU memory back to {b.restart_memory_bytes / GIB:.0f} GiB"
        text = f"restarted {pod.key} on GPU {','.join(map(str, pod.gpus))}: {', '.join(changes)}{memory}"
        if not old_pids:
            text = f"restarted {pod.key} (no GPU processes)"
        if hang is not None:
            text += f" (training job {hang.key} stays hung: its other ranks still wait in the old collective)"
        self.actions.append(text)
        return text

    def _move_pod(self, pod: PodState, from_gpu: int) -> str:
        to_gpu = self._free_gpu()
        for pid in pod.pids:
            move_process(self.sim, pid, to_gpu)
        swap_activity(self.sim, from_gpu, to_gpu)
        pod.gpus = [to_gpu if g == from_gpu else g for g in pod.gpus]
        # a migrated pod is a new pod instance: its processes start afresh on the new GPU
        self._new_processes(pod)
        return f"{pod.key} GPU {from_gpu} -> GPU {to_gpu}"

    def migrate(self, kind: str, node: str, namespace: str, pod_name: str, uuid: str) -> str:
        """Move a pod, or every pod of a GPU, to free GPUs; returns what happened."""
        self._check_node(node)
        if kind == "pod":
            pod = self._pod(namespace, pod_name)
            moves = [self._move_pod(pod, g) for g in list(pod.gpus)]
            what = f"migrated {pod.key}: " + "; ".join(moves)
        elif kind == "gpu":
            index = next((g.index for g in self.sim.state.gpus if g.uuid == uuid), None)
            if index is None:
                raise WorldError(f"no GPU {uuid} on {self.node}")
            moves = [self._move_pod(p, index) for p in self.pods if index in p.gpus]
            what = f"drained GPU {index}: " + ("; ".join(moves) if moves else "no pods on it")
            if index in self._bad_gpus():
                what += f" (GPU {index} still needs a reset)"
        else:
            raise WorldError(f"cannot migrate a {kind!r} target in a one-node demo")
        self._publish()
        self.actions.append(what)
        return what
