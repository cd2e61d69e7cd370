"""The seed's stories as raw series, for a backfilled Prometheus (tests/diagnosis/test_replays.py).

Each story has its own namespace, pod, GPU and node, so all of them live in one TSDB and share one
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
- sm_neighbour: a pod of another namespace with the same name, time-sliced onto our GPU, takes its
             SM time (0.5 -> 0.95 of it); the GPU warms by 8 °C and hits its power cap; our traffic is
             flat, our share of the SM time falls and latency rises.
- rollout:   a StatefulSet rollout recreates the pod (same name, new UID, new PID) with new weight
             files: their residency starts low while loading reads the disk, the engine answers after
             an 80 s cold start with an empty KV cache, and the first minutes are slow.
- cpu_hog:   a CPU-heavy process next to the model server takes the node's CPU (busy 0.35 -> 0.97):
             our process gets less CPU (0.6 -> 0.42 cores), the GPU idles (SM 0.62 -> 0.30), latency
             rises.
- sm_idle:   negative control: the same neighbour surge on a GPU whose pod has no requests.
- rollout_quiet: negative control: a rollout that warms up without a symptom.
- cpu_hog_b: the second model server on the CPU hog's node (another GPU, another pod): two stories
             on one node share its node_exporter series; each is diagnosed for its own pod.
- container_restart: the engine container is OOM-killed and restarted in place (same pod, new PID);
             its weights are still in the page cache, its KV cache starts empty, the first minutes
             are slow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

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
_QUIET_CPU_PRESSURE = const(0.02)
_NO_EVENT = const(0.0)
POD_STARTED = 3 * 24 * HOUR  # the pods of the stories started this long before the onset
NODE_CORES = 8


@dataclass(frozen=True)
class Neighbour:
    """Another process on the story's GPU, of another pod (maybe of another namespace)."""

    namespace: str
    pod: str
    pid: str
    memory_bytes: Fn
    sm_utilization: Fn  # its share of the GPU's kernel time (gpu_process_sm_utilization_ratio)


@dataclass(frozen=True)
class Restart:
    """The pod is recreated: gone from `gone_at`, back (new UID, new PID, counters from 0) at
    `back_at`, its engine answering from `ready_at` with a cold start of ready_at - back_at. In place,
    only the container restarts: the pod object stays (same UID and start time, its allocation) and
    kube-state-metrics counts a restart."""

    gone_at: float
    back_at: float
    ready_at: float
    pid: str = "4343"
    uid: str = "uid-2"
    in_place: bool = False


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
    neighbours: tuple[Neighbour, ...] = ()
    disk_read_bytes_per_second: Fn = _QUIET_DISK
    node_cpu_busy: Fn = _QUIET_NODE_CPU
    node_label: str = "node"  # how node_exporter's series name the node: node= or instance=
    own_sm_utilization: Fn | None = None  # our process's share of kernel time; None: sm_active
    hw_thermal_slowdown: Fn = _NO_EVENT
    # share of time some task waited for a CPU (node_exporter's PSI, /proc/pressure/cpu)
    node_cpu_waiting: Fn = _QUIET_CPU_PRESSURE
    restart: Restart | None = None
    gpu_index: str = "0"  # the GPU's NVML index on its node (two stories on one node: two GPUs)
    pid: str = "4242"


GPU_MEMORY = 80e9


def build(onset: float) -> list[Story]:
    t = onset
    stories = [
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
            neighbours=(Neighbour("rec", "rec-b", "5151", ramp(20e9, 58e9, t - 180, t), const(0.3)),),
            own_sm_utilization=const(0.25),
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
        Story(
            "sm_neighbour",
            "InferenceLatencyP99Spike",
            "ml",
            "vllm-0",
            "llama-8b",
            "GPU-5m05",
            "node-m",
            "scheduling.gpu_sm_neighbour",
            "scheduling",
            request_rate=const(30.0),
            slow_fraction=step(0.0, 0.08, t),
            host_cpu_cores=const(0.4),
            sm_active=step(0.72, 0.97, t - 30),
            temperature=ramp(66.0, 74.0, t - 30, t + 150),
            sm_clock=step(1.98e9, 1.83e9, t - 30),  # power-capped: a little lower, no fault
            thermal_slowdown=const(0.0),
            power_cap=step(0.0, 1.0, t - 30),
            residency=const(1.0),
            waiting=ramp(0.0, 20.0, t, t + 300),
            running=step(10.0, 24.0, t),
            kv_hit_ratio=const(0.5),
            memory_bytes=const(24e9),
            # the same pod name in another namespace: "not our pod" must compare both labels
            neighbours=(Neighbour("research", "vllm-0", "6262", const(30e9), step(0.5, 0.95, t - 30)),),
            own_sm_utilization=step(0.45, 0.05, t - 30),
        ),
        _rollout("rollout", "assist", "assist-0", "qwen-72b", "GPU-r011", "node-r", t, slow_fraction=0.1),
        Story(
            "cpu_hog",
            "InferenceLatencyP99Spike",
            "voice",
            "voice-0",
            "parakeet-1b",
            "GPU-c9u0",
            "node-k",
            "host.cpu_contention",
            "host",
            request_rate=const(35.0),
            slow_fraction=step(0.0, 0.1, t),
            host_cpu_cores=step(0.6, 0.42, t - 30),
            sm_active=step(0.62, 0.30, t - 30),
            temperature=ramp(67.0, 61.0, t - 30, t + 270),
            sm_clock=const(1.98e9),
            thermal_slowdown=const(0.0),
            power_cap=const(0.0),
            residency=const(1.0),
            waiting=ramp(0.0, 25.0, t, t + 300),
            running=const(8.0),
            kv_hit_ratio=const(0.5),
            memory_bytes=const(16e9),
            node_cpu_busy=step(0.35, 0.97, t - 30),
            node_cpu_waiting=step(0.02, 0.65, t - 30),
        ),
        Story(
            "sm_idle",
            "InferenceLatencyP99Spike",
            "lab",
            "lab-0",
            "gemma-9b",
            "GPU-1d1e",
            "node-i",
            "",
            "",
            request_rate=const(0.0),
            slow_fraction=const(0.0),
            host_cpu_cores=const(0.05),
            sm_active=step(0.5, 0.96, t),
            temperature=ramp(60.0, 68.0, t, t + 180),
            sm_clock=step(1.98e9, 1.83e9, t),
            thermal_slowdown=const(0.0),
            power_cap=step(0.0, 1.0, t),
            residency=const(1.0),
            waiting=const(0.0),
            running=const(0.0),
            kv_hit_ratio=const(0.5),
            memory_bytes=const(16e9),
            neighbours=(Neighbour("train", "trainer-0", "7373", const(40e9), step(0.5, 0.95, t)),),
            own_sm_utilization=const(0.0),
        ),
        _rollout("rollout_quiet", "docs", "docs-0", "phi-3", "GPU-q0e7", "node-q", t, slow_fraction=0.0),
        _container_restart(t),
    ]
    hog = next(s for s in stories if s.name == "cpu_hog")
    # the node's series come from the first story on it; the second shares the same functions
    stories.append(
        replace(
            hog,
            name="cpu_hog_b",
            pod="voice-1",
            model="canary-1b",
            uuid="GPU-c9u1",
            gpu_index="1",
            pid="4250",
            host_cpu_cores=step(0.5, 0.36, t - 30),
            sm_active=step(0.55, 0.28, t - 30),
            slow_fraction=step(0.0, 0.08, t),
        )
    )
    return stories


def _container_restart(t: float) -> Story:
    restart = Restart(gone_at=t - 75, back_at=t - 60, ready_at=t - 10, in_place=True)

    def new(before: float, after: Fn) -> Fn:
        return lambda x: after(x) if x >= restart.back_at else before

    return Story(
        "container_restart",
        "InferenceLatencyP99Spike",
        "code",
        "code-0",
        "deepseek-coder-33b",
        "GPU-k1ll",
        "node-o",
        "serving.rollout",
        "serving",
        request_rate=const(25.0),
        slow_fraction=step(0.0, 0.1, t),
        host_cpu_cores=lambda x: 1.0 if restart.back_at <= x < restart.ready_at else 0.4,
        sm_active=lambda x: 0.6 if not restart.gone_at <= x < restart.ready_at else 0.02,
        temperature=const(65.0),
        sm_clock=const(1.98e9),
        thermal_slowdown=const(0.0),
        power_cap=const(0.0),
        residency=const(1.0),  # the same files, still cached: a fast load
        waiting=ramp(0.0, 10.0, t, t + 300),
        running=const(10.0),
        kv_hit_ratio=new(0.6, ramp(0.05, 0.55, t - 10, t + 290)),
        memory_bytes=new(40e9, ramp(1e9, 40e9, t - 60, t - 20)),
        restart=restart,
    )


def _rollout(
    name: str, namespace: str, pod: str, model: str, uuid: str, node: str, t: float, *, slow_fraction: float
) -> Story:
    """A StatefulSet rollout: the old pod goes at t-120, the new one starts at t-90 and loads its new
    weight files (residency from 5 %, the disk busy, a core and more of CPU), its engine answers at
    t-10 (an 80 s cold start) with an empty KV cache; traffic returns; `slow_fraction` of the
    requests are slow from t (0: a rollout without symptom)."""
    restart = Restart(gone_at=t - 120, back_at=t - 90, ready_at=t - 10)

    def new(before: float, after: Fn) -> Fn:
        return lambda x: after(x) if x >= restart.back_at else before

    loading = (restart.back_at, restart.ready_at)
    return Story(
        name,
        "InferenceLatencyP99Spike",
        namespace,
        pod,
        model,
        uuid,
        node,
        "serving.rollout" if slow_fraction else "",
        "serving" if slow_fraction else "",
        request_rate=const(30.0),
        slow_fraction=step(0.0, slow_fraction, t),
        host_cpu_cores=lambda x: 1.2 if loading[0] <= x < loading[1] else 0.4,
        sm_active=lambda x: 0.7 if not restart.gone_at <= x < restart.ready_at else 0.02,
        temperature=const(66.0),
        sm_clock=const(1.98e9),
        thermal_slowdown=const(0.0),
        power_cap=const(0.0),
        residency=new(1.0, ramp(0.05, 0.95, t - 90, t + 60)),
        waiting=ramp(0.0, 10.0, t, t + 300) if slow_fraction else const(0.0),
        running=const(10.0),
        kv_hit_ratio=new(0.55, ramp(0.05, 0.5, t - 10, t + 290)),
        memory_bytes=new(70e9, ramp(1e9, 70e9, t - 90, t - 20)),
        disk_read_bytes_per_second=lambda x: 6e8 if t - 90 <= x < t + 60 else 5e6,
        restart=restart,
    )


BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FAST, SLOW = 0.06, 2.0
POD_AGE_AT_START = 2 * 24 * HOUR  # the stories' pods started this long before the replay begins


def openmetrics(stories: list[Story], start: float, end: float, seed: int = 7) -> str:
    """Every raw series of every story from `start` to `end`, as OpenMetrics text."""
    rnd = random.Random(seed)
    # the series added after the first five stories draw their noise apart, so those five replay
    # exactly the samples they always had
    extra = random.Random(seed + 1)
    families: dict[str, list[str]] = {}

    def emit(name: str, labels: str, value: float, ts: int, digits: int = 6) -> None:
        line = f"{name}{{{labels}}} {value:.{digits}g} {ts}"
        families.setdefault(name, [f"# TYPE {name} gauge"]).append(line)

    def noisy(x: float, rel: float = 0.01, r: random.Random = rnd) -> float:
        return x * (1.0 + r.gauss(0.0, rel))

    times = list(range(int(start), int(end) + 1, INTERVAL))
    nodes: set[str] = set()
    for s in stories:
        # a node's own series once, from its first story (later ones on it share the node)
        node_series = s.node not in nodes
        nodes.add(s.node)
        gpu = f'uuid="{s.uuid}",gpu="{s.gpu_index}",node="{s.node}"'
        pod = f'namespace="{s.namespace}",pod="{s.pod}"'
        engine = f'engine="vllm",model="{s.model}",{pod},gpu="{s.gpu_index}",uuid="{s.uuid}",node="{s.node}"'
        node_sel = f'node="{s.node}"' if s.node_label == "node" else f'instance="{s.node}:9100"'
        cum = {"cpu": 0.0, "fast": 0.0, "slow": 0.0, "hits": 0.0, "queries": 0.0, "disk": 0.0, "idle": 0.0}
        cum["cpu_waiting"] = 0.0
        for n in s.neighbours:
            cum[f"cpu:{n.pid}"] = 0.0
        prev = times[0]
        r = s.restart
        generation = 0  # 1 once the new process runs, 2 once its engine answers
        for ts in times:
            dt = ts - prev
            prev = ts
            # the GPU process (and what the exporter finds through it) vs the pod object
            pod_here = r is None or not r.gone_at <= ts < r.back_at
            pod_object = pod_here or (r is not None and r.in_place)
            engine_here = r is None or not r.gone_at <= ts < r.ready_at
            if r is not None and generation == 0 and ts >= r.back_at:
                generation, cum["cpu"] = 1, 0.0  # a new process: its CPU counter starts from 0
            if r is not None and generation == 1 and ts >= r.ready_at:
                generation = 2  # a new engine: its counters start from 0
                cum.update(fast=0.0, slow=0.0, hits=0.0, queries=0.0)
            pid, uid = (s.pid, "uid-1") if generation == 0 or r is None else (r.pid, r.uid)
            if r is not None and r.in_place:
                uid = "uid-1"
            proc = f'{gpu},pid="{pid}",{pod},container="engine"'
            rate = noisy(s.request_rate(ts), 0.02)
            slow = min(1.0, max(0.0, s.slow_fraction(ts)))
            cpu = max(0.0, noisy(s.host_cpu_cores(ts), 0.01))
            hit = min(1.0, max(0.0, noisy(s.kv_hit_ratio(ts), 0.01)))
            if engine_here:
                cum["fast"] += rate * dt * (1 - slow)
                cum["slow"] += rate * dt * slow
                cum["queries"] += 1000.0 * dt
                cum["hits"] += 1000.0 * dt * hit
            if pod_here:
                cum["cpu"] += cpu * dt
            cum["disk"] += noisy(s.disk_read_bytes_per_second(ts), 0.05) * dt
            # one idle counter stands for all the node's cores: avg(rate(idle)) is the same
            cum["idle"] += (1.0 - min(1.0, noisy(s.node_cpu_busy(ts), 0.01))) * dt
            cum["cpu_waiting"] += min(1.0, max(0.0, noisy(s.node_cpu_waiting(ts), 0.02, extra))) * dt
            emit("gpu_up", gpu, 1, ts)
            if pod_object:
                emit(
                    "gpu_allocation_info", f'{gpu},{pod},container="engine",resource="nvidia.com/gpu"', 1, ts
                )
            if engine_here:
                emit("inference_engine_gpu_info", engine, 1, ts)
            emit("gpu_temperature_celsius", gpu, round(noisy(s.temperature(ts), 0.003), 1), ts)
            emit("gpu_sm_clock_hertz", gpu, noisy(s.sm_clock(ts), 0.002), ts)
            emit("gpu_sm_active_ratio", gpu, min(1.0, noisy(s.sm_active(ts), 0.02)), ts)
            for reason, fn in (
                ("sw_thermal_slowdown", s.thermal_slowdown),
                ("hw_thermal_slowdown", s.hw_thermal_slowdown),
                ("hw_slowdown", const(0.0)),
                ("sw_power_cap", s.power_cap),
            ):
                emit("gpu_clock_event_active", f'{gpu},reason="{reason}"', fn(ts), ts)
            emit("gpu_nvlink_up", f'{gpu},link="0"', 1, ts)
            emit("gpu_pcie_replays_total", gpu, 3, ts)
            emit("gpu_memory_total_bytes", gpu, GPU_MEMORY, ts)
            own = s.memory_bytes(ts)
            used = 0.0
            if pod_here:
                emit("gpu_process_memory_used_bytes", proc, own, ts)
                used = own
                own_sm = s.own_sm_utilization or s.sm_active
                emit(
                    "gpu_process_sm_utilization_ratio",
                    proc,
                    round(min(1.0, max(0.0, noisy(own_sm(ts), 0.02, extra))), 4),
                    ts,
                )
            for n in s.neighbours:
                other_pod = f'namespace="{n.namespace}",pod="{n.pod}"'
                other_proc = f'{gpu},pid="{n.pid}",{other_pod},container="main"'
                emit("gpu_process_memory_used_bytes", other_proc, n.memory_bytes(ts), ts)
                emit(
                    "gpu_process_sm_utilization_ratio",
                    other_proc,
                    round(min(1.0, max(0.0, noisy(n.sm_utilization(ts), 0.02, extra))), 4),
                    ts,
                )
                emit(
                    "gpu_allocation_info",
                    f'{gpu},{other_pod},container="main",resource="nvidia.com/gpu"',
                    1,
                    ts,
                )
                used += n.memory_bytes(ts)
            emit("gpu_memory_used_bytes", gpu, used, ts)
            if pod_here:
                emit("gpu_process_host_cpu_seconds_total", proc, round(cum["cpu"], 3), ts)
            weights = f'model="{s.model}",{pod}'
            residency = min(1.0, noisy(s.residency(ts), 0.003))
            if pod_here:
                emit("model_weights_page_cache_resident_ratio", weights, residency, ts)
            if pod_object:
                # kube-state-metrics: the pod object (a new UID when the pod is recreated)
                ksm = f'{pod},uid="{uid}"'
                recreated = r is not None and generation > 0 and not r.in_place
                started = r.back_at if recreated and r else start - POD_AGE_AT_START
                restarts = 1 if r is not None and generation > 0 and r.in_place else 0
                emit("kube_pod_start_time", ksm, started, ts, digits=12)  # Unix seconds
                emit("kube_pod_container_status_restarts_total", f'{ksm},container="engine"', restarts, ts)
            waiting = max(0.0, round(s.waiting(ts) + rnd.gauss(0, 0.5)))
            running = max(0.0, round(s.running(ts) + rnd.gauss(0, 0.5)))
            if engine_here:
                emit("inference_requests_waiting", engine, waiting, ts)
                emit("inference_requests_running", engine, running, ts)
                if r is not None and generation == 2:
                    # the exporter measures the cold start of a process it saw start
                    emit(
                        "inference_cold_start_seconds",
                        f'engine="vllm",model="{s.model}",{pod}',
                        r.ready_at - r.back_at,
                        ts,
                    )
                kv = f'{engine},unit="tokens"'
                emit("inference_kv_cache_hits_total", kv, round(cum["hits"]), ts)
                emit("inference_kv_cache_queries_total", kv, round(cum["queries"]), ts)
                for le in (*BUCKETS, math.inf):
                    n_le = (cum["fast"] if le >= FAST else 0.0) + (cum["slow"] if le >= SLOW else 0.0)
                    le_text = "+Inf" if le == math.inf else f"{le:g}"
                    emit(
                        "inference_request_latency_seconds_bucket",
                        f'{engine},le="{le_text}"',
                        round(n_le, 3),
                        ts,
                    )
                emit(
                    "inference_request_latency_seconds_count", engine, round(cum["fast"] + cum["slow"], 3), ts
                )
                emit(
                    "inference_request_latency_seconds_sum",
                    engine,
                    round(cum["fast"] * FAST + cum["slow"] * SLOW, 3),
                    ts,
                )
            if node_series:
                emit("node_disk_read_bytes_total", f'{node_sel},device="nvme0n1"', round(cum["disk"]), ts)
                emit("node_cpu_seconds_total", f'{node_sel},cpu="0",mode="idle"', round(cum["idle"], 3), ts)
                emit("node_pressure_cpu_waiting_seconds_total", node_sel, round(cum["cpu_waiting"], 3), ts)
    return "\n".join(line for lines in families.values() for line in lines) + "\n# EOF\n"
