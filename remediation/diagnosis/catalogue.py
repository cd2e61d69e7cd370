"""The signals a diagnosis reads, per layer, as data: one PromQL template per signal, the direction
that makes it a cause, and the level past which it is a fault by itself.

Metric names are those of docs/metrics.md and the recording rules of alerts/recording.rules.yaml
(a test checks every name used here against both). node_exporter's and kube-state-metrics' series
are optional neighbours: a signal that only they feed is reported missing, never guessed.

Placeholders: {namespace} {pod} {model} {node} are label values; {uuids} is a regex alternation of
the incident's GPU UUIDs. Every value is escaped for a PromQL double-quoted string when rendered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from remediation.diagnosis.types import Direction, Layer

_PLACEHOLDER = re.compile(r"\{(namespace|pod|model|node|uuids)\}")


@dataclass(frozen=True)
class Gate:
    """When the level after a change is a fault by itself. All given bounds must hold."""

    at_least: float | None = None  # after >= at_least
    at_most: float | None = None  # after <= at_most
    min_delta: float = 0.0  # |after - before| >= min_delta
    min_relative: float = 0.0  # |after - before| / |before| >= min_relative (before 0: any rise)

    def passes(self, before: float, after: float) -> bool:
        if self.at_least is not None and not after >= self.at_least:
            return False
        if self.at_most is not None and not after <= self.at_most:
            return False
        delta = abs(after - before)
        if delta < self.min_delta:
            return False
        if self.min_relative > 0 and before != 0 and delta / abs(before) < self.min_relative:
            return False
        return True

    def describe(self) -> str:
        parts = []
        if self.at_least is not None:
            parts.append(f">= {self.at_least:g}")
        if self.at_most is not None:
            parts.append(f"<= {self.at_most:g}")
        if self.min_delta:
            parts.append(f"a change of at least {self.min_delta:g}")
        if self.min_relative:
            parts.append(f"a change of at least {self.min_relative:.0%}")
        return " and ".join(parts) or "any change"


@dataclass(frozen=True)
class Signal:
    """One series to read over the onset window."""

    id: str
    title: str
    query: str
    direction: Direction
    gate: Gate = Gate()
    # a rate()/increase() over a window spreads a step over it; the change-point lands about half
    # way, so this much is taken off the estimated change time
    lag_seconds: float = 0.0
    source: str = "gpupulse"  # or "node_exporter": optional, its absence is not a gap in gpupulse

    def needs(self) -> frozenset[str]:
        return frozenset(_PLACEHOLDER.findall(self.query))

    def render(self, values: Mapping[str, str]) -> str | None:
        """The query with its placeholders filled; None when one of them has no value."""
        if any(not values.get(name) for name in self.needs()):
            return None

        def sub(m: re.Match[str]) -> str:
            value = values[m.group(1)]
            return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

        return _PLACEHOLDER.sub(sub, self.query)


@dataclass(frozen=True)
class Requirement:
    """A level around the onset without which the cause cannot have made the symptom (a neighbour
    cannot slow a pod that had no GPU work). Levels are the signal's medians over the before and
    after windows on either side of the onset; all given bounds must hold."""

    signal: Signal
    why: str  # what it means, in words: "our process had GPU work before the onset"
    before_at_least: float | None = None
    max_rise: float | None = None  # after - before <= max_rise

    def met(self, before: float, after: float) -> bool:
        if self.before_at_least is not None and not before >= self.before_at_least:
            return False
        return self.max_rise is None or after - before <= self.max_rise

    def describe(self) -> str:
        parts = []
        if self.before_at_least is not None:
            parts.append(f">= {self.before_at_least:g} before the onset")
        if self.max_rise is not None:
            parts.append(f"a rise of at most {self.max_rise:g} across it")
        return " and ".join(parts) or "data"


@dataclass(frozen=True)
class Cause:
    """A candidate cause: scored by its primary signal, strengthened by corroborating ones."""

    id: str  # "<layer>.<name>"
    layer: Layer
    title: str
    primary: Signal
    corroborating: tuple[Signal, ...] = ()
    # a generic explanation (load) yields to a specific one that lines up as well
    weight: float = 1.0
    requires: tuple[Requirement, ...] = ()
    # causes this one brings about when it lines up: a restart leaves the new weight files out of the
    # page cache and the KV cache empty; those candidates are then its effects, not rival causes
    explains: tuple[str, ...] = ()
    # what the controller's own restart or migrate also brings about (a new GPU process, a young pod,
    # a cold start): when it changed in the wake of one of the incident's own actions, it is ours,
    # never the incident's cause (rank.py, RankSettings.own_action_settle_seconds)
    follows_our_actions: bool = False


_U = 'uuid=~"{uuids}"'
_P = 'namespace="{namespace}",pod="{pod}"'


def _others(metric: str) -> str:
    """The GPUs' series of `metric` of every process that is not the pod's: a pod of the same name in
    another namespace is another pod, and a process with no pod labels counts as another too."""
    return f"{metric}{{{_U}}} unless on(namespace, pod) {metric}{{{_U},{_P}}}"


# node_exporter is scraped with a `node` label (our chart) or, in kube-prometheus, with the node's
# name as `instance`; either matches
_NODE_DISK = (
    'sum(rate(node_disk_read_bytes_total{node="{node}"}[2m]))'
    ' or sum(rate(node_disk_read_bytes_total{instance=~"{node}(:[0-9]+)?"}[2m]))'
)
_NODE_CPU = (
    '1 - avg(rate(node_cpu_seconds_total{mode="idle",node="{node}"}[2m]))'
    ' or 1 - avg(rate(node_cpu_seconds_total{mode="idle",instance=~"{node}(:[0-9]+)?"}[2m]))'
)
_NODE_CPU_WAITING = (
    'sum(rate(node_pressure_cpu_waiting_seconds_total{node="{node}"}[2m]))'
    ' or sum(rate(node_pressure_cpu_waiting_seconds_total{instance=~"{node}(:[0-9]+)?"}[2m]))'
)
_RATE_LAG = 60.0  # half of the [2m] rate windows below
# half of the [5m] rate window of the recording rules; not for the p99 rules: a quantile moves as soon
# as 1% of the window's requests are slow, long before the rate has turned over
_RULE_RATE_LAG = 150.0

TEMPERATURE = Signal(
    "gpu_temperature",
    "GPU temperature (°C)",
    f"max(gpu_temperature_celsius{{{_U}}})",
    "up",
    Gate(min_delta=3.0),
)
SM_CLOCK = Signal(
    "gpu_sm_clock",
    "GPU SM clock (Hz)",
    f"min(gpu_sm_clock_hertz{{{_U}}})",
    "down",
    Gate(min_relative=0.1),
)
SM_ACTIVITY_DOWN = Signal(
    "gpu_sm_activity_drop",
    "GPU SM activity falls",
    f"max(uuid:gpu_sm_activity:ratio{{{_U}}})",
    "down",
    Gate(min_delta=0.15),
)
NODE_DISK_READS = Signal(
    "node_disk_reads",
    "node disk reads (bytes/s, node_exporter)",
    _NODE_DISK,
    "up",
    Gate(min_relative=1.0),
    lag_seconds=_RATE_LAG,
    source="node_exporter",
)
NODE_CPU_BUSY = Signal(
    "node_cpu_busy",
    "node CPU busy (ratio, node_exporter)",
    _NODE_CPU,
    "up",
    Gate(min_delta=0.1),
    lag_seconds=_RATE_LAG,
    source="node_exporter",
)
DEVICE_MEMORY = Signal(
    "gpu_memory_used",
    "GPU memory used (ratio of total)",
    f"max(gpu_memory_used_bytes{{{_U}}} / gpu_memory_total_bytes{{{_U}}})",
    "up",
    Gate(min_delta=0.05),
)
PROCESS_HOST_CPU = Signal(
    "process_host_cpu",
    "host CPU of the GPU process (cores)",
    f"max(rate(gpu_process_host_cpu_seconds_total{{{_P}}}[2m]))",
    "up",
    # one core pinned: the single-threaded ceiling of preprocessing, tokenisation, the GIL
    Gate(at_least=0.9, min_delta=0.2),
    lag_seconds=_RATE_LAG,
)
PROCESS_HOST_CPU_DOWN = Signal(
    "process_host_cpu_drop",
    "host CPU of the GPU process falls (cores)",
    PROCESS_HOST_CPU.query,
    "down",
    Gate(min_delta=0.1),
    lag_seconds=_RATE_LAG,
)
NODE_CPU_SATURATED = Signal(
    "node_cpu_saturated",
    "node CPU busy (ratio, node_exporter)",
    _NODE_CPU,
    "up",
    Gate(at_least=0.9, min_delta=0.2),
    lag_seconds=_RATE_LAG,
    source="node_exporter",
)
NODE_CPU_WAITING = Signal(
    "node_cpu_waiting",
    "share of time tasks waited for a CPU (PSI, node_exporter)",
    _NODE_CPU_WAITING,
    "up",
    Gate(min_delta=0.1),
    lag_seconds=_RATE_LAG,
    source="node_exporter",
)
OWN_SM_SHARE = Signal(
    "own_sm_share",
    "the pod's share of the GPU's kernel time",
    f"sum(gpu_process_sm_utilization_ratio{{{_U},{_P}}})",
    "down",
    Gate(min_delta=0.1),
)
SM_ACTIVITY_UP = Signal(
    "gpu_sm_activity_rise",
    "GPU SM activity rises",
    f"max(uuid:gpu_sm_activity:ratio{{{_U}}})",
    "up",
    Gate(min_delta=0.1),
)
POWER_CAP = Signal(
    "power_cap_clock_event",
    "power cap clock event active",
    f'max(gpu_clock_event_active{{{_U},reason="sw_power_cap"}})',
    "up",
    Gate(at_least=0.5),
)
TOP_SM_NEIGHBOUR = Signal(
    "top_sm_neighbour",
    "the other pod taking most of the GPU's kernel time (its labels name it)",
    f"topk(1, sum by (namespace, pod) ({_others('gpu_process_sm_utilization_ratio')}))",
    "up",
    Gate(min_delta=0.2),
)
TOP_MEMORY_NEIGHBOUR = Signal(
    "top_memory_neighbour",
    "the other pod holding most of the GPU's memory (bytes; its labels name it)",
    f"topk(1, sum by (namespace, pod) ({_others('gpu_process_memory_used_bytes')}))",
    "up",
    Gate(min_relative=0.1),
)
# kube-state-metrics: gpupulse does not export pod start times or container restarts
POD_AGE = Signal(
    "pod_age",
    "age of the pod (s, kube-state-metrics kube_pod_start_time)",
    f"time() - max(kube_pod_start_time{{{_P}}})",
    "down",
    Gate(at_most=900.0, min_delta=60.0),
    source="kube-state-metrics",
)
CONTAINER_RESTARTS = Signal(
    "container_restarts",
    "container restarts of the pod (kube-state-metrics)",
    f"sum(kube_pod_container_status_restarts_total{{{_P}}})",
    "up",
    Gate(min_delta=1.0),
    source="kube-state-metrics",
)
COLD_START = Signal(
    "engine_cold_start",
    "cold start of the engine's new process (s; 0 while none measured)",
    # the exporter measures it only for a process it saw start: no series before, one after
    f"max(inference_cold_start_seconds{{{_P}}}) or on() vector(0)",
    "up",
    Gate(min_delta=1.0),
)
REQUESTS_RUNNING = Signal(
    "requests_running",
    "requests in the running batch",
    f"sum(inference_requests_running{{{_P}}})",
    "up",
    Gate(min_relative=0.2),
)

CAUSES: tuple[Cause, ...] = (
    # hardware
    Cause(
        "hardware.thermal_throttle",
        "hardware",
        "thermal throttling",
        Signal(
            "thermal_clock_event",
            "thermal clock event active",
            f'max(gpu_clock_event_active{{{_U},reason=~"sw_thermal_slowdown|hw_thermal_slowdown"}})',
            "up",
            Gate(at_least=0.5),
        ),
        (TEMPERATURE, SM_CLOCK),
    ),
    Cause(
        "hardware.clock_slowdown",
        "hardware",
        "hardware clock slowdown",
        Signal(
            "hw_clock_event",
            "hardware slowdown / power brake clock event active",
            f'max(gpu_clock_event_active{{{_U},reason=~"hw_slowdown|hw_power_brake_slowdown"}})',
            "up",
            Gate(at_least=0.5),
        ),
        (SM_CLOCK,),
    ),
    Cause(
        "hardware.xid",
        "hardware",
        "XID error",
        Signal(
            "xid_errors",
            "XID errors (count)",
            # no series until the first XID: 0 while the GPU itself is reported
            f"sum(gpu_xid_errors_total{{{_U}}}) or on() (0 * max(gpu_up{{{_U}}}))",
            "up",
            Gate(min_delta=1.0),
        ),
    ),
    Cause(
        "hardware.ecc",
        "hardware",
        "uncorrectable ECC errors",
        Signal(
            "ecc_uncorrected",
            "uncorrected ECC errors (count)",
            f'sum(gpu_ecc_errors_total{{{_U},type="uncorrected"}}) or on() (0 * max(gpu_up{{{_U}}}))',
            "up",
            Gate(min_delta=1.0),
        ),
    ),
    Cause(
        "hardware.nvlink",
        "hardware",
        "NVLink link down",
        Signal(
            "nvlink_down",
            "NVLink links down",
            f"sum(1 - gpu_nvlink_up{{{_U}}})",
            "up",
            Gate(at_least=1.0),
        ),
    ),
    Cause(
        "hardware.pcie",
        "hardware",
        "PCIe replays",
        Signal(
            "pcie_replays",
            "PCIe replays (per second)",
            f"sum(rate(gpu_pcie_replays_total{{{_U}}}[2m]))",
            "up",
            Gate(at_least=1.0),
            lag_seconds=_RATE_LAG,
        ),
    ),
    # host
    Cause(
        "host.cpu_starvation",
        "host",
        "GPU starved by host CPU",
        PROCESS_HOST_CPU,
        (SM_ACTIVITY_DOWN, NODE_CPU_BUSY),
    ),
    Cause(
        "host.cpu_contention",
        "host",
        "other processes take the node's CPU",
        NODE_CPU_SATURATED,
        (PROCESS_HOST_CPU_DOWN, SM_ACTIVITY_DOWN, NODE_CPU_WAITING),
        requires=(
            # a node saturated by the GPU process itself is starvation or load, not a neighbour
            Requirement(PROCESS_HOST_CPU, "the GPU process did not take the CPU itself", max_rise=0.2),
        ),
    ),
    Cause(
        "host.page_cache_eviction",
        "host",
        "page-cache eviction",
        Signal(
            "page_cache_residency",
            "model weights resident in the page cache (ratio)",
            f"min(model_weights_page_cache_resident_ratio{{{_P}}})",
            "down",
            Gate(at_most=0.9, min_delta=0.05),
        ),
        (NODE_DISK_READS,),
    ),
    # scheduling
    Cause(
        "scheduling.gpu_memory_neighbour",
        "scheduling",
        "another pod on the GPU takes its memory",
        Signal(
            "neighbour_gpu_memory",
            "GPU memory of other pods on the same GPU (ratio of total)",
            f"(sum({_others('gpu_process_memory_used_bytes')}) or on() vector(0))"
            f" / on() sum(gpu_memory_total_bytes{{{_U}}})",
            "up",
            Gate(min_delta=0.05),
        ),
        (DEVICE_MEMORY, TOP_MEMORY_NEIGHBOUR),
    ),
    Cause(
        "scheduling.gpu_sm_neighbour",
        "scheduling",
        "another pod on the GPU takes its SM time",
        Signal(
            "neighbour_sm_share",
            "share of the GPU's kernel time taken by other pods' processes (time-slicing, MPS)",
            f"sum({_others('gpu_process_sm_utilization_ratio')}) or on() vector(0)",
            "up",
            Gate(at_least=0.3, min_delta=0.2),
        ),
        (OWN_SM_SHARE, TOP_SM_NEIGHBOUR, SM_ACTIVITY_UP, POWER_CAP, TEMPERATURE),
        requires=(
            Requirement(
                Signal("own_sm_level", OWN_SM_SHARE.title, OWN_SM_SHARE.query, "up"),
                "the pod had GPU work to be slowed",
                before_at_least=0.05,
            ),
        ),
    ),
    Cause(
        "scheduling.memory_limit",
        "scheduling",
        "GPU memory past its learned limit",
        Signal(
            "memory_over_soft_limit",
            "GPU memory of the workload over its learned soft limit (ratio)",
            f"max(namespace_workload_pod:gpu_process_memory_used_bytes:sum{{{_P}}}"
            " / on(cluster, namespace, workload) group_left()"
            " namespace_workload:gpu_process_memory_soft_limit_bytes:quantile)",
            "up",
            Gate(at_least=1.0),
        ),
        (DEVICE_MEMORY,),
    ),
    # serving
    Cause(
        "serving.load",
        "serving",
        "load",
        Signal(
            "request_rate",
            "requests served (per second)",
            # classic `_count`, or the native histogram a Prometheus 3 converting classic histograms
            # stores in its place; per series, so where both are kept each series counts once
            f"sum(rate(inference_request_latency_seconds_count{{{_P}}}[2m])"
            f" or histogram_count(rate(inference_request_latency_seconds{{{_P}}}[2m])))",
            "up",
            Gate(min_relative=0.3),
            lag_seconds=_RATE_LAG,
        ),
        (REQUESTS_RUNNING,),
        weight=0.8,
    ),
    Cause(
        "serving.kv_cache",
        "serving",
        "KV-cache hit ratio drop",
        Signal(
            "kv_cache_hit_ratio",
            "KV-cache hit ratio",
            f"min(namespace_pod_model:inference_kv_cache_hit_ratio:rate{{{_P}}})",
            "down",
            Gate(min_delta=0.15),
            lag_seconds=_RULE_RATE_LAG,
        ),
        weight=0.7,
    ),
    Cause(
        "serving.rollout",
        "serving",
        "restart or rollout (cold start)",
        Signal(
            "new_gpu_process",
            "GPU processes of the pod seen in the last 10 min (a new PID: a restart)",
            f"count(count_over_time(gpu_process_memory_used_bytes{{{_U},{_P}}}[10m]))",
            "up",
            Gate(min_delta=1.0),
        ),
        (POD_AGE, CONTAINER_RESTARTS, COLD_START),
        explains=(
            "host.page_cache_eviction",
            "host.cpu_starvation",
            "host.cpu_contention",
            "serving.kv_cache",
            "serving.load",
        ),
        follows_our_actions=True,
    ),
)

# Shown with the diagnosis for context (how the symptom looks from the serving side); never ranked.
CONTEXT: tuple[Signal, ...] = (
    Signal("queue", "requests waiting", f"sum(inference_requests_waiting{{{_P}}})", "up"),
    Signal(
        "batch_latency_p99",
        "batch (step) latency p99 (s)",
        f"max(namespace_pod_model:inference_batch_latency_seconds:p99{{{_P}}})",
        "up",
    ),
    Signal(
        "request_latency_p99",
        "request latency p99 (s)",
        f"max(namespace_pod_model:inference_request_latency_seconds:p99{{{_P}}})",
        "up",
    ),
    Signal("gpu_sm_activity", "GPU SM activity", f"max(uuid:gpu_sm_activity:ratio{{{_U}}})", "up"),
)

_LATENCY = Signal(
    "request_latency_p99",
    "request latency p99 (s)",
    f"max(namespace_pod_model:inference_request_latency_seconds:p99{{{_P}}})",
    "up",
)
_QUEUE = Signal("queue", "requests waiting", f"sum(inference_requests_waiting{{{_P}}})", "up")

# The series of the symptom an alert reports, to find when it began; by alertname, then fault_class.
SYMPTOMS_BY_ALERT: Mapping[str, Signal] = {
    "InferenceLatencyP99Spike": _LATENCY,
    "InferenceQueueGrowing": _QUEUE,
    "GPUStarvedByHost": _QUEUE,
    "KVCacheHitRateDrop": Signal(
        "kv_cache_hit_ratio",
        "KV-cache hit ratio",
        f"min(namespace_pod_model:inference_kv_cache_hit_ratio:rate{{{_P}}})",
        "down",
        lag_seconds=_RULE_RATE_LAG,
    ),
}
SYMPTOMS_BY_FAULT_CLASS: Mapping[str, Signal] = {
    "serving_latency": _LATENCY,
    "kv_cache": SYMPTOMS_BY_ALERT["KVCacheHitRateDrop"],
    "host_starvation": _QUEUE,
    "page_cache_eviction": _LATENCY,
}


def cause(cause_id: str) -> Cause:
    """The catalogue entry of a cause id; KeyError when there is none."""
    for c in CAUSES:
        if c.id == cause_id:
            return c
    raise KeyError(cause_id)


CAUSE_IDS: frozenset[str] = frozenset(c.id for c in CAUSES)


def symptom_for(labels: Mapping[str, str]) -> Signal | None:
    """The symptom series of an alert, or None when the alert's own start is all there is."""
    by_name = SYMPTOMS_BY_ALERT.get(labels.get("alertname", ""))
    if by_name is not None:
        return by_name
    return SYMPTOMS_BY_FAULT_CLASS.get(labels.get("fault_class", ""))
