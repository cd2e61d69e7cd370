"""The benign-fleet format: a fleet of simulated nodes where nothing breaks, as one YAML file.

A node scenario (exporter/sim) describes one node's GPUs for one exporter run; a benign fleet adds
what a production fleet does on a quiet week: pods that live and die (serving rollouts with new pod
names and a cold start, training jobs that start after t=0 and end, node drains that evict and
reschedule), exporter restarts (the target is down for a scrape or two and the exporter's counters
restart from zero), scrape gaps, and a few corrected ECC errors. `bench/benign/timeline.py` turns it
into one node scenario per node plus the pod timeline the attribution stand-in serves.

    name: serving-diurnal
    hours: 72
    nodes: [{name: h100-a, model: H100-SXM5-80GB, gpus: 8}]
    serving:                      # one pod per GPU on each listed node, a new pod name per rollout
      - {name: chat, namespace: serving, nodes: [h100-a], rollouts_every_hours: 8, cold_start_minutes: 4}
    training:                     # a gang of one pod per GPU on its nodes, from start to end
      - {name: ft, namespace: research, nodes: [a100-a], start_hours: 5, hours: 20}
    drains: [{node: h100-a, at_hours: 30, minutes: 45, exporter_restart: true}]
    exporter_restarts: {every_hours: 24, offset_hours: 3, down_seconds: 60}
    scrape_gaps: [{at_hours: 40, minutes: 2}]
    ecc: [{node: h100-a, gpu: 3, at_hours: 20, corrected: 2}]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

FLEETS = Path(__file__).resolve().parent / "fleets"


class FleetError(ValueError):
    """A fleet file out of shape (names the file and the field)."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    model: str  # a simulator model key (exporter/sim/models.py) or alias
    gpus: int


@dataclass(frozen=True)
class Serving:
    """A model server: one pod per GPU of its nodes, replaced (new names) at every rollout, the
    rollouts `rollouts_every_hours` apart from `rollout_offset_hours` on (not at it)."""

    name: str
    namespace: str
    nodes: tuple[str, ...]
    rollouts_every_hours: float
    rollout_offset_hours: float
    cold_start_minutes: float  # weights loading after a new pod starts: memory fills, SMs idle
    night_sm_activity: float  # the trough, with live traffic (0:00-6:00)
    day_sm_activity: tuple[float, float]  # the daytime band (9:00-18:00)


@dataclass(frozen=True)
class Training:
    """A gang training job: one rank pod per GPU of its nodes, from start to end."""

    name: str
    namespace: str
    nodes: tuple[str, ...]
    start_hours: float
    hours: float
    checkpoint_every_minutes: float
    checkpoint_minutes: float


@dataclass(frozen=True)
class Drain:
    """A human drain (a driver upgrade): the node's pods are evicted and come back, renamed, after."""

    node: str
    at_hours: float
    minutes: float
    exporter_restart: bool  # the exporter pod is replaced at the end of the drain


@dataclass(frozen=True)
class Restarts:
    """Every node's exporter restarts every `every_hours` (nodes spread by `offset_hours` each)."""

    every_hours: float
    offset_hours: float
    down_seconds: float


@dataclass(frozen=True)
class Gap:
    """Scrapes that fail on every node (Prometheus cannot reach the targets) while exporters run."""

    at_hours: float
    minutes: float


@dataclass(frozen=True)
class Ecc:
    node: str
    gpu: int
    at_hours: float
    corrected: int


@dataclass(frozen=True)
class Fleet:
    name: str
    description: str
    hours: float
    nodes: tuple[NodeSpec, ...]
    serving: tuple[Serving, ...]
    training: tuple[Training, ...]
    drains: tuple[Drain, ...]
    restarts: Restarts | None
    gaps: tuple[Gap, ...]
    ecc: tuple[Ecc, ...]

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_days(self) -> float:
        return self.gpu_count * self.hours / 24.0

    def shortened(self, hours: float, nodes: int | None = None) -> Fleet:
        """The first `hours` of the fleet (and its first `nodes` nodes): what a test can afford."""
        kept = self.nodes[:nodes] if nodes is not None else self.nodes
        names = {n.name for n in kept}

        def on(listed: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(n for n in listed if n in names)

        return Fleet(
            self.name,
            self.description,
            min(hours, self.hours),
            kept,
            tuple(replace(s, nodes=on(s.nodes)) for s in self.serving if on(s.nodes)),
            tuple(replace(t, nodes=on(t.nodes)) for t in self.training if on(t.nodes)),
            tuple(d for d in self.drains if d.node in names),
            self.restarts,
            self.gaps,
            tuple(e for e in self.ecc if e.node in names),
        )


def list_fleets() -> list[str]:
    return sorted(p.stem for p in FLEETS.glob("*.yaml"))


def load_fleet(name_or_path: str) -> Fleet:
    """A fleet by name (bench/benign/fleets/<name>.yaml) or path."""
    path = Path(name_or_path)
    if not path.exists():
        path = FLEETS / f"{name_or_path}.yaml"
    return parse_fleet(yaml.safe_load(path.read_text()), str(path))


def _get(d: dict[str, Any], key: str, source: str, where: str, default: Any = None) -> Any:
    if key in d:
        return d[key]
    if default is None:
        raise FleetError(f"{source}: {where}.{key} is required")
    return default


def _check_keys(d: Any, allowed: set[str], source: str, where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise FleetError(f"{source}: {where} must be a mapping")
    unknown = set(d) - allowed
    if unknown:
        raise FleetError(f"{source}: {where}: unknown keys {sorted(unknown)}")
    return d


def parse_fleet(data: Any, source: str = "<memory>") -> Fleet:
    top = {
        "name",
        "description",
        "hours",
        "nodes",
        "serving",
        "training",
        "drains",
        "exporter_restarts",
        "scrape_gaps",
        "ecc",
    }
    d = _check_keys(data, top, source, "fleet")
    nodes = tuple(
        NodeSpec(str(n["name"]), str(n["model"]), int(n["gpus"]))
        for n in (_check_keys(x, {"name", "model", "gpus"}, source, "nodes[]") for x in d["nodes"])
    )
    names = {n.name for n in nodes}

    def node_list(value: Any, where: str) -> tuple[str, ...]:
        out = tuple(str(v) for v in value)
        missing = [n for n in out if n not in names]
        if missing:
            raise FleetError(f"{source}: {where}: unknown nodes {missing}")
        return out

    serving = []
    for i, s in enumerate(d.get("serving") or ()):
        w = f"serving[{i}]"
        s = _check_keys(
            s,
            {
                "name",
                "namespace",
                "nodes",
                "rollouts_every_hours",
                "rollout_offset_hours",
                "cold_start_minutes",
                "night_sm_activity",
                "day_sm_activity",
            },
            source,
            w,
        )
        day = _get(s, "day_sm_activity", source, w, [0.85, 0.92])
        serving.append(
            Serving(
                str(s["name"]),
                str(_get(s, "namespace", source, w, "serving")),
                node_list(s["nodes"], w),
                float(_get(s, "rollouts_every_hours", source, w, 12)),
                float(_get(s, "rollout_offset_hours", source, w, 0.0) or 0.0),
                float(_get(s, "cold_start_minutes", source, w, 4)),
                float(_get(s, "night_sm_activity", source, w, 0.20)),
                (float(day[0]), float(day[1])),
            )
        )
    training = []
    for i, t in enumerate(d.get("training") or ()):
        w = f"training[{i}]"
        t = _check_keys(
            t,
            {
                "name",
                "namespace",
                "nodes",
                "start_hours",
                "hours",
                "checkpoint_every_minutes",
                "checkpoint_minutes",
            },
            source,
            w,
        )
        training.append(
            Training(
                str(t["name"]),
                str(_get(t, "namespace", source, w, "research")),
                node_list(t["nodes"], w),
                float(_get(t, "start_hours", source, w, 0.0) or 0.0),
                float(t["hours"]),
                float(_get(t, "checkpoint_every_minutes", source, w, 30)),
                float(_get(t, "checkpoint_minutes", source, w, 2)),
            )
        )
    drains = tuple(
        Drain(
            str(x["node"]), float(x["at_hours"]), float(x["minutes"]), bool(x.get("exporter_restart", True))
        )
        for x in (
            _check_keys(y, {"node", "at_hours", "minutes", "exporter_restart"}, source, "drains[]")
            for y in d.get("drains") or ()
        )
    )
    node_list([x.node for x in drains], "drains")
    restarts = None
    if d.get("exporter_restarts"):
        r = _check_keys(
            d["exporter_restarts"],
            {"every_hours", "offset_hours", "down_seconds"},
            source,
            "exporter_restarts",
        )
        restarts = Restarts(
            float(r["every_hours"]), float(r.get("offset_hours", 0.0)), float(r.get("down_seconds", 60.0))
        )
    gaps = tuple(
        Gap(float(g["at_hours"]), float(g["minutes"]))
        for g in (
            _check_keys(x, {"at_hours", "minutes"}, source, "scrape_gaps[]")
            for x in d.get("scrape_gaps") or ()
        )
    )
    ecc = tuple(
        Ecc(str(e["node"]), int(e["gpu"]), float(e["at_hours"]), int(e.get("corrected", 1)))
        for e in (
            _check_keys(x, {"node", "gpu", "at_hours", "corrected"}, source, "ecc[]")
            for x in d.get("ecc") or ()
        )
    )
    node_list([e.node for e in ecc], "ecc")
    return Fleet(
        str(d["name"]),
        str(d.get("description", "")),
        float(d["hours"]),
        nodes,
        tuple(serving),
        tuple(training),
        drains,
        restarts,
        gaps,
        ecc,
    )
