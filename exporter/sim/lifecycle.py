"""A gang restart in a running simulation, and the inbox a simulated node reads restarts from.

When a controller restarts a training job, its pods are deleted (their processes die) and the owner
recreates them; the scheduler stand-in (the replay rig, tests/alerts/training_rig.py) places the new
pods on free GPUs after the scenario's `scheduler.delay_seconds` and tells the simulated node where:
`restart_gang` ends the job's processes at the deletion, leaves its GPUs idle until the new ranks
start, then plays the job's next run (its events of that attempt; none: it trains) on the new GPUs.

A node simulated in another process (`gpupulse-exporter --simulate`) gets the same call through
its scenario's `scheduler.inbox`: one JSON object per line,

    {"op": "restart_gang", "job": "llama-x", "deleted_at": 120.5, "start_at": 140.5,
     "ranks": [{"rank": 8, "gpu": 0, "pid": 19008}, ...]}

times in scenario seconds. A line that is not such a command is logged and skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from exporter.errors import InterventionError
from exporter.sim.curve import Curve
from exporter.sim.jobs import JOB_CURVES, idle_shape, plan_attempt
from exporter.sim.runtime import SimState
from exporter.sim.scenario_types import INF, ClockEventWindow, JobSpec, Scenario
from gpupulse.clock import Clock

log = logging.getLogger(__name__)


class Simulation(Protocol):
    """What a restart changes of an installed simulation (exporter.sim.library.SimulatedNvml)."""

    scenario: Scenario
    clock: Clock
    state: SimState


# How often the inbox file is looked at (real seconds); a restart is applied at its own scenario time
INBOX_POLL_SECONDS = 0.05
# A line longer than this is no command (and is not kept in memory whole)
MAX_LINE_BYTES = 64 << 10


def splice(old: Curve, at: float, new: Curve) -> Curve:
    """`old` before `at`, `new` from `at` on (a step at `at`)."""
    before = [(t, v) for t, v in old.points if t < at]
    after = [(t, v) for t, v in new.points if t > at]
    return Curve([*before, (at, old.at(at)), (at, new.at(at)), *after])


def _clip(windows: tuple[ClockEventWindow, ...], at: float) -> list[ClockEventWindow]:
    out = []
    for w in windows:
        if w.from_seconds < at:
            out.append(dataclasses.replace(w, until_seconds=min(w.until_seconds, at)))
    return out


def restart_gang(
    sim: Simulation,
    job_name: str,
    deleted_at: float,
    start_at: float,
    placements: Mapping[int, tuple[int, int]],
) -> int:
    """Restart `job_name` on this node: its processes end at `deleted_at`, the ranks in `placements`
    (rank -> (GPU index, new pid)) start at `start_at`; returns the new run's attempt number.

    Times before now are taken as now (a restart cannot change what was already read). Raises
    InterventionError for an unknown job, a GPU in use by another process, or a pid in use."""
    state = sim.state
    job = _job(sim, job_name)
    now = sim.clock.monotonic()
    at = max(deleted_at, now)
    start = max(start_at, at)
    gpus = state.gpus
    for rank, (gpu, pid) in placements.items():
        if not 0 <= rank < job.world_size:
            raise InterventionError(f"job {job_name} has no rank {rank} (world size {job.world_size})")
        if not 0 <= gpu < len(gpus) or gpus[gpu].mig_enabled:
            raise InterventionError(f"no whole GPU {gpu} for rank {rank}")
        if any(p.pid == pid for g in gpus for p in g.processes):
            raise InterventionError(f"PID {pid} is already used")
        busy = [p.pid for p in gpus[gpu].processes if p.job != job_name and p.end_seconds > start]
        if busy:
            raise InterventionError(f"GPU {gpu} is not free: process {busy[0]} runs there")
    if len({g for g, _ in placements.values()}) != len(placements):
        raise InterventionError("two ranks placed on one GPU")
    with state.cond:
        attempt = state.job_attempts.get(job_name, 0) + 1
        state.job_attempts = {**state.job_attempts, job_name: attempt}
    models = {g.index: g.model for g in gpus}
    plan = plan_attempt(job, attempt, start, placements, models)
    used = {g.index for g in gpus if any(p.job == job_name for p in g.processes)} | set(plan.gpus)
    for sim_gpu in (gpus[i] for i in sorted(used)):
        spec = sim_gpu.spec
        gp = plan.gpus.get(sim_gpu.index)
        if gp is None:
            idle = idle_shape(sim_gpu.model)
            new_curves = {name: Curve.constant(0.0) for name in JOB_CURVES}
            new_curves["power_watts"] = Curve.constant(idle.power_watts)
            new_curves["sm_clock_hertz"] = Curve.constant(sim_gpu.model.sm_clock_idle_hertz)
            new_curves["temperature_celsius"] = Curve.constant(32.0)
            new_curves["memory_temperature_celsius"] = Curve.constant(36.0)
            windows: tuple[ClockEventWindow, ...] = ()
        else:
            new_curves, windows = gp.curves, gp.clock_windows
        changes: dict[str, Any] = {name: splice(getattr(spec, name), at, c) for name, c in new_curves.items()}
        changes["clock_event_reasons"] = (*_clip(spec.clock_event_reasons, at), *windows)
        kept = []
        for p in sim_gpu.processes:
            if p.job != job_name:
                kept.append(p)
            elif p.start_seconds < at:  # one that had not started by the deletion never will
                kept.append(dataclasses.replace(p, end_seconds=min(p.end_seconds, at)))
        sim_gpu.replace_spec(dataclasses.replace(spec, **changes))
        sim_gpu.processes = kept + [p for p in plan.processes if p.gpu == sim_gpu.index]
    state.process_names = {**state.process_names, **{p.pid: p.name for p in plan.processes}}
    log.info(
        "simulated gang restart of %s (attempt %d): processes end at %.1f s, %d ranks start at %.1f s",
        job_name, attempt, at, len(placements), start,
    )  # fmt: skip
    return attempt


def _job(sim: Simulation, name: str) -> JobSpec:
    for job in sim.scenario.jobs:
        if job.name == name:
            return job
    known = ", ".join(j.name for j in sim.scenario.jobs) or "none"
    raise InterventionError(f"no job {name!r} in this scenario (jobs: {known})")


def apply_command(sim: Simulation, command: Any) -> int:
    """Carry out one inbox command (a parsed JSON object); raises InterventionError naming the field."""
    if not isinstance(command, dict):
        raise InterventionError("a command is a JSON object")
    if command.get("op") != "restart_gang":
        raise InterventionError(f"op: expected 'restart_gang', got {command.get('op')!r}")
    job = command.get("job")
    if not isinstance(job, str) or not job:
        raise InterventionError("job: expected a job name")
    times = {}
    for key in ("deleted_at", "start_at"):
        value = command.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < INF:
            raise InterventionError(f"{key}: expected scenario seconds, got {value!r}")
        times[key] = float(value)
    ranks = command.get("ranks")
    if not isinstance(ranks, list):
        raise InterventionError("ranks: expected a list of {rank, gpu, pid}")
    placements: dict[int, tuple[int, int]] = {}
    for i, item in enumerate(ranks):
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), int) and not isinstance(item.get(k), bool) and item[k] >= 0
            for k in ("rank", "gpu", "pid")
        ):
            raise InterventionError(f"ranks[{i}]: expected {{rank, gpu, pid}} of integers >= 0, got {item!r}")
        if item["rank"] in placements:
            raise InterventionError(f"ranks[{i}].rank: rank {item['rank']} is placed twice")
        placements[item["rank"]] = (item["gpu"], item["pid"])
    return restart_gang(sim, job, times["deleted_at"], times["start_at"], placements)


class Inbox:
    """Reads commands appended to a file and applies them to a simulation, on its own thread."""

    def __init__(self, sim: Simulation, path: str) -> None:
        self.sim = sim
        self.path = path
        self.applied = 0
        self.rejected = 0
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-inbox", daemon=True)

    def start(self) -> None:
        """Begin reading (the file may not exist yet)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop reading; returns once the thread has ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(INBOX_POLL_SECONDS):
            self.poll()

    def poll(self) -> None:
        """Apply every complete line appended since the last poll."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(MAX_LINE_BYTES * 4)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("simulation inbox %s unreadable: %s", self.path, exc)
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > MAX_LINE_BYTES:
            log.warning("simulation inbox %s: a line over %d bytes skipped", self.path, MAX_LINE_BYTES)
            self._partial = b""
            self.rejected += 1
        for line in lines:
            if line.strip():
                self._apply(line)

    def _apply(self, line: bytes) -> None:
        try:
            command = json.loads(line)
            apply_command(self.sim, command)
            self.applied += 1
        except (ValueError, InterventionError) as exc:  # JSON errors are ValueErrors
            self.rejected += 1
            log.warning("simulation inbox %s: command skipped: %s", os.path.basename(self.path), exc)
