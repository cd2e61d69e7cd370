"""Runtime state of an installed simulation: devices with precomputed tables, waits, handles."""

from __future__ import annotations

import itertools
import threading
import time
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from exporter.errors import ReleasedError
from exporter.sim.clock import ManualClock, RealClock
from exporter.sim.curve import Curve
from exporter.sim.scenario_types import (
    INF,
    FaultSpec,
    GpuSpec,
    MigInstanceSpec,
    ProcessSpec,
    RemapState,
    Scenario,
    XidEvent,
)
from gpupulse.clock import Clock

GPU_HANDLE_BASE = 0x5100_0000
HANDLE_STRIDE = 0x100
EVENT_SET_BASE = 0x5E00_0000
GPM_SAMPLE_BASE = 0x5A00_0000
# Process utilization samples are taken on this grid of scenario time (the driver's is 1/6 s to 1 s)
PROCESS_SAMPLE_PERIOD_SECONDS = 1.0 / 6.0
# Longest real-time sleep inside one wait step, so clocks that never notify still make progress
_MAX_WAIT_STEP_SECONDS = 0.25


class _Series:
    """A step function over scenario time: the value of the last point at or before t."""

    __slots__ = ("_ts", "_vs")

    def __init__(self, points: list[tuple[float, int]]) -> None:
        self._ts = [t for t, _ in points]
        self._vs = [v for _, v in points]

    def points(self) -> list[tuple[float, int]]:
        return list(zip(self._ts, self._vs, strict=True))

    def at(self, t: float, default: int = 0) -> int:
        i = bisect_right(self._ts, t)
        return self._vs[i - 1] if i else default


class SimMig:
    """One MIG device: a compute instance inside a GPU instance of `gpu`."""

    is_mig = True

    def __init__(self, gpu: SimGpu, spec: MigInstanceSpec, handle: int, processes: list[ProcessSpec]) -> None:
        self.gpu = gpu
        self.spec = spec
        self.handle = handle
        self.processes = processes

    def memory_used_bytes(self, t: float) -> int:
        """Allocated memory of this instance at t."""
        if self.spec.memory_used_bytes is not None:
            return int(self.spec.memory_used_bytes.at(t))
        used = sum(int(p.memory_bytes.at(t)) for p in self.processes if p.start_seconds <= t < p.end_seconds)
        return min(used, self.spec.memory_total_bytes)


class SimGpu:
    """One physical GPU: its spec, handle and tables precomputed for O(log n) reads."""

    is_mig = False

    def __init__(
        self, spec: GpuSpec, handle: int, processes: list[ProcessSpec], faults: list[FaultSpec]
    ) -> None:
        self.gpu = self
        self.spec = spec
        self.model = spec.model
        self.index = spec.index
        self.handle = handle
        self.uuid = spec.uuid
        self.lost_at = spec.lost_at_seconds if spec.lost_at_seconds is not None else INF
        self.not_supported = spec.not_supported
        self.faults = tuple(faults)
        self.processes = processes
        self.mig_devices: list[SimMig] = []
        if spec.mig is not None:
            for inst in spec.mig:
                procs = [p for p in processes if p.mig_instance == inst.index]
                self.mig_devices.append(SimMig(self, inst, handle + 1 + inst.index, procs))
        self._build_reason_tables()
        corr = unc = 0
        corr_pts: list[tuple[float, int]] = []
        unc_pts: list[tuple[float, int]] = []
        for inc in spec.ecc:
            corr += inc.corrected
            unc += inc.uncorrected
            corr_pts.append((inc.at_seconds, corr))
            unc_pts.append((inc.at_seconds, unc))
        self._ecc_corrected = _Series(corr_pts)
        self._ecc_uncorrected = _Series(unc_pts)
        self._remap_ts = [r.at_seconds for r in spec.remapped_rows]

    def _build_reason_tables(self) -> None:
        # both set before either is read again: a reader sees the old pair or, after, the new one
        reasons = self._reason_table(self.spec)
        # Accumulated time per clock-event bit: a 0/1 step curve built from the merged mask table
        reason_time: dict[int, Curve] = {}
        for bit in (0x4, 0x10, 0x20, 0x40, 0x80):
            pts: list[tuple[float, float]] = []
            for start, mask in reasons.points():
                before = pts[-1][1] if pts else 0.0
                pts += [(start, before), (start, 1.0 if mask & bit else 0.0)]
            reason_time[bit] = Curve(pts)
        self._reasons, self._reason_time = reasons, reason_time

    def replace_spec(self, spec: GpuSpec) -> None:
        """Play `spec` from now on (its history before now must match the old one: energy and the
        clock-event times integrate from t = 0); rebuilds the clock-event tables."""
        self.spec = spec
        self._build_reason_tables()

    @staticmethod
    def _reason_table(spec: GpuSpec) -> _Series:
        bounds = sorted(
            {0.0}
            | {w.from_seconds for w in spec.clock_event_reasons}
            | {w.until_seconds for w in spec.clock_event_reasons if w.until_seconds != INF}
        )
        points = []
        for b in bounds:
            mask = 0
            for w in spec.clock_event_reasons:
                if w.from_seconds <= b < w.until_seconds:
                    mask |= w.mask
            points.append((b, mask))
        return _Series(points)

    @property
    def mig_enabled(self) -> bool:
        """Whether the scenario puts this GPU in MIG mode."""
        return self.spec.mig is not None

    def live_processes(self, t: float, ptype: str) -> Iterator[ProcessSpec]:
        """Processes of one type running at t."""
        for p in self.processes:
            if p.type == ptype and p.start_seconds <= t < p.end_seconds:
                yield p

    def memory_used_bytes(self, t: float) -> int:
        """Allocated memory (NVML v2 `used`) at t, capped so free never goes negative."""
        spec = self.spec
        cap = self.model.memory_total_bytes - self.model.memory_reserved_bytes
        if spec.memory_used_bytes is not None:
            return min(int(spec.memory_used_bytes.at(t)), cap)
        if self.mig_devices:
            used = sum(m.memory_used_bytes(t) for m in self.mig_devices)
        else:
            used = spec.memory_base_bytes + sum(
                int(p.memory_bytes.at(t)) for p in self.processes if p.start_seconds <= t < p.end_seconds
            )
        return min(used, cap)

    def clock_event_mask(self, t: float) -> int:
        """Active nvmlClocksEventReason bits at t; GpuIdle is added when nothing runs."""
        mask = self._reasons.at(t)
        if not mask and self.spec.utilization.at(t) < 0.01:
            mask = 0x1
        return mask

    def clock_event_time_ns(self, bit: int, t: float) -> int:
        """Nanoseconds spent with clock-event `bit` active during [0, t]."""
        curve = self._reason_time.get(bit)
        return int(curve.integral(0.0, t) * 1e9) if curve is not None else 0

    def ecc_counts(self, t: float) -> tuple[int, int]:
        """(corrected, uncorrected) ECC errors accumulated by t."""
        return self._ecc_corrected.at(t), self._ecc_uncorrected.at(t)

    def remap_state(self, t: float) -> RemapState | None:
        """The row-remapper state at t, None before the first entry."""
        i = bisect_right(self._remap_ts, t)
        return self.spec.remapped_rows[i - 1] if i else None

    def energy_millijoules(self, t: float) -> int:
        """Energy since scenario start: the power curve integrated, so it never decreases."""
        return int(self.spec.power_watts.integral(0.0, max(t, 0.0)) * 1000.0)


Device = SimGpu | SimMig


@dataclass
class EventSetState:
    """One nvmlEventSet: queued XID events of the GPUs registered on it, in delivery order."""

    # (at, seq, gpu, xid, pid): with pid >= 0 the event is delivered only while that process lives
    pending: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    pos: int = 0
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> mask


@dataclass
class GpmSampleState:
    """What one nvmlGpmSample_t buffer holds once filled."""

    owner: tuple[int, int | None]  # (gpu index, GPU-instance id or None for the whole device)
    t: float
    # source name -> the curves averaged for it (several compute instances of one GPU instance)
    curves: dict[str, tuple[Curve, ...]]


class SimState:
    """Everything the fake C functions share; the Condition guards events and wakes blocked calls."""

    def __init__(self, scenario: Scenario, clock: Clock) -> None:
        self.scenario = scenario
        self.clock = clock
        self.cond = threading.Condition()
        self.released = False
        self.init_count = 0
        # Process-utilization timestamps are wall-clock microseconds at scenario t=0
        self.epoch_us = int(time.time() * 1e6 - clock.monotonic() * 1e6)
        self.gpus: list[SimGpu] = []
        self.by_handle: dict[int, Device] = {}
        self.by_uuid: dict[bytes, Device] = {}
        self.by_bus: dict[bytes, SimGpu] = {}
        for spec in scenario.gpus:
            procs = [p for p in scenario.processes if p.gpu == spec.index]
            faults = [f for f in scenario.faults if f.gpu == spec.index]
            gpu = SimGpu(spec, GPU_HANDLE_BASE + spec.index * HANDLE_STRIDE, procs, faults)
            self.gpus.append(gpu)
            self.by_handle[gpu.handle] = gpu
            self.by_uuid[gpu.uuid.encode()] = gpu
            self.by_bus[spec.pci_bus_id.upper().encode()] = gpu
            for mig in gpu.mig_devices:
                self.by_handle[mig.handle] = mig
                self.by_uuid[mig.spec.uuid.encode()] = mig
        self.process_names = {p.pid: p.name for p in scenario.processes}
        # job name -> its run now (0: the scenario's own; n: after the n-th gang restart)
        self.job_attempts: dict[str, int] = {}
        self.event_sets: dict[int, EventSetState] = {}
        self.gpm_samples: dict[int, GpmSampleState | None] = {}
        self._ids = itertools.count(1)
        self._seq = itertools.count()

    def new_id(self) -> int:
        """A fresh small integer for opaque handles."""
        return next(self._ids)

    def xid_events_for(self, gpu: SimGpu, since: float) -> list[tuple[float, int, int, int, int]]:
        """Queue entries for `gpu`'s XIDs at or after `since` (registration drops earlier ones)."""
        events: list[XidEvent] = [e for e in self.scenario.events if e.gpu == gpu.index]
        out = []
        end = self.scenario.duration_seconds
        for e in events:
            times = [e.at_seconds]
            if e.repeat_seconds is not None:
                n = int((end - e.at_seconds) // e.repeat_seconds)
                times = [e.at_seconds + k * e.repeat_seconds for k in range(n + 1)]
            pid = e.until_process_exits if e.until_process_exits is not None else -1
            for at in times:
                if at >= since:
                    out += [(at, next(self._seq), gpu.index, e.xid, pid) for _ in range(e.count)]
        if gpu.spec.xid_on_loss and gpu.lost_at >= since:
            out.append((gpu.lost_at, next(self._seq), gpu.index, 79, -1))
        return out

    def process_alive(self, gpu_index: int, pid: int, t: float) -> bool:
        """Whether the process runs on the GPU at scenario time t (as restarts left it)."""
        return any(
            p.pid == pid and p.start_seconds <= t < p.end_seconds for p in self.gpus[gpu_index].processes
        )

    def wait_step(self, real_timeout: float, clock_target: float | None) -> None:
        """One bounded wait on the condition (caller holds it) for at most `real_timeout` seconds."""
        step = real_timeout
        if clock_target is not None:
            clock = self.clock
            if isinstance(clock, RealClock):
                step = min(step, max((clock_target - clock.monotonic()) / clock.speed, 0.0) + 0.001)
            elif not isinstance(clock, ManualClock):
                step = min(step, 0.01)
        self.cond.wait(min(step, _MAX_WAIT_STEP_SECONDS))

    def block_until(self, clock_target: float) -> None:
        """Block in real time until the scenario clock reaches `clock_target`; raises ReleasedError."""
        with self.cond:
            while not self.released and self.clock.monotonic() < clock_target:
                self.wait_step(_MAX_WAIT_STEP_SECONDS, clock_target)
            if self.released:
                raise ReleasedError

    def sleep_real(self, seconds: float) -> None:
        """Sleep `seconds` of real time unless released first; raises ReleasedError."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while not self.released:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self.cond.wait(min(remaining, _MAX_WAIT_STEP_SECONDS))
            raise ReleasedError

    def wake(self) -> None:
        """Wake every waiter so it re-reads the clock."""
        with self.cond:
            self.cond.notify_all()

    def release(self) -> None:
        """Make every blocked and future blocking call return at once."""
        with self.cond:
            self.released = True
            self.cond.notify_all()
