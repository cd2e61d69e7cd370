"""The simulated world of the demo: which pod runs where, and how it reacts to restart and migrate.

The scenario's `pods` section says which pod holds which GPUs and PIDs; its `x-demo` section says
how the faults behave (see exporter/scenarios/incident-demo.yaml). Restart and migrate requests from
the controller's local backend arrive through the control endpoint and change the running
simulation through exporter.sim.interventions.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.collectors.base import NodeState, PodRef
from exporter.sim import SimulatedNvml
from exporter.sim.interventions import (
    delay_processes,
    inject_xid,
    move_process,
    restart_process,
    swap_activity,
)

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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


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


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorldError(f"{where}: expected a number, got {value!r}")
    return float(value)


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
    return DemoSpec(pods=pods, repeat_xids=repeats, behaviours=behaviours)


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
        self.offset = offset
        return offset

    # ---------------------------------------------------------------- what the exporter sees

    def uuid(self, gpu: int) -> str:
        """The UUID of GPU `gpu`."""
        return self.sim.state.gpus[gpu].uuid

    def pid_pods(self) -> dict[int, PodRef]:
        """Host PID -> pod, for the processes collector."""
        return {pid: PodRef(p.namespace, p.name, p.container) for p in self.pods for pid in p.pids}

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
        """Replace every process of the pod by a fresh one (what a container restart does)."""
        b = self.behaviours.get(pod.name, Behaviour())
        pairs = [(pid, next(self._pids)) for pid in pod.pids]
        # the new PIDs are owned before they exist, so no sample shows them without their pod
        pod.pids = [*pod.pids, *(new for _, new in pairs)]
        self._publish()
        for pid, new_pid in pairs:
            restart_process(self.sim, pid, new_pid, b.restart_memory_bytes)
        pod.pids = [new for _, new in pairs]
        changes = [f"PID {pid} -> {new}" for pid, new in pairs]
        pod.started_at = self.sim.clock.monotonic()
        loop = b.xid_loop
        if loop is not None and self.offset is not None and pod.started_at >= loop.from_seconds + self.offset:
            # the bug is in the application: the new process hits it again soon after starting
            b.next_xid_at = pod.started_at + loop.after_start_seconds
        return changes

    def restart(self, kind: str, node: str, namespace: str, pod_name: str) -> str:
        """Restart a pod's container in place: new PIDs, same GPUs; returns what happened."""
        if kind != "pod":
            raise WorldError(f"restart needs a pod target, got {kind!r}")
        self._check_node(node)
        pod = self._pod(namespace, pod_name)
        old_pids = list(pod.pids)
        changes = self._new_processes(pod)
        self._publish()
        b = self.behaviours.get(pod.name)
        memory = ""
        if b is not None and b.restart_memory_bytes is not None:
            memory = f", GPU memory back to {b.restart_memory_bytes / GIB:.0f} GiB"
        text = f"restarted {pod.key} on GPU {','.join(map(str, pod.gpus))}: {', '.join(changes)}{memory}"
        if not old_pids:
            text = f"restarted {pod.key} (no GPU processes)"
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
