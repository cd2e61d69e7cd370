"""Scenario files: load, validate strictly, and turn into typed, precomputed specs.

Why one module of ~750 lines: it is one strict parser (`_Parser`), section by section, whose
helpers (numbers, sizes, curves, symbols) share one error path that names file and field. The typed
result lives apart in scenario_types.py, which the simulation's runtime reads without the parser.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from pathlib import Path
from typing import Any

import yaml

from exporter.errors import ScenarioError
from exporter.sim.curve import Curve
from exporter.sim.jobs import JOB_CURVES, plan_attempt
from exporter.sim.library import implemented_symbols
from exporter.sim.models import (
    ALIASES,
    ARCH_ADA,
    ARCH_AMPERE,
    ARCH_BLACKWELL,
    ARCH_HOPPER,
    ARCH_TURING,
    ARCH_VOLTA,
    MODELS,
    GpuModel,
    lookup_model,
)
from exporter.sim.scenario_types import (
    INF,
    JOB_EVENT_KINDS,
    ClockEventWindow,
    EccIncrement,
    FaultSpec,
    GpuSpec,
    JobEvent,
    JobSpec,
    MigInstanceSpec,
    NvLinkPeer,
    NvLinkSpec,
    ProcessSpec,
    RankSpec,
    RemapState,
    Scenario,
    SchedulerSpec,
    WorkShape,
    XidEvent,
)
from gpupulse.metrics.attribution import PROCESS_STATE_NAMES as STATE_NAMES

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"

# Sections other helpers own: kept raw in Scenario.extra
FOREIGN_SECTIONS = ("pods", "engines", "page_cache")

# Clock-event reason names (scenario spelling) -> NVML bit (nvmlClocksEventReason*)
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# Facts of a scenario-defined GPU model (gpu_models) and how each is written
_MODEL_FIELDS: dict[str, str] = {
    "name": "str",
    "architecture": "arch",
    "compute_capability": "cc",
    "pci_device_id": "int",
    "memory_total_bytes": "size",
    "memory_reserved_bytes": "size",
    "power_limit_watts": "num",
    "power_idle_watts": "num",
    "sm_clock_max_hertz": "num",
    "memory_clock_max_hertz": "num",
    "sm_clock_idle_hertz": "num",
    "pcie_generation_max": "int",
    "pcie_width_max": "int",
    "shutdown_temperature_celsius": "int",
    "slowdown_temperature_celsius": "int",
    "memory_max_temperature_celsius": "int",
    "gpu_max_temperature_celsius": "int",
    "nvlink_count": "int",
}
_ARCHITECTURES = {
    "volta": ARCH_VOLTA,
    "turing": ARCH_TURING,
    "ampere": ARCH_AMPERE,
    "ada": ARCH_ADA,
    "hopper": ARCH_HOPPER,
    "blackwell": ARCH_BLACKWELL,
}

# Fault error names -> nvmlReturn_t codes
FAULT_ERRORS: dict[str, int] = {
    "GPU_IS_LOST": 15,
    "UNKNOWN": 999,
    "NOT_SUPPORTED": 3,
    "TIMEOUT": 10,
}
FAULT_KINDS = ("hang", "slow", "error")

# A training job's GPU while it computes and while it spins in a collective: the H100 SXM5 numbers of
# the training scenarios (an all-reduce over NVLink at ~110 GB/s each way; PCIe to the NICs and loader)
DEFAULT_COMPUTE = WorkShape(0.99, 0.82, 0.48, 640.0, 110e9, 11e9, 13e9)
DEFAULT_SPIN = WorkShape(0.97, 0.15, 0.0, 230.0, 200e3, 100e3, 100e3)
_SHAPE_FIELDS = tuple(WorkShape.__dataclass_fields__)
# what each job event kind takes besides at, kind and attempt; and what it must have
_EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "exit": ("rank",),
    "stall": ("rank", "until", "host_state", "host_cpu_cores", "io_bytes_per_second"),
    "slow": ("rank", "until", "ratio", "sm_clock_hertz", "reasons"),
    "container_restart": ("rank", "pid", "after_seconds"),
    "new_process": ("rank", "pid", "until", "memory_bytes", "host_cpu_cores"),
    "complete": (),
}
_EVENT_REQUIRED: dict[str, tuple[str, ...]] = {
    "exit": ("rank",),
    "stall": ("rank",),
    "slow": ("rank", "ratio"),
    "container_restart": ("rank", "pid"),
    "new_process": ("rank", "pid"),
    "complete": (),
}
PROCESS_TYPES = ("compute", "graphics", "mps")

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\s*$")
_SIZE_UNITS = {
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}
_FLOAT_RE = re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$")
_BUS_ID_RE = re.compile(r"^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
# Default bus numbers of an 8-GPU HGX board, then sequential
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def list_scenarios() -> list[str]:
    """Names of the scenarios shipped in exporter/scenarios/."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    """Load a shipped scenario by name, or a scenario file by path; raises ScenarioError."""
    path = Path(name_or_path)
    # A bare word is a shipped scenario, even if a directory of that name exists here
    if path.suffix not in (".yaml", ".yml") and len(path.parts) == 1:
        path = SCENARIO_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ScenarioError(
                name_or_path, "", f"no such scenario; shipped ones: {', '.join(list_scenarios())}"
            )
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(source, "", f"cannot read file: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(source, "", f"invalid YAML: {exc}") from exc
    return parse_scenario(data, source=source, default_name=path.stem)


def parse_scenario(data: Any, *, source: str = "<memory>", default_name: str = "scenario") -> Scenario:
    """Validate an already-parsed YAML document; raises ScenarioError."""
    return _Parser(source).scenario(data, default_name)


class _Parser:
    """Strict field-by-field validation with paths in every error."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.models: dict[str, GpuModel] = {}

    def fail(self, path: str, problem: str) -> ScenarioError:
        return ScenarioError(self.source, path, problem)

    # ---- primitives -------------------------------------------------------------------------
    def mapping(
        self, value: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {_kind(value)}")
        for key in value:
            # top-level `x-` keys only hold YAML anchors for reuse, as in compose files
            if key not in allowed and not (path == "" and str(key).startswith("x-")):
                raise self.fail(_join(path, str(key)), f"unknown field (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                raise self.fail(_join(path, key), "required field is missing")
        return value

    def seq(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list, got {_kind(value)}")
        return value

    def num(self, value: Any, path: str, low: float | None = None, high: float | None = None) -> float:
        # YAML 1.1 reads 1.98e9 (no sign in the exponent) as a string
        if isinstance(value, str) and _FLOAT_RE.match(value):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, f"expected a number, got {_kind(value)}")
        v = float(value)
        if v != v:
            raise self.fail(path, "NaN is not allowed")
        if low is not None and v < low:
            raise self.fail(path, f"must be >= {low:g}, got {v:g}")
        if high is not None and v > high:
            raise self.fail(path, f"must be <= {high:g}, got {v:g}")
        return v

    def integer(self, value: Any, path: str, low: int | None = None, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {_kind(value)}")
        if low is not None and value < low:
            raise self.fail(path, f"must be >= {low}, got {value}")
        if high is not None and value > high:
            raise self.fail(path, f"must be <= {high}, got {value}")
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"expected a non-empty string, got {_kind(value)}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, got {_kind(value)}")
        return value

    def size(self, value: Any, path: str) -> float:
        if isinstance(value, str):
            m = _SIZE_RE.match(value)
            if not m:
                raise self.fail(path, f"expected bytes as a number or like '12GiB', got {value!r}")
            return float(m.group(1)) * _SIZE_UNITS[m.group(2)]
        return self.num(value, path, low=0)

    def curve(
        self, value: Any, path: str, low: float | None = None, high: float | None = None, sizes: bool = False
    ) -> Curve:
        def scalar(v: Any, p: str) -> float:
            x = self.size(v, p) if sizes else self.num(v, p)
            if low is not None and x < low:
                raise self.fail(p, f"must be >= {low:g}, got {x:g}")
            if high is not None and x > high:
                raise self.fail(p, f"must be <= {high:g}, got {x:g}")
            return x

        if not isinstance(value, list):
            return Curve.constant(scalar(value, path))
        if not value:
            raise self.fail(path, "a curve needs a number or at least one [t, value] point")
        points: list[tuple[float, float]] = []
        for i, point in enumerate(value):
            p = f"{path}[{i}]"
            if not isinstance(point, list) or len(point) != 2:
                raise self.fail(p, f"expected a [t, value] pair, got {point!r}")
            t = self.num(point[0], f"{p}[0]", low=0)
            if points and t < points[-1][0]:
                raise self.fail(f"{p}[0]", f"times must not decrease ({t:g} after {points[-1][0]:g})")
            points.append((t, scalar(point[1], f"{p}[1]")))
        return Curve(points)

    def symbol(self, value: Any, path: str) -> str:
        name = self.string(value, path)
        if name not in implemented_symbols():
            raise self.fail(path, f"{name!r} is not a C symbol the simulation implements (a typo?)")
        return name

    def opt_time(self, d: dict[str, Any], key: str, path: str, default: float) -> float:
        if key not in d or d[key] is None:
            return default
        return self.num(d[key], _join(path, key), low=0)

    # ---- sections ---------------------------------------------------------------------------
    def scenario(self, data: Any, default_name: str) -> Scenario:
        top = (
            "name", "description", "duration_seconds", "node", "driver_version", "cuda_driver_version",
            "gpu_models", "gpus", "processes", "events", "faults", "jobs", "scheduler", *FOREIGN_SECTIONS,
        )  # fmt: skip
        d = self.mapping(data, "", top, required=("gpus",))
        name = self.string(d["name"], "name") if "name" in d else default_name
        description = str(d.get("description") or "")
        duration = self.num(d.get("duration_seconds", 600), "duration_seconds", low=1)
        node = self.string(d.get("node", "sim-node-0"), "node")
        driver = self.string(str(d.get("driver_version", "570.133.20")), "driver_version")
        cuda = self.cuda_version(d.get("cuda_driver_version", 12080), "cuda_driver_version")
        self.models = self.gpu_models(d.get("gpu_models"), "gpu_models")
        gpu_items = self.seq(d["gpus"], "gpus")
        if not gpu_items:
            raise self.fail("gpus", "a scenario needs at least one GPU")
        gpus = [self.gpu(g, i, node, f"gpus[{i}]") for i, g in enumerate(gpu_items)]
        self.check_unique([g.uuid for g in gpus], "gpus", "uuid")
        self.check_unique([g.pci_bus_id.upper() for g in gpus], "gpus", "pci_bus_id")
        for g in gpus:
            self.check_nvlink(g, len(gpus))
        processes = [
            self.process(p, gpus, f"processes[{i}]")
            for i, p in enumerate(self.seq(d.get("processes"), "processes"))
        ]
        events = [
            self.event(e, len(gpus), f"events[{i}]", processes, duration)
            for i, e in enumerate(self.seq(d.get("events"), "events"))
        ]
        faults = [
            self.fault(f, len(gpus), f"faults[{i}]")
            for i, f in enumerate(self.seq(d.get("faults"), "faults"))
        ]
        extra = {k: d[k] for k in FOREIGN_SECTIONS if k in d}
        jobs = tuple(self.job(j, gpus, f"jobs[{i}]") for i, j in enumerate(self.seq(d.get("jobs"), "jobs")))
        self.check_unique([j.name for j in jobs], "jobs", "name")
        gpus, processes = self.apply_jobs(jobs, gpus, gpu_items, processes)
        return Scenario(
            name=name, description=description, duration_seconds=duration, node=node,
            driver_version=driver, cuda_driver_version=cuda, gpus=tuple(gpus), processes=tuple(processes),
            events=tuple(sorted(events, key=lambda e: e.at_seconds)), faults=tuple(faults), extra=extra,
            source=self.source, jobs=jobs, scheduler=self.scheduler(d.get("scheduler"), "scheduler"),
        )  # fmt: skip

    # ---- training jobs (exporter/sim/jobs.py plays them) ------------------------------------
    def scheduler(self, value: Any, path: str) -> SchedulerSpec:
        if value is None:
            return SchedulerSpec(20.0, None)
        d = self.mapping(value, path, ("delay_seconds", "inbox"))
        delay = self.num(d.get("delay_seconds", 20.0), f"{path}.delay_seconds", low=0, high=3600)
        inbox = None
        if d.get("inbox") is not None:
            text = self.string(d["inbox"], f"{path}.inbox")
            base = Path(self.source).parent if self.source != "<memory>" else Path.cwd()
            inbox = str(base / text)  # relative to the scenario file; an absolute path stays
        return SchedulerSpec(delay, inbox)

    def shape(self, value: Any, path: str, default: WorkShape) -> WorkShape:
        if value is None:
            return default
        d = self.mapping(value, path, _SHAPE_FIELDS)
        values: dict[str, float] = {}
        for name in WorkShape.__dataclass_fields__:
            if name not in d:
                values[name] = getattr(default, name)
            elif name.endswith("_bytes_per_second"):
                values[name] = self.size(d[name], f"{path}.{name}")
            elif name == "power_watts":
                values[name] = self.num(d[name], f"{path}.{name}", low=0, high=5000)
            else:
                values[name] = self.num(d[name], f"{path}.{name}", low=0, high=1)
        return WorkShape(**values)

    def job(self, value: Any, gpus: list[GpuSpec], path: str) -> JobSpec:
        allowed = (
            "name", "coupled", "world_size", "ranks", "compute", "spin", "memory_bytes", "process_name",
            "rendezvous_seconds", "rendezvous_memory_bytes", "events",
        )  # fmt: skip
        d = self.mapping(value, path, allowed, required=("name", "ranks", "world_size"))
        name = self.string(d["name"], f"{path}.name")
        world = self.integer(d["world_size"], f"{path}.world_size", low=1, high=100_000)
        ranks: list[RankSpec] = []
        for i, item in enumerate(self.seq(d["ranks"], f"{path}.ranks")):
            p = f"{path}.ranks[{i}]"
            r = self.mapping(item, p, ("rank", "gpu", "pid"), required=("rank", "gpu", "pid"))
            rank = self.integer(r["rank"], f"{p}.rank", low=0, high=world - 1)
            gpu = self.integer(r["gpu"], f"{p}.gpu", low=0, high=len(gpus) - 1)
            if gpus[gpu].mig is not None:
                raise self.fail(f"{p}.gpu", f"GPU {gpu} is in MIG mode; a rank takes a whole GPU here")
            ranks.append(RankSpec(rank, gpu, self.integer(r["pid"], f"{p}.pid", low=1)))
        if not ranks:
            raise self.fail(f"{path}.ranks", "a job needs at least one rank on this node")
        self.check_unique([str(r.rank) for r in ranks], f"{path}.ranks", "rank")
        self.check_unique([str(r.gpu) for r in ranks], f"{path}.ranks", "gpu")
        events = tuple(
            sorted(
                (
                    self.job_event(e, world, f"{path}.events[{i}]")
                    for i, e in enumerate(self.seq(d.get("events"), f"{path}.events"))
                ),
                key=lambda e: (e.attempt, e.at_seconds),
            )
        )
        return JobSpec(
            name=name,
            coupled=self.boolean(d.get("coupled", True), f"{path}.coupled"),
            world_size=world,
            ranks=tuple(ranks),
            compute=self.shape(d.get("compute"), f"{path}.compute", DEFAULT_COMPUTE),
            spin=self.shape(d.get("spin"), f"{path}.spin", DEFAULT_SPIN),
            memory_bytes=self.size(d.get("memory_bytes", "70GiB"), f"{path}.memory_bytes"),
            process_name=self.string(d.get("process_name", "python -u train.py"), f"{path}.process_name"),
            rendezvous_seconds=self.num(
                d.get("rendezvous_seconds", 5.0), f"{path}.rendezvous_seconds", low=0, high=3600
            ),
            rendezvous_memory_bytes=self.size(
                d.get("rendezvous_memory_bytes", "512MiB"), f"{path}.rendezvous_memory_bytes"
            ),
            events=events,
        )

    def job_event(self, value: Any, world: int, path: str) -> JobEvent:
        allowed = (
            "at", "kind", "rank", "until", "pid", "after_seconds", "ratio", "sm_clock_hertz", "reasons",
            "host_state", "host_cpu_cores", "io_bytes_per_second", "memory_bytes", "attempt",
        )  # fmt: skip
        d = self.mapping(value, path, allowed, required=("at", "kind"))
        kind = d["kind"]
        if kind not in JOB_EVENT_KINDS:
            raise self.fail(f"{path}.kind", f"expected one of {', '.join(JOB_EVENT_KINDS)}, got {kind!r}")
        takes = _EVENT_FIELDS[kind]
        for key in d:
            if key not in ("at", "kind", "attempt", *takes):
                raise self.fail(f"{path}.{key}", f"an event of kind {kind} does not take {key} (it takes: "
                                f"{', '.join(('at', 'attempt', *takes))})")  # fmt: skip
        for key in _EVENT_REQUIRED[kind]:
            if key not in d:
                raise self.fail(f"{path}.{key}", f"an event of kind {kind} needs {key}")
        at = self.num(d["at"], f"{path}.at", low=0)
        until = self.opt_time(d, "until", path, INF)
        if until <= at:
            raise self.fail(f"{path}.until", f"must be after at ({until:g} <= {at:g})")
        reasons: list[str] = []
        mask = 0
        for j, r in enumerate(self.seq(d.get("reasons"), f"{path}.reasons")):
            if r not in CLOCK_EVENT_REASONS:
                raise self.fail(
                    f"{path}.reasons[{j}]", f"unknown reason {r!r} (known: {', '.join(CLOCK_EVENT_REASONS)})"
                )
            reasons.append(r)
            mask |= CLOCK_EVENT_REASONS[r]
        host_state = d.get("host_state", "sleeping")
        if host_state not in STATE_NAMES:
            raise self.fail(
                f"{path}.host_state", f"expected one of {', '.join(STATE_NAMES)}, got {host_state!r}"
            )
        clock = (
            self.num(d["sm_clock_hertz"], f"{path}.sm_clock_hertz", low=0) if "sm_clock_hertz" in d else None
        )
        return JobEvent(
            at_seconds=at, kind=kind,
            rank=self.integer(d["rank"], f"{path}.rank", low=0, high=world - 1) if "rank" in d else None,
            until_seconds=until,
            pid=self.integer(d["pid"], f"{path}.pid", low=1) if "pid" in d else None,
            after_seconds=self.num(d.get("after_seconds", 10.0), f"{path}.after_seconds", low=0, high=3600),
            ratio=self.num(d.get("ratio", 1.0), f"{path}.ratio", low=0.01, high=1.0),
            sm_clock_hertz=clock,
            reasons=tuple(reasons), reasons_mask=mask, host_state=str(host_state),
            host_cpu_cores=self.num(d.get("host_cpu_cores", 0.0), f"{path}.host_cpu_cores", low=0, high=1024),
            io_bytes_per_second=self.size(d.get("io_bytes_per_second", 0), f"{path}.io_bytes_per_second"),
            memory_bytes=self.size(d.get("memory_bytes", "512MiB"), f"{path}.memory_bytes"),
            attempt=self.integer(d.get("attempt", 0), f"{path}.attempt", low=0, high=1000),
        )  # fmt: skip

    def apply_jobs(
        self,
        jobs: tuple[JobSpec, ...],
        gpus: list[GpuSpec],
        gpu_items: list[Any],
        processes: list[ProcessSpec],
    ) -> tuple[list[GpuSpec], list[ProcessSpec]]:
        """The GPUs of every job's ranks with the job's curves, and the job's processes added."""
        owner: dict[int, str] = {}
        pids: dict[int, str] = {p.pid: "processes" for p in processes}
        out_gpus = list(gpus)
        out_procs = list(processes)
        models = {g.index: g.model for g in gpus}
        for i, job in enumerate(jobs):
            path = f"jobs[{i}]"
            for k, r in enumerate(job.ranks):
                if r.gpu in owner:
                    raise self.fail(
                        f"{path}.ranks[{k}].gpu", f"GPU {r.gpu} already holds a rank of {owner[r.gpu]}"
                    )
                owner[r.gpu] = job.name
                given = [
                    c for c in JOB_CURVES if isinstance(gpu_items[r.gpu], dict) and c in gpu_items[r.gpu]
                ]
                if given:
                    raise self.fail(
                        f"gpus[{r.gpu}].{given[0]}",
                        f"GPU {r.gpu} holds rank {r.rank} of job {job.name}, whose curves the job makes",
                    )
            plan = plan_attempt(job, 0, 0.0, {r.rank: (r.gpu, r.pid) for r in job.ranks}, models)
            for proc in plan.processes:
                if proc.pid in pids:
                    raise self.fail(path, f"pid {proc.pid} is used twice (also in {pids[proc.pid]})")
                pids[proc.pid] = path
            for gpu_index, gp in plan.gpus.items():
                spec = out_gpus[gpu_index]
                windows = tuple(
                    sorted((*spec.clock_event_reasons, *gp.clock_windows), key=lambda w: w.from_seconds)
                )
                changes: dict[str, Any] = {**gp.curves, "clock_event_reasons": windows}
                out_gpus[gpu_index] = dataclasses.replace(spec, **changes)
            out_procs += plan.processes
        return out_gpus, out_procs

    def gpu_models(self, value: Any, path: str) -> dict[str, GpuModel]:
        """GPU models outside the built-in table, each starting from a built-in one (`like`)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping of model keys, got {_kind(value)}")
        out: dict[str, GpuModel] = {}
        for key, item in value.items():
            p = _join(path, str(key))
            d = self.mapping(item, p, ("like", *_MODEL_FIELDS), required=("like", "name"))
            like = self.string(d["like"], f"{p}.like")
            base = lookup_model(like)
            if base is None:
                known = ", ".join(sorted(MODELS))
                raise self.fail(f"{p}.like", f"not a built-in model: {like!r} (known: {known})")
            changes: dict[str, Any] = {"key": str(key), "name": self.string(d["name"], f"{p}.name")}
            for name, kind in _MODEL_FIELDS.items():
                if name not in d or name == "name":
                    continue
                fp = f"{p}.{name}"
                if kind == "size":
                    changes[name] = int(self.size(d[name], fp))
                elif kind == "int":
                    changes[name] = self.integer(d[name], fp, low=0)
                elif kind == "arch":
                    if d[name] not in _ARCHITECTURES:
                        raise self.fail(fp, f"expected one of {', '.join(_ARCHITECTURES)}, got {d[name]!r}")
                    changes[name] = _ARCHITECTURES[d[name]]
                elif kind == "cc":
                    m = re.match(r"^(\d+)\.(\d+)$", str(d[name]).strip())
                    if not m:
                        raise self.fail(fp, f"expected like '8.9', got {d[name]!r}")
                    changes[name] = (int(m.group(1)), int(m.group(2)))
                else:
                    changes[name] = self.num(d[name], fp, low=0)
            if "memory_total_bytes" in changes:  # the base's MIG profiles no longer fit
                changes["mig_profiles"] = ()
                changes["mig_max_devices"] = 0
            model = dataclasses.replace(base, **changes)
            if model.memory_reserved_bytes >= model.memory_total_bytes:
                raise self.fail(f"{p}.memory_reserved_bytes", "must be below memory_total_bytes")
            out[str(key)] = model
        return out

    def cuda_version(self, value: Any, path: str) -> int:
        if isinstance(value, str):
            m = re.match(r"^(\d+)\.(\d+)$", value.strip())
            if not m:
                raise self.fail(path, f"expected like '12.8' or 12080, got {value!r}")
            return int(m.group(1)) * 1000 + int(m.group(2)) * 10
        return self.integer(value, path, low=1000)

    def check_unique(self, values: list[str], path: str, key: str) -> None:
        seen: dict[str, int] = {}
        for i, v in enumerate(values):
            if v in seen:
                raise self.fail(f"{path}[{i}].{key}", f"duplicates {path}[{seen[v]}].{key} ({v})")
            seen[v] = i

    def gpu(self, value: Any, index: int, node: str, path: str) -> GpuSpec:
        allowed = (
            "model", "uuid", "pci_bus_id", "serial", "vbios_version",
            "utilization", "memory_utilization", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
            "memory_used_bytes", "memory_base_bytes", "temperature_celsius", "memory_temperature_celsius",
            "power_watts", "sm_clock_hertz", "memory_clock_hertz", "pcie_link_generation", "pcie_link_width",
            "pcie_replay_count", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second",
            "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second", "clock_event_reasons", "ecc",
            "remapped_rows", "lost_at", "xid_on_loss", "mig", "nvlink", "not_supported",
        )  # fmt: skip
        d = self.mapping(value, path, allowed, required=("model",))
        key = self.string(d["model"], f"{path}.model")
        model = self.models.get(key) or lookup_model(key)
        if model is None:
            known = sorted([*MODELS, *ALIASES, *self.models])
            raise self.fail(
                f"{path}.model",
                f"unknown GPU model {key!r} (known: {', '.join(known)}; describe others under gpu_models)",
            )

        def c(name: str, default: Curve, low: float | None = 0.0, high: float | None = None) -> Curve:
            if name not in d:
                return default
            return self.curve(d[name], f"{path}.{name}", low, high)

        util = c("utilization", Curve.constant(0.0), 0.0, 1.0)
        mem_util = c("memory_utilization", util.affine(0.0, 0.45), 0.0, 1.0)
        sm_active = c("sm_active", util.affine(0.0, 0.8), 0.0, 1.0)
        sm_occ = c("sm_occupancy", sm_active.affine(0.0, 0.55), 0.0, 1.0)
        tensor = c("tensor_active", sm_active.affine(0.0, 0.5), 0.0, 1.0)
        dram = c("dram_active", mem_util, 0.0, 1.0)
        total = model.memory_total_bytes - model.memory_reserved_bytes
        used = None
        if "memory_used_bytes" in d:
            used = self.curve(d["memory_used_bytes"], f"{path}.memory_used_bytes", 0, total, sizes=True)
        base = 0
        if "memory_base_bytes" in d:
            base = int(self.size(d["memory_base_bytes"], f"{path}.memory_base_bytes"))
        temp = c("temperature_celsius", util.affine(32.0, 38.0), -40.0, 130.0)
        mem_temp = c("memory_temperature_celsius", temp.affine(4.0, 1.0), -40.0, 130.0)
        power = c(
            "power_watts",
            util.affine(model.power_idle_watts, model.power_limit_watts * 0.85 - model.power_idle_watts),
            0.0,
            model.power_limit_watts * 1.5,
        )
        sm_clock = c(
            "sm_clock_hertz", Curve.constant(model.sm_clock_max_hertz), 0.0, model.sm_clock_max_hertz * 1.2
        )
        mem_clock = c("memory_clock_hertz", Curve.constant(model.memory_clock_max_hertz), 0.0)
        gen = c(
            "pcie_link_generation", Curve.constant(model.pcie_generation_max), 1.0, model.pcie_generation_max
        )
        width = c("pcie_link_width", Curve.constant(model.pcie_width_max), 1.0, model.pcie_width_max)
        replay = c("pcie_replay_count", Curve.constant(0.0), 0.0)

        def rate(name: str, default: Curve) -> Curve:
            return self.curve(d[name], f"{path}.{name}", 0.0, sizes=True) if name in d else default

        pcie_tx = rate("pcie_tx_bytes_per_second", util.affine(0.0, 0.5e9))
        pcie_rx = rate("pcie_rx_bytes_per_second", util.affine(0.0, 1.0e9))
        link_busy = util.affine(0.0, 0.0 if d.get("nvlink") is None else 20e9)
        nvlink_tx = rate("nvlink_tx_bytes_per_second", link_busy)
        nvlink_rx = rate("nvlink_rx_bytes_per_second", link_busy)
        lost_at = None
        if d.get("lost_at") is not None:
            lost_at = self.num(d["lost_at"], f"{path}.lost_at", low=0)
        xid_on_loss = self.boolean(d.get("xid_on_loss", False), f"{path}.xid_on_loss")
        if xid_on_loss and lost_at is None:
            raise self.fail(f"{path}.xid_on_loss", "needs lost_at")
        gpu_uuid = (
            self.string(d["uuid"], f"{path}.uuid")
            if "uuid" in d
            else "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"gpupulse-sim/{node}/{index}"))
        )
        if not gpu_uuid.startswith("GPU-"):
            raise self.fail(f"{path}.uuid", f"a GPU UUID starts with 'GPU-', got {gpu_uuid!r}")
        bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0xE0 + index - len(_HGX_BUSES)
        bus_id = (
            self.string(d["pci_bus_id"], f"{path}.pci_bus_id")
            if "pci_bus_id" in d
            else f"00000000:{bus:02X}:00.0"
        )
        if not _BUS_ID_RE.match(bus_id):
            raise self.fail(f"{path}.pci_bus_id", f"expected like '00000000:18:00.0', got {bus_id!r}")
        serial = str(d.get("serial", f"{1650923000000 + index * 7919}"))
        vbios = str(d.get("vbios_version", "96.00.99.00.01"))
        not_supported = frozenset(
            self.symbol(s, f"{path}.not_supported[{i}]")
            for i, s in enumerate(self.seq(d.get("not_supported"), f"{path}.not_supported"))
        )
        windows = self.clock_windows(d.get("clock_event_reasons"), f"{path}.clock_event_reasons")
        return GpuSpec(
            index=index, model=model, uuid=gpu_uuid, pci_bus_id=bus_id.upper(), serial=serial,
            vbios_version=vbios,
            utilization=util, memory_utilization=mem_util, sm_active=sm_active, sm_occupancy=sm_occ,
            tensor_active=tensor, dram_active=dram, memory_used_bytes=used, memory_base_bytes=base,
            temperature_celsius=temp, memory_temperature_celsius=mem_temp, power_watts=power,
            sm_clock_hertz=sm_clock, memory_clock_hertz=mem_clock, pcie_link_generation=gen,
            pcie_link_width=width, pcie_replay_count=replay, pcie_tx_bytes_per_second=pcie_tx,
            pcie_rx_bytes_per_second=pcie_rx, nvlink_tx_bytes_per_second=nvlink_tx,
            nvlink_rx_bytes_per_second=nvlink_rx,
            clock_event_reasons=windows,
            ecc=self.ecc(d.get("ecc"), f"{path}.ecc"),
            remapped_rows=self.remaps(d.get("remapped_rows"), model, f"{path}.remapped_rows"),
            lost_at_seconds=lost_at, xid_on_loss=xid_on_loss,
            mig=self.mig(d.get("mig"), model, gpu_uuid, f"{path}.mig"),
            nvlink=self.nvlink(d.get("nvlink"), model, f"{path}.nvlink"),
            not_supported=not_supported,
        )  # fmt: skip

    def clock_windows(self, value: Any, path: str) -> tuple[ClockEventWindow, ...]:
        out = []
        for i, item in enumerate(self.seq(value, path)):
            p = f"{path}[{i}]"
            d = self.mapping(item, p, ("from", "until", "reasons"), required=("reasons",))
            start = self.opt_time(d, "from", p, 0.0)
            until = self.opt_time(d, "until", p, INF)
            if until <= start:
                raise self.fail(f"{p}.until", f"must be after from ({until:g} <= {start:g})")
            reasons = []
            mask = 0
            for j, r in enumerate(self.seq(d["reasons"], f"{p}.reasons")):
                if r not in CLOCK_EVENT_REASONS:
                    raise self.fail(
                        f"{p}.reasons[{j}]", f"unknown reason {r!r} (known: {', '.join(CLOCK_EVENT_REASONS)})"
                    )
                reasons.append(r)
                mask |= CLOCK_EVENT_REASONS[r]
            out.append(ClockEventWindow(start, until, tuple(reasons), mask))
        return tuple(out)

    def ecc(self, value: Any, path: str) -> tuple[EccIncrement, ...]:
        out = []
        for i, item in enumerate(self.seq(value, path)):
            p = f"{path}[{i}]"
            d = self.mapping(item, p, ("at", "corrected", "uncorrected"), required=("at",))
            out.append(
                EccIncrement(
                    self.num(d["at"], f"{p}.at", low=0),
                    self.integer(d.get("corrected", 0), f"{p}.corrected", low=0),
                    self.integer(d.get("uncorrected", 0), f"{p}.uncorrected", low=0),
                )
            )
        return tuple(sorted(out, key=lambda e: e.at_seconds))

    def remaps(self, value: Any, model: GpuModel, path: str) -> tuple[RemapState, ...]:
        items = self.seq(value, path)
        if items and not model.row_remap_supported:
            raise self.fail(path, f"{model.key} has no row remapper (Ampere and newer only)")
        out = []
        for i, item in enumerate(items):
            p = f"{path}[{i}]"
            d = self.mapping(
                item, p, ("at", "correctable", "uncorrectable", "pending", "failed"), required=("at",)
            )
            out.append(
                RemapState(
                    self.num(d["at"], f"{p}.at", low=0),
                    self.integer(d.get("correctable", 0), f"{p}.correctable", low=0),
                    self.integer(d.get("uncorrectable", 0), f"{p}.uncorrectable", low=0),
                    self.boolean(d.get("pending", False), f"{p}.pending"),
                    self.boolean(d.get("failed", False), f"{p}.failed"),
                )
            )
        return tuple(sorted(out, key=lambda r: r.at_seconds))

    def mig(
        self, value: Any, model: GpuModel, gpu_uuid: str, path: str
    ) -> tuple[MigInstanceSpec, ...] | None:
        if value is None:
            return None
        d = self.mapping(value, path, ("enabled", "instances"))
        if not self.boolean(d.get("enabled", True), f"{path}.enabled"):
            return None
        if not model.mig_supported:
            raise self.fail(path, f"{model.key} does not support MIG")
        items = self.seq(d.get("instances"), f"{path}.instances")
        if len(items) > model.mig_max_devices:
            raise self.fail(
                f"{path}.instances", f"{model.key} has at most {model.mig_max_devices} MIG devices"
            )
        profiles = {p.name: p for p in model.mig_profiles}
        out: list[MigInstanceSpec] = []
        seen: set[tuple[int, int]] = set()
        for i, item in enumerate(items):
            p = f"{path}.instances[{i}]"
            allowed = (
                "profile", "gpu_instance_id", "compute_instance_id", "uuid", "memory_total_bytes",
                "memory_used_bytes", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
            )  # fmt: skip
            m = self.mapping(item, p, allowed, required=("profile",))
            prof_name = self.string(m["profile"], f"{p}.profile")
            prof = profiles.get(prof_name)
            if prof is None:
                raise self.fail(
                    f"{p}.profile", f"unknown profile for {model.key} (known: {', '.join(profiles)})"
                )
            gi = self.integer(m.get("gpu_instance_id", i + 1), f"{p}.gpu_instance_id", low=0)
            ci = self.integer(m.get("compute_instance_id", 0), f"{p}.compute_instance_id", low=0)
            if (gi, ci) in seen:
                raise self.fail(p, f"duplicate gpu_instance_id/compute_instance_id ({gi}, {ci})")
            seen.add((gi, ci))
            total = (
                int(self.size(m["memory_total_bytes"], f"{p}.memory_total_bytes"))
                if "memory_total_bytes" in m
                else prof.memory_bytes
            )
            used = (
                self.curve(m["memory_used_bytes"], f"{p}.memory_used_bytes", 0, total, sizes=True)
                if "memory_used_bytes" in m
                else None
            )
            sm = self.curve(m.get("sm_active", 0.0), f"{p}.sm_active", 0.0, 1.0)
            occ = (
                self.curve(m["sm_occupancy"], f"{p}.sm_occupancy", 0.0, 1.0)
                if "sm_occupancy" in m
                else sm.affine(0.0, 0.55)
            )
            ten = (
                self.curve(m["tensor_active"], f"{p}.tensor_active", 0.0, 1.0)
                if "tensor_active" in m
                else sm.affine(0.0, 0.5)
            )
            dram = (
                self.curve(m["dram_active"], f"{p}.dram_active", 0.0, 1.0)
                if "dram_active" in m
                else sm.affine(0.0, 0.4)
            )
            mig_uuid = (
                self.string(m["uuid"], f"{p}.uuid")
                if "uuid" in m
                else "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{gpu_uuid}/{gi}/{ci}"))
            )
            out.append(MigInstanceSpec(i, prof_name, gi, ci, mig_uuid, total, used, sm, occ, ten, dram))
        return tuple(out)

    def nvlink(self, value: Any, model: GpuModel, path: str) -> NvLinkSpec | None:
        if value is None:
            return None
        d = self.mapping(value, path, ("links", "peers", "switch", "down_links"))
        if model.nvlink_count == 0:
            raise self.fail(path, f"{model.key} has no NVLink")
        links = self.integer(
            d.get("links", model.nvlink_count), f"{path}.links", low=0, high=model.nvlink_count
        )
        switch = self.boolean(d.get("switch", False), f"{path}.switch")
        peers = []
        for i, item in enumerate(self.seq(d.get("peers"), f"{path}.peers")):
            p = f"{path}.peers[{i}]"
            m = self.mapping(item, p, ("link", "peer_gpu_index"), required=("link", "peer_gpu_index"))
            peers.append(
                NvLinkPeer(
                    self.integer(m["link"], f"{p}.link", low=0, high=links - 1),
                    self.integer(m["peer_gpu_index"], f"{p}.peer_gpu_index", low=0),
                )
            )
        if switch and peers:
            raise self.fail(f"{path}.peers", "give either peers or switch: true, not both")
        down = tuple(
            self.integer(x, f"{path}.down_links[{i}]", low=0, high=max(links - 1, 0))
            for i, x in enumerate(self.seq(d.get("down_links"), f"{path}.down_links"))
        )
        return NvLinkSpec(links, tuple(peers), switch, down)

    def check_nvlink(self, gpu: GpuSpec, n_gpus: int) -> None:
        if gpu.nvlink is None:
            return
        used: set[int] = set()
        for i, peer in enumerate(gpu.nvlink.peers):
            p = f"gpus[{gpu.index}].nvlink.peers[{i}]"
            if peer.peer_gpu_index >= n_gpus or peer.peer_gpu_index == gpu.index:
                raise self.fail(f"{p}.peer_gpu_index", f"no other GPU with index {peer.peer_gpu_index}")
            if peer.link in used:
                raise self.fail(f"{p}.link", f"link {peer.link} is listed twice")
            used.add(peer.link)

    def process(self, value: Any, gpus: list[GpuSpec], path: str) -> ProcessSpec:
        allowed = (
            "pid",
            "gpu",
            "mig_instance",
            "name",
            "start",
            "end",
            "memory_bytes",
            "sm_utilization",
            "type",
            "host_cpu_cores",
            "io_read_bytes_per_second",
            "io_write_bytes_per_second",
            "host_state",
        )
        d = self.mapping(value, path, allowed, required=("pid", "gpu"))
        pid = self.integer(d["pid"], f"{path}.pid", low=1)
        gpu = self.integer(d["gpu"], f"{path}.gpu", low=0, high=len(gpus) - 1)
        mig_instance = None
        if d.get("mig_instance") is not None:
            instances = gpus[gpu].mig
            if instances is None:
                raise self.fail(f"{path}.mig_instance", f"GPU {gpu} is not in MIG mode")
            mig_instance = self.integer(
                d["mig_instance"], f"{path}.mig_instance", low=0, high=len(instances) - 1
            )
        elif gpus[gpu].mig is not None:
            raise self.fail(f"{path}.mig_instance", f"GPU {gpu} is in MIG mode: say which instance (index)")
        start = self.opt_time(d, "start", path, 0.0)
        end = self.opt_time(d, "end", path, INF)
        if end <= start:
            raise self.fail(f"{path}.end", f"must be after start ({end:g} <= {start:g})")
        ptype = d.get("type", "compute")
        if ptype not in PROCESS_TYPES:
            raise self.fail(f"{path}.type", f"expected one of {', '.join(PROCESS_TYPES)}, got {ptype!r}")
        return ProcessSpec(
            pid=pid, gpu=gpu, mig_instance=mig_instance, name=str(d.get("name", f"python{pid}")),
            start_seconds=start, end_seconds=end,
            memory_bytes=self.curve(d.get("memory_bytes", 0), f"{path}.memory_bytes", 0, sizes=True),
            sm_utilization=self.curve(d.get("sm_utilization", 0.0), f"{path}.sm_utilization", 0.0, 1.0),
            type=ptype,
            host_cpu_cores=self.curve(d.get("host_cpu_cores", 0.0), f"{path}.host_cpu_cores", 0.0, 1024.0),
            io_read_bytes_per_second=self.curve(
                d.get("io_read_bytes_per_second", 0.0), f"{path}.io_read_bytes_per_second", 0.0, sizes=True
            ),
            io_write_bytes_per_second=self.curve(
                d.get("io_write_bytes_per_second", 0.0), f"{path}.io_write_bytes_per_second", 0.0, sizes=True
            ),
            host_state=self.host_states(d.get("host_state", ()), f"{path}.host_state"),
        )  # fmt: skip

    def host_states(self, value: Any, path: str) -> tuple[tuple[float, str], ...]:
        """`sleeping`, or [[t, state], ...]: the state from each time on (times not decreasing)."""

        def name(v: Any, p: str) -> str:
            if v not in STATE_NAMES:
                raise self.fail(p, f"expected one of {', '.join(STATE_NAMES)}, got {v!r}")
            return str(v)

        if isinstance(value, str):
            return ((0.0, name(value, path)),)
        if not isinstance(value, (list, tuple)):
            raise self.fail(path, f"expected a state or a list of [t, state] pairs, got {value!r}")
        out: list[tuple[float, str]] = []
        for i, point in enumerate(value):
            p = f"{path}[{i}]"
            if not isinstance(point, list) or len(point) != 2:
                raise self.fail(p, f"expected a [t, state] pair, got {point!r}")
            t = self.num(point[0], f"{p}[0]", low=0)
            if out and t < out[-1][0]:
                raise self.fail(f"{p}[0]", f"times must not decrease ({t:g} after {out[-1][0]:g})")
            out.append((t, name(point[1], f"{p}[1]")))
        return tuple(out)

    def event(
        self, value: Any, n_gpus: int, path: str, processes: list[ProcessSpec], duration: float
    ) -> XidEvent:
        allowed = ("at", "gpu", "xid", "count", "repeat_seconds", "until_process_exits")
        d = self.mapping(value, path, allowed, required=("at", "gpu", "xid"))
        gpu = self.integer(d["gpu"], f"{path}.gpu", low=0, high=n_gpus - 1)
        at = self.num(d["at"], f"{path}.at", low=0)
        repeat = None
        if d.get("repeat_seconds") is not None:
            repeat = self.num(d["repeat_seconds"], f"{path}.repeat_seconds", low=0.1)
            if (duration - at) / repeat > 10_000:
                raise self.fail(f"{path}.repeat_seconds", "more than 10000 repeats before the scenario ends")
        pid = None
        if d.get("until_process_exits") is not None:
            pid = self.integer(d["until_process_exits"], f"{path}.until_process_exits", low=1)
            if repeat is None:
                raise self.fail(f"{path}.until_process_exits", "needs repeat_seconds (how often it comes)")
            if not any(p.pid == pid and p.gpu == gpu for p in processes):
                raise self.fail(f"{path}.until_process_exits", f"no process {pid} on GPU {gpu}")
        return XidEvent(
            at,
            gpu,
            self.integer(d["xid"], f"{path}.xid", low=1),
            self.integer(d.get("count", 1), f"{path}.count", low=1, high=10000),
            repeat,
            pid,
        )

    def fault(self, value: Any, n_gpus: int, path: str) -> FaultSpec:
        allowed = ("gpu", "call", "from", "until", "kind", "seconds", "error")
        d = self.mapping(value, path, allowed, required=("gpu", "call", "kind"))
        kind = d["kind"]
        if kind not in FAULT_KINDS:
            raise self.fail(f"{path}.kind", f"expected one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        start = self.opt_time(d, "from", path, 0.0)
        until = self.opt_time(d, "until", path, INF)
        if until <= start:
            raise self.fail(f"{path}.until", f"must be after from ({until:g} <= {start:g})")
        seconds = 0.0
        if kind == "slow":
            if "seconds" not in d:
                raise self.fail(f"{path}.seconds", "a slow fault needs seconds (added latency)")
            seconds = self.num(d["seconds"], f"{path}.seconds", low=0, high=600)
        error = None
        if kind == "error":
            name = d.get("error")
            if name not in FAULT_ERRORS:
                raise self.fail(f"{path}.error", f"expected one of {', '.join(FAULT_ERRORS)}, got {name!r}")
            error = FAULT_ERRORS[name]
        elif "error" in d:
            raise self.fail(f"{path}.error", f"only an error fault takes error (this one is {kind})")
        call = "*" if d["call"] == "*" else self.symbol(d["call"], f"{path}.call")
        return FaultSpec(
            gpu=self.integer(d["gpu"], f"{path}.gpu", low=0, high=n_gpus - 1), call=call,
            from_seconds=start, until_seconds=until, kind=kind, seconds=seconds, error=error,
        )  # fmt: skip


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} {value!r}"
