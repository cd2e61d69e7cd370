"""The typed, precomputed form of a scenario file: what the simulation runs on (its error: exporter.errors).

exporter.sim.scenario parses YAML into these; the simulation's runtime and symbols read them. They
import nothing of the simulation, so the parser may ask the simulation which symbols it implements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exporter.sim.curve import Curve
from exporter.sim.models import GpuModel

INF = float("inf")


@dataclass(frozen=True)
class ClockEventWindow:
    """Clock-event reasons active during [from_seconds, until_seconds)."""

    from_seconds: float
    until_seconds: float
    reasons: tuple[str, ...]
    mask: int


@dataclass(frozen=True)
class EccIncrement:
    """ECC error counts added at `at_seconds`."""

    at_seconds: float
    corrected: int
    uncorrected: int


@dataclass(frozen=True)
class RemapState:
    """Row-remapper state from `at_seconds` on (absolute values, not increments)."""

    at_seconds: float
    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class MigInstanceSpec:
    """One MIG device (a compute instance inside a GPU instance)."""

    index: int
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: Curve | None
    sm_active: Curve
    sm_occupancy: Curve
    tensor_active: Curve
    dram_active: Curve


@dataclass(frozen=True)
class NvLinkPeer:
    """A direct NVLink from `link` to the GPU with index `peer_gpu_index`."""

    link: int
    peer_gpu_index: int


@dataclass(frozen=True)
class NvLinkSpec:
    """NVLink wiring of one GPU: direct peers, or every link to an NVSwitch."""

    links: int
    peers: tuple[NvLinkPeer, ...]
    switch: bool
    down_links: tuple[int, ...]


@dataclass(frozen=True)
class GpuSpec:
    """One simulated GPU, all curves resolved (defaults filled in)."""

    index: int
    model: GpuModel
    uuid: str
    pci_bus_id: str
    serial: str
    vbios_version: str
    utilization: Curve
    memory_utilization: Curve
    sm_active: Curve
    sm_occupancy: Curve
    tensor_active: Curve
    dram_active: Curve
    memory_used_bytes: Curve | None
    memory_base_bytes: int
    temperature_celsius: Curve
    memory_temperature_celsius: Curve
    power_watts: Curve
    sm_clock_hertz: Curve
    memory_clock_hertz: Curve
    pcie_link_generation: Curve
    pcie_link_width: Curve
    pcie_replay_count: Curve
    pcie_tx_bytes_per_second: Curve
    pcie_rx_bytes_per_second: Curve
    nvlink_tx_bytes_per_second: Curve
    nvlink_rx_bytes_per_second: Curve
    clock_event_reasons: tuple[ClockEventWindow, ...]
    ecc: tuple[EccIncrement, ...]
    remapped_rows: tuple[RemapState, ...]
    lost_at_seconds: float | None
    xid_on_loss: bool
    mig: tuple[MigInstanceSpec, ...] | None
    nvlink: NvLinkSpec | None
    not_supported: frozenset[str]


@dataclass(frozen=True)
class ProcessSpec:
    """A process using one GPU (or one MIG device) during [start_seconds, end_seconds)."""

    pid: int
    gpu: int
    mig_instance: int | None
    name: str
    start_seconds: float
    end_seconds: float
    memory_bytes: Curve
    sm_utilization: Curve
    type: str
    # CPU cores the process uses on the host over time (for /proc/<pid>/stat in fakes and the demo)
    host_cpu_cores: Curve = field(default_factory=lambda: Curve.constant(0.0))

    # bytes per second through read()/write() system calls (rchar, wchar of /proc/<pid>/io in fakes)
    io_read_bytes_per_second: Curve = field(default_factory=lambda: Curve.constant(0.0))
    io_write_bytes_per_second: Curve = field(default_factory=lambda: Curve.constant(0.0))
    # scheduler state (/proc/<pid>/stat field 3, by name) from each time on; "sleeping" before the first
    host_state: tuple[tuple[float, str], ...] = ()
    # the training job and rank this process is (a `jobs` entry made it), else None
    job: str | None = None
    rank: int | None = None

    def host_cpu_seconds(self, t: float) -> float:
        """Host CPU seconds the process has used by scenario time t."""
        return self._integral(self.host_cpu_cores, t)

    def io_read_bytes(self, t: float) -> int:
        """Bytes the process has read through system calls by scenario time t."""
        return int(self._integral(self.io_read_bytes_per_second, t))

    def io_write_bytes(self, t: float) -> int:
        """Bytes the process has written through system calls by scenario time t."""
        return int(self._integral(self.io_write_bytes_per_second, t))

    def host_state_at(self, t: float) -> str:
        """The process's scheduler state at scenario time t (a name of gpu_process_state{state})."""
        state = "sleeping"
        for at, name in self.host_state:
            if at > t:
                break
            state = name
        return state

    def _integral(self, curve: Curve, t: float) -> float:
        if t <= self.start_seconds:
            return 0.0
        return curve.integral(self.start_seconds, min(t, self.end_seconds))


@dataclass(frozen=True)
class XidEvent:
    """`count` XID events with code `xid` on GPU `gpu`, deliverable from `at_seconds`.

    With `repeat_seconds`, the events come again every that many seconds, up to the scenario's end or,
    with `until_process_exits`, until that process ends: an application XID (13, 31, 43) keeps
    coming until the process that triggers it is restarted, also when the demo restarts it.
    """

    at_seconds: float
    gpu: int
    xid: int
    count: int
    repeat_seconds: float | None = None
    until_process_exits: int | None = None


@dataclass(frozen=True)
class FaultSpec:
    """A misbehaving NVML call on one GPU during [from_seconds, until_seconds)."""

    gpu: int
    call: str
    from_seconds: float
    until_seconds: float
    kind: str
    seconds: float
    error: int | None


@dataclass(frozen=True)
class WorkShape:
    """What a rank's GPU shows in one state: kernel residency, SM and tensor activity, power, traffic."""

    utilization: float
    sm_active: float
    tensor_active: float
    power_watts: float
    nvlink_bytes_per_second: float  # each way, all links
    pcie_tx_bytes_per_second: float
    pcie_rx_bytes_per_second: float

    def mix(self, other: WorkShape, share: float) -> WorkShape:
        """`share` of the time like self, the rest like other (a step that computes, then waits)."""
        names = self.__dataclass_fields__
        values = {n: share * getattr(self, n) + (1.0 - share) * getattr(other, n) for n in names}
        return WorkShape(**values)


@dataclass(frozen=True)
class RankSpec:
    """One rank of a job on this node: its GPU and its first process."""

    rank: int
    gpu: int
    pid: int


# Job event kinds; `rank` is any rank of the job (on this node or another) except for `complete`
JOB_EVENT_KINDS = ("exit", "stall", "slow", "container_restart", "new_process", "complete")


@dataclass(frozen=True)
class JobEvent:
    """Something that happens to a job or one rank at `at_seconds` (until `until_seconds` for stall/slow).

    exit: the rank's process dies. stall: alive with no GPU work (`host_state`, `host_cpu_cores`, I/O
    as given). slow: the rank steps at `ratio` of the others' speed (its SM clock at `sm_clock_hertz`,
    held by `reasons`). container_restart: its process exits, `pid` starts `after_seconds` later in the
    same pod and waits in rendezvous (no kernel) for a collective the others never leave. new_process:
    `pid` starts beside the rank's process on its GPU. complete: every rank exits (the job finished).
    """

    at_seconds: float
    kind: str
    rank: int | None = None
    until_seconds: float = INF
    pid: int | None = None
    after_seconds: float = 0.0
    ratio: float = 1.0
    sm_clock_hertz: float | None = None
    reasons: tuple[str, ...] = ()
    reasons_mask: int = 0
    host_state: str = "sleeping"
    host_cpu_cores: float = 0.0
    io_bytes_per_second: float = 0.0
    memory_bytes: float = 0.0
    attempt: int = 0


@dataclass(frozen=True)
class JobSpec:
    """A training job's ranks on this node, and how they behave together (see exporter/sim/jobs.py)."""

    name: str
    coupled: bool
    world_size: int
    ranks: tuple[RankSpec, ...]
    compute: WorkShape
    spin: WorkShape
    memory_bytes: float
    process_name: str
    rendezvous_seconds: float
    rendezvous_memory_bytes: float
    events: tuple[JobEvent, ...]

    def events_of(self, attempt: int) -> tuple[JobEvent, ...]:
        """The events of one run of the job (0: as the scenario starts; n: after its n-th gang restart)."""
        return tuple(e for e in self.events if e.attempt == attempt)


@dataclass(frozen=True)
class SchedulerSpec:
    """The scheduler stand-in: how long a gang restart takes, and where the world posts restarts."""

    delay_seconds: float
    inbox: str | None  # a file the sim reads restart commands from (exporter/sim/lifecycle.py), or None


@dataclass(frozen=True)
class Scenario:
    """A whole validated scenario file."""

    name: str
    description: str
    duration_seconds: float
    node: str
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuSpec, ...]
    processes: tuple[ProcessSpec, ...]
    events: tuple[XidEvent, ...]
    faults: tuple[FaultSpec, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"
    jobs: tuple[JobSpec, ...] = ()
    scheduler: SchedulerSpec = SchedulerSpec(20.0, None)
