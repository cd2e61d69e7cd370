"""The seed's stories as raw series, for a backfilled Prometheus (tests/diagnosis/test_replays.py).

Each story has its own namespace, pod, GPU and node, so all five live in one TSDB and share one
onset time ONSET (the symptom starts there). Samples every 15 s with a little seeded noise; counters
are written as the cumulative sums of the rates they are meant to have. Every story carries the full
set of signals a gpupulse exporter on that node would report, so a wrong blame is possible.

- starved:   single-threaded preprocessing pins one host core; the GPU goes idle; latency spikes.
- evicted:   a log-archiving job's disk reads (from 1 min before) evict the model's weights from the
             page cache; P99 spikes while the median stays (the two-day story).
- colocated: the other model on the same GPU grows its memory over 3 min; our KV-cache hit ratio
             drops as its cache is squeezed.
- spike:     a genuine traffic rise 90 s before the queue and latency grow; GPU busier and warmer,
             power capped, host CPU up, but no fault: the GPU must not be blamed.
- thermal:   temperature climbs (a failed fan) and thermal slowdown holds the clocks from 30 s
             before the latency rises.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

INTERVAL = 15
HOUR = 3600.0
Fn = Callable[[float], float]


def step(before: float, after: float, at: float) -> Fn:
    return lambda t: after if t >= at else before


def ramp(before: float, after: float, start: float, end: float) -> Fn:
    def fn(t: float) -> float:
        if t <= start:
            return before
        if t >= end:
            return after
        return before + (after - before) * (t - start) / (end - start)

    return fn


def const(value: float) -> Fn:
    return lambda t: value


_QUIET_DISK = const(5e6)
_QUIET_NODE_CPU = const(0.3)


@dataclass(frozen=True)
class Story:
    name: str
    alertname: str
    namespace: str
    pod: str
    model: str
    uuid: str
    node: str
    expected_cause: str
    expected_layer: str
    # per-second rates / levels as functions of time (onset-relative functions are built below)
    request_rate: Fn
    slow_fraction: Fn  # share of requests that take 2 s instead of 60 ms
    host_cpu_cores: Fn
    sm_active: Fn
    temperature: Fn
    sm_clock: Fn
    thermal_slowdown: Fn
    power_cap: Fn
    residency: Fn
    waiting: Fn
    running: Fn
    kv_hit_ratio: Fn
    memory_bytes: Fn
    neighbour_memory_bytes: Fn | None = None
    disk_read_bytes_per_second: Fn = _QUIET_DISK
    node_cpu_busy: Fn = _QUIET_NODE_CPU
    node_label: str = "node"  # how node_exporter's series name the node: node= or instance=


GPU_MEMORY = 80e9


def build(onset: float) -> list[Story]:
    t = onset
    return [
        Story(
            "starved",
            "InferenceLatencyP99Spike",
            "vision",
            "vision-0",
            "resnet-152",
            "GPU-5ta2",
            "node-s",
            "host.cpu_starvation",
            "host",
            request_rate=const(40.0),
            slow_fraction=step(0.0, 0.3, t),
            host_cpu_cores=step(0.45, 1.0, t - 15),
            sm_active=step(0.6, 0.15, t),
            temperature=ramp(66.0, 58.0, t, t + 300),
            sm_clock=const(1.98e9),
            thermal_slowdown=const(0.0),
            power_cap=const(0.0),
            residency=const(1.0),
            waiting=ramp(0.0, 40.0, t, t + 300),
            running=const(8.0),
            kv_hit_ratio=const(0.6),
            memory_bytes=const(20e9),
            node_cpu_busy=step(0.3, 0.36, t - 15),
        ),
        Story(
            "evicted",
            "InferenceLatencyP99Spike",
            "chat",
            "chat-0",
            "llama-70b",
            "GPU-e71c",
            "node-p",
            "host.page_cache_eviction",
            "host",
            request_rate=const(30.0),
            slow_fraction=step(0.0, 0.04, t),
            host_cpu_cores=const(0.4),
            sm_active=const(0.7),
            temperature=const(68.0),
            sm_clock=const(1.98e9),
            thermal_slowdown=const(0.0),
            power_cap=const(0.0),
            residency=ramp(1.0, 0.35, t - 30, t + 30),
            waiting=const(1.0),
            running=const(10.0),
            kv_hit_ratio=const(0.55),
            memory_bytes=const(70e9),
            disk_read_bytes_per_second=step(5e6, 4.5e8, t - 60),
            node_label="instance",
        ),
        Story(
            "colocated",
            "KVCacheHitRateDrop",
            "rec",
            "rec-a",
            "qwen-7b",
            "GPU-c010",
            "node-c",
            "scheduling.gpu_memory_neighbour",
            "scheduling",
            request_rate=const(25.0),
            slow_fraction=step(0.0, 0.05, t),
            host_cpu_cores=const(0.35),
            sm_active=const(0.55),
            temperature=const(64.0),
            sm_clock=const(1.98e9),
            thermal_slowdown=const(0.0),
            power_cap=const(0.0),
            residency=const(1.0),
            waiting=ramp(0.0, 12.0, t, t + 300),
            running=const(12.0),
            kv_hit_ratio=step(0.72, 0.28, t),
            memory_bytes=const(18e9),
            neighbour_memory_bytes=ramp(20e9, 58e9, t - 180, t),
        ),
        Story(
            "spike",
            "InferenceLatencyP99Spike",
            "search",
            "search-0",
            "mistral-7b",
            "GPU-5p1k",
            "node-t",
            "serving.load",
            "serving",
            request_rate=step(40.0, 120.0, t - 90),
            slow_fraction=step(0.0, 0.08, t),
            host_cpu_cores=step(0.3, 0.68, t - 90),
            sm_active=step(0.45, 0.93, t - 90),
            temperature=ramp(62.0, 75.0, t - 90, t + 150),
            sm_clock=step(1.98e9, 1.86e9, t - 60),  # power-capped boost: a little lower, no fault
            thermal_slowdown=const(0.0),
            power_cap=step(0.0, 1.0, t - 60),
            residency=const(1.0),
            waiting=ramp(0.0, 30.0, t, t + 300),
            running=step(8.0, 32.0, t - 90),
            kv_hit_ratio=const(0.5),
            memory_bytes=step(30e9, 34e9, t - 90),
            node_cpu_busy=step(0.3, 0.55, t - 90),
        ),
        Story(
            "thermal",
            "InferenceLatencyP99Spike",
            "tts",
            "tts-0",
            "whisper-large",
            "GPU-7h3r",
            "node-h",
            "hardware.thermal_throttle",
            "hardware",
            request_rate=const(20.0),
            slow_fraction=step(0.0, 0.06, t),
            host_cpu_cores=const(0.3),
            sm_active=const(0.65),
            temperature=ramp(70.0, 91.0, t - 330, t - 30),
            sm_clock=step(1.98e9, 1.1e9, t - 30),
            thermal_slowdown=step(0.0, 1.0, t - 30),
            power_cap=const(0.0),
            residency=const(1.0),
            waiting=ramp(0.0, 6.0, t, t + 300),
            running=const(6.0),
            kv_hit_ratio=const(0.4),
            memory_bytes=const(12e9),
        ),
    ]


BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FAST, SLOW = 0.06, 2.0


def openmetrics(stories: list[Story], start: float, end: float, seed: int = 7) -> str:
    """Every raw series of every story from `start` to `end`, as OpenMetrics text."""
    rnd = random.Random(seed)
    families: dict[str, list[str]] = {}

    def emit(name: str, labels: str, value: float, ts: int) -> None:
        families.setdefault(name, [f"# TYPE {name} gauge"]).append(f"{name}{{{labels}}} {value:.6g} {ts}")

    def noisy(x: float, rel: float = 0.01) -> float:
        return x * (1.0 + rnd.gauss(0.0, rel))

    times = list(range(int(start), int(end) + 1, INTERVAL))
    for s in stories:
        gpu = f'uuid="{s.uuid}",gpu="0",node="{s.node}"'
        pod = f'namespace="{s.namespace}",pod="{s.pod}"'
        engine = f'engine="vllm",model="{s.model}",{pod},gpu="0",uuid="{s.uuid}",node="{s.node}"'
        proc = f'{gpu},pid="4242",{pod},container="engine"'
        node_sel = f'node="{s.node}"' if s.node_label == "node" else f'instance="{s.node}:9100"'
        cum = {"cpu": 0.0, "fast": 0.0, "slow": 0.0, "hits": 0.0, "queries": 0.0, "disk": 0.0, "idle": 0.0}
        prev = times[0]
        for ts in times:
            dt = ts - prev
            prev = ts
            rate = noisy(s.request_rate(ts), 0.02)
            slow = min(1.0, max(0.0, s.slow_fraction(ts)))
            cum["fast"] += rate * dt * (1 - slow)
            cum["slow"] += rate * dt * slow
            cum["cpu"] += max(0.0, noisy(s.host_cpu_cores(ts), 0.01)) * dt
            cum["queries"] += 1000.0 * dt
            cum["hits"] += 1000.0 * dt * min(1.0, max(0.0, noisy(s.kv_hit_ratio(ts), 0.01)))
            cum["disk"] += noisy(s.disk_read_bytes_per_second(ts), 0.05) * dt
            # one idle counter stands for all the node's cores: avg(rate(idle)) is the same
            cum["idle"] += (1.0 - min(1.0, noisy(s.node_cpu_busy(ts), 0.01))) * dt
            emit("gpu_up", gpu, 1, ts)
            emit("gpu_allocation_info", f'{gpu},{pod},container="engine",resource="nvidia.com/gpu"', 1, ts)
            emit("inference_engine_gpu_info", engine, 1, ts)
            emit("gpu_temperature_celsius", gpu, round(noisy(s.temperature(ts), 0.003), 1), ts)
            emit("gpu_sm_clock_hertz", gpu, noisy(s.sm_clock(ts), 0.002), ts)
            emit("gpu_sm_active_ratio", gpu, min(1.0, noisy(s.sm_active(ts), 0.02)), ts)
            for reason, fn in (
                ("sw_thermal_slowdown", s.thermal_slowdown),
                ("hw_thermal_slowdown", const(0.0)),
                ("hw_slowdown", const(0.0)),
                ("sw_power_cap", s.power_cap),
            ):
                emit("gpu_clock_event_active", f'{gpu},reason="{reason}"', fn(ts), ts)
            emit("gpu_nvlink_up", f'{gpu},link="0"', 1, ts)
            emit("gpu_pcie_replays_total", gpu, 3, ts)
            emit("gpu_memory_total_bytes", gpu, GPU_MEMORY, ts)
            own = s.memory_bytes(ts)
            emit("gpu_process_memory_used_bytes", proc, own, ts)
            used = own
            if s.neighbour_memory_bytes is not None:
                other = s.neighbour_memory_bytes(ts)
                other_proc = (
                    f'{gpu},pid="5151",namespace="{s.namespace}",pod="{s.pod[:-1]}b",container="engine"'
                )
                emit("gpu_process_memory_used_bytes", other_proc, other, ts)
                used += other
            emit("gpu_memory_used_bytes", gpu, used, ts)
            emit("gpu_process_host_cpu_seconds_total", proc, round(cum["cpu"], 3), ts)
            weights = f'model="{s.model}",{pod}'
            emit(
                "model_weights_page_cache_resident_ratio",
                weights,
                min(1.0, noisy(s.residency(ts), 0.003)),
                ts,
            )
            emit("inference_requests_waiting", engine, max(0.0, round(s.waiting(ts) + rnd.gauss(0, 0.5))), ts)
            emit("inference_requests_running", engine, max(0.0, round(s.running(ts) + rnd.gauss(0, 0.5))), ts)
            kv = f'{engine},unit="tokens"'
            emit("inference_kv_cache_hits_total", kv, round(cum["hits"]), ts)
            emit("inference_kv_cache_queries_total", kv, round(cum["queries"]), ts)
            for le in (*BUCKETS, math.inf):
                n = (cum["fast"] if le >= FAST else 0.0) + (cum["slow"] if le >= SLOW else 0.0)
                le_text = "+Inf" if le == math.inf else f"{le:g}"
                emit("inference_request_latency_seconds_bucket", f'{engine},le="{le_text}"', round(n, 3), ts)
            emit("inference_request_latency_seconds_count", engine, round(cum["fast"] + cum["slow"], 3), ts)
            emit(
                "inference_request_latency_seconds_sum",
                engine,
                round(cum["fast"] * FAST + cum["slow"] * SLOW, 3),
                ts,
            )
            emit("node_disk_read_bytes_total", f'{node_sel},device="nvme0n1"', round(cum["disk"]), ts)
            emit("node_cpu_seconds_total", f'{node_sel},cpu="0",mode="idle"', round(cum["idle"], 3), ts)
    return "\n".join(line for lines in families.values() for line in lines) + "\n# EOF\n"
