"""A benign fleet (bench/benign/fleet.py) as what each node plays: one exporter/sim node scenario per
node (GPU curves on a one-minute grid, one process per pod), the pod timeline the attribution
stand-in serves, the exporter's runs (restarts are the gaps between them) and the failed scrapes."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import random
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.benign.fleet import Fleet, NodeSpec, Serving, Training
from exporter.sim.models import lookup_model

GRID_SECONDS = 60.0  # the GPU curves' points; linear in between
HOUR = 3600.0
# a new pod of a rollout starts this long after the old one ended (terminationGracePeriod, pull);
# rollouts go one GPU after another, this far apart (maxUnavailable: 1)
RESCHEDULE_SECONDS = 30.0
ROLLOUT_STAGGER_SECONDS = 90.0
# a DaemonSet update restarts the nodes' exporters one after another, this far apart
DAEMONSET_STAGGER_SECONDS = 600.0
TRAINING_COLD_START_SECONDS = 180.0
TRAINING_KIND = "PyTorchJob.kubeflow.org"
_POD_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' name suffix alphabet


@dataclass(frozen=True)
class Tenancy:
    """One pod's hold on one GPU, [start, end) in scenario seconds, and its one process."""

    gpu: int
    start: float
    end: float
    namespace: str
    pod: str
    container: str
    pid: int
    cold_start_seconds: float
    workload: Serving | Training
    rank: int = -1  # training ranks only
    world_size: int = 0

    @property
    def training_job(self) -> str:
        return self.workload.name if isinstance(self.workload, Training) else ""


@dataclass(frozen=True)
class NodePlan:
    name: str
    scenario: dict[str, Any]  # an exporter/sim scenario document (parse_scenario reads it)
    tenancies: tuple[Tenancy, ...]
    runs: tuple[tuple[float, float], ...]  # the exporter's runs, [start, end)
    failed: tuple[tuple[float, float], ...]  # scrapes in these windows fail (the exporter still runs)

    def running(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.runs)

    def scrape_fails(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.failed)

    def tenants_at(self, t: float) -> list[Tenancy]:
        return [x for x in self.tenancies if x.start <= t < x.end]


def _suffix(seed: str, n: int) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_POD_ALPHABET[b % len(_POD_ALPHABET)] for b in digest[:n])


def _cut(spans: list[tuple[float, float]], holes: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """`spans` without the `holes`."""
    out = spans
    for a, b in holes:
        nxt = []
        for s, e in out:
            if e <= a or s >= b:
                nxt.append((s, e))
                continue
            if s < a:
                nxt.append((s, a))
            if e > b:
                nxt.append((b, e))
        out = nxt
    return out


def diurnal(serving: Serving, t: float) -> float:
    """Serving SM activity at t: the night trough 0-6 h, a ramp to the day band by 9 h, the band
    (a slow wave between its bounds) to 18 h, down to the trough by 22 h."""
    h = (t / HOUR) % 24.0
    low = serving.night_sm_activity
    lo, hi = serving.day_sm_activity
    day = lo + (hi - lo) * (0.5 + 0.5 * math.sin(2 * math.pi * (h - 9.0) / 4.5))
    if h < 6.0 or h >= 22.0:
        return low
    if h < 9.0:
        return low + (lo - low) * (h - 6.0) / 3.0
    if h < 18.0:
        return day
    return lo + (low - lo) * (h - 18.0) / 4.0


def _drains(fleet: Fleet, node: str) -> list[tuple[float, float]]:
    return [(d.at_hours * HOUR, d.at_hours * HOUR + d.minutes * 60.0) for d in fleet.drains if d.node == node]


def _serving_tenancies(fleet: Fleet, s: Serving, node: NodeSpec, pids: Iterable[int]) -> list[Tenancy]:
    end = fleet.hours * HOUR
    pid = iter(pids)
    out = []
    drains = _drains(fleet, node.name)
    for gpu in range(node.gpus):
        cuts = [0.0]
        k = 1
        while (at := (s.rollout_offset_hours + k * s.rollouts_every_hours) * HOUR) < end:
            cuts.append(at + gpu * ROLLOUT_STAGGER_SECONDS)
            k += 1
        cuts.append(end)
        for n, (a, b) in enumerate(itertools.pairwise(cuts)):
            start = a + (RESCHEDULE_SECONDS if n else 0.0)
            template = _suffix(f"{s.name}/rs/{n}", 9)  # the ReplicaSet's hash: one per rollout
            pieces = _cut([(start, b)], [(x, y + RESCHEDULE_SECONDS) for x, y in drains])
            for m, (p, q) in enumerate(pieces):
                # a pod before a drain keeps its name; the evicted one comes back under a new one
                name = f"{s.name}-{template}-{_suffix(f'{node.name}/{gpu}/{n}/{m}', 5)}"
                cold = 0.0 if p == 0.0 else s.cold_start_minutes * 60.0
                out.append(Tenancy(gpu, p, q, s.namespace, name, "server", next(pid), cold, s))
    return out


def _training_tenancies(
    fleet: Fleet, j: Training, nodes: Sequence[NodeSpec], node: NodeSpec, pids: Iterable[int]
) -> list[Tenancy]:
    pid = iter(pids)
    start = j.start_hours * HOUR
    end = min(fleet.hours * HOUR, (j.start_hours + j.hours) * HOUR)
    # a drain of any of the gang's nodes stops every rank; the gang restarts when it ends
    holes = [h for n in j.nodes for h in _drains(fleet, n)]
    world = sum(n.gpus for n in nodes if n.name in j.nodes)
    first = sum(n.gpus for n in nodes if n.name in j.nodes[: j.nodes.index(node.name)])
    out = []
    for p, q in _cut([(start, end)], holes):
        for gpu in range(node.gpus):
            rank = first + gpu
            pod = f"{j.name}-master-0" if rank == 0 else f"{j.name}-worker-{rank - 1}"
            out.append(
                Tenancy(
                    gpu,
                    p,
                    q,
                    j.namespace,
                    pod,
                    "pytorch",
                    next(pid),
                    TRAINING_COLD_START_SECONDS,
                    j,
                    rank,
                    world,
                )
            )
    return out


def _signals(x: Tenancy | None, t: float, jitter: float) -> tuple[float, float, float, float]:
    """(utilization, SM activity, tensor activity, memory share) of a GPU at t under its tenant."""
    if x is None:
        return 0.0, 0.0, 0.0, 0.0
    warm = t - x.start
    if warm < x.cold_start_seconds:  # weights loading from disk: memory fills, hardly a kernel
        return 0.04, 0.01, 0.0, 0.9 * min(1.0, warm / max(x.cold_start_seconds, 1.0))
    w = x.workload
    if isinstance(w, Serving):
        sm = min(0.99, max(0.0, diurnal(w, t) + jitter))
        # kernels run for more of the time than they fill the SMs (small decode batches at night)
        return min(0.99, sm + 0.08), sm, 0.6 * sm, 0.9
    period = w.checkpoint_every_minutes * 60.0
    if period > 0 and (warm % period) >= period - w.checkpoint_minutes * 60.0:
        return 0.12, 0.05, 0.0, 0.8  # checkpoint: rank 0 writes, the others wait at a barrier
    return 0.98, 0.70 + jitter, 0.52 + jitter, 0.8


def _node_scenario(fleet: Fleet, node: NodeSpec, tenancies: Sequence[Tenancy]) -> dict[str, Any]:
    model = lookup_model(node.model)
    if model is None:
        raise ValueError(f"unknown GPU model {node.model!r}")
    total = model.memory_total_bytes - model.memory_reserved_bytes
    idle_w, cap_w = model.power_idle_watts, model.power_limit_watts
    end = fleet.hours * HOUR
    grid = [i * GRID_SECONDS for i in range(int(end // GRID_SECONDS) + 1)]
    gpus, processes = [], []
    for gpu in range(node.gpus):
        mine = sorted((x for x in tenancies if x.gpu == gpu), key=lambda x: x.start)
        starts = [x.start for x in mine]
        rng = random.Random(f"{fleet.name}/{node.name}/{gpu}")
        curves: dict[str, list[list[float]]] = {k: [] for k in ("util", "sm", "tensor", "mem")}
        for t in grid:
            i = bisect_right(starts, t) - 1
            x = mine[i] if i >= 0 and mine[i].end > t else None
            util, sm, tensor, mem = _signals(x, t, rng.uniform(-0.02, 0.02))
            for key, value in zip(curves, (util, sm, tensor, mem * total), strict=True):
                curves[key].append([t, round(value, 4) if key != "mem" else int(value)])
        util_pts = curves["util"]
        gpus.append(
            {
                "model": node.model,
                "utilization": util_pts,
                "sm_active": curves["sm"],
                "tensor_active": curves["tensor"],
                "memory_used_bytes": curves["mem"],
                "power_watts": [[t, round(idle_w + u * (0.85 * cap_w - idle_w), 1)] for t, u in util_pts],
                "temperature_celsius": [[t, round(33.0 + 38.0 * u, 1)] for t, u in util_pts],
                "ecc": [
                    {"at": e.at_hours * HOUR, "corrected": e.corrected}
                    for e in fleet.ecc
                    if e.node == node.name and e.gpu == gpu
                ],
            }
        )
        for x in mine:
            processes.append(
                {
                    "pid": x.pid,
                    "gpu": gpu,
                    "start": x.start,
                    "end": x.end,
                    "name": "vllm serve" if isinstance(x.workload, Serving) else "python train.py",
                    "memory_bytes": int(0.85 * total),
                    "sm_utilization": [p for p in curves["sm"] if x.start <= p[0] < x.end] or 0.0,
                }
            )
    return {
        "name": f"{fleet.name}-{node.name}",
        "description": f"benign fleet {fleet.name}, node {node.name}",
        "duration_seconds": end,
        "node": node.name,
        "gpus": gpus,
        "processes": processes,
    }


def _restarts(fleet: Fleet, index: int, node: NodeSpec) -> list[tuple[float, float]]:
    """The windows in which the node's exporter is down: daily restarts and drains that replace it."""
    end = fleet.hours * HOUR
    out = []
    r = fleet.restarts
    if r is not None and r.every_hours > 0:
        k = 0
        while (at := (r.offset_hours + k * r.every_hours) * HOUR + index * DAEMONSET_STAGGER_SECONDS) < end:
            out.append((at, at + r.down_seconds))
            k += 1
    down = r.down_seconds if r is not None else 60.0
    for d in fleet.drains:
        if d.node == node.name and d.exporter_restart:
            at = (d.at_hours * HOUR) + d.minutes * 60.0
            out.append((at, at + down))
    return sorted(out)


def plan(fleet: Fleet) -> list[NodePlan]:
    """Every node of the fleet as it plays."""
    plans = []
    end = fleet.hours * HOUR
    failed = tuple((g.at_hours * HOUR, g.at_hours * HOUR + g.minutes * 60.0) for g in fleet.gaps)
    for index, node in enumerate(fleet.nodes):
        pids = iter(range(10_000, 1_000_000))
        tenancies: list[Tenancy] = []
        for s in fleet.serving:
            if node.name in s.nodes:
                tenancies += _serving_tenancies(fleet, s, node, pids)
        for j in fleet.training:
            if node.name in j.nodes:
                tenancies += _training_tenancies(fleet, j, fleet.nodes, node, pids)
        # a fleet cut short (Fleet.shortened) ends before some pods start; a pod running at the end
        # runs on (its series must not vanish from the last scrape)
        tenancies = [
            dataclasses.replace(x, end=end + HOUR) if x.end >= end else x
            for x in tenancies
            if x.start < min(x.end, end)
        ]
        held: dict[int, list[tuple[float, float]]] = {}
        for x in tenancies:
            for a, b in held.get(x.gpu, []):
                if x.start < b and a < x.end:
                    raise ValueError(f"{node.name} GPU {x.gpu}: two workloads overlap at {x.start:.0f}s")
            held.setdefault(x.gpu, []).append((x.start, x.end))
        runs = tuple(_cut([(0.0, end + 1.0)], _restarts(fleet, index, node)))
        plans.append(
            NodePlan(node.name, _node_scenario(fleet, node, tenancies), tuple(tenancies), runs, failed)
        )
    return plans
