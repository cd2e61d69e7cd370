"""What the report says, computed from Prometheus: each figure is a range query evaluated once per
step and integrated over the period (a gauge of GPUs held for one step of S seconds counts S/3600
GPU-hours; an energy or token counter's increase over each step is summed).

The queries read gpupulse's recording rules, so the report agrees with the dashboards and with
whatever thresholds and price the cluster's rules were generated with:
- `uuid_namespace_pod:gpu_usage:share`: each pod's share of a GPU: its part of the GPU's per-process
  SM utilization where NVML reports it, else 1/n when n pods share one,
- `namespace:gpu_allocated:sum`, `namespace:gpu_idle_allocated:sum` and their `_cost_per_hour`,
- `uuid:gpu_sm_activity:ratio`: GPM SM activity, NVML utilization where GPM is absent.
A model's cost is its GPU-hours at the price the rules apply (total cost / total GPU-hours).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from costreport.prom import PrometheusClient, Series

# the idle rule's default threshold (alerts/config.yaml `idle_sm_activity_ratio`); the per-pod idle
# query repeats it because no recording rule keeps per-pod idle time (a test keeps the two equal)
DEFAULT_IDLE_SM_ACTIVITY_RATIO = 0.3
# the engines' generated-token counter, normalized per model and pod
GENERATED_TOKENS = "inference_generation_tokens_total"

SHARE = "uuid_namespace_pod:gpu_usage:share"
ACTIVITY = "uuid:gpu_sm_activity:ratio"
# one energy sample per GPU even when two exporters scrape it (an HA pair) or it has other target labels
ENERGY_PER_GPU = "max by (cluster, uuid) (increase(gpu_energy_joules_total[{step}]))"
POD_SHARE = f"sum by (cluster, namespace, pod, uuid) ({SHARE})"
ENGINE_GPU = "group by (cluster, namespace, pod, model, uuid) (inference_engine_gpu_info)"
# each GPU a model runs on, weighted by its pod's share of that GPU
MODEL_SHARE = f"{ENGINE_GPU} * on(cluster, namespace, pod, uuid) group_left() {POD_SHARE}"


def queries(step: str, idle_threshold: float) -> dict[str, str]:
    energy = ENERGY_PER_GPU.format(step=step)
    return {
        "ns_allocated": "sum by (cluster, namespace) (namespace:gpu_allocated:sum)",
        "ns_idle": "sum by (cluster, namespace) (namespace:gpu_idle_allocated:sum)",
        "ns_cost": "sum by (cluster, namespace, currency) (namespace:gpu_allocated_cost_per_hour:sum)",
        "ns_idle_cost": "sum by (cluster, namespace, currency) (namespace:gpu_idle_cost_per_hour:sum)",
        "ns_energy": f"sum by (cluster, namespace) ({SHARE} * on(cluster, uuid) group_left() {energy})",
        "all_energy": f"sum by (cluster) ({energy})",
        "model_allocated": f"sum by (cluster, namespace, model) ({MODEL_SHARE})",
        "model_energy": (
            f"sum by (cluster, namespace, model) ({MODEL_SHARE} * on(cluster, uuid) group_left() {energy})"
        ),
        "model_tokens": f"sum by (cluster, namespace, model) (increase({GENERATED_TOKENS}[{step}]))",
        "pod_idle": (
            f"sum by (cluster, namespace, pod) ({SHARE} * on(cluster, uuid) group_left()"
            f" (max by (cluster, uuid) ({ACTIVITY}) < bool {idle_threshold:g}))"
        ),
        "pod_allocated": f"sum by (cluster, namespace, pod) ({SHARE})",
    }


@dataclass
class NamespaceUsage:
    cluster: str
    namespace: str
    gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    energy_joules: float = 0.0
    cost: float = 0.0
    idle_cost: float = 0.0


@dataclass
class ModelUsage:
    cluster: str
    namespace: str
    model: str
    gpu_hours: float = 0.0
    energy_joules: float = 0.0
    cost: float | None = None
    generated_tokens: float | None = None

    @property
    def cost_per_million_tokens(self) -> float | None:
        if self.cost is None or not self.generated_tokens:
            return None
        return self.cost / self.generated_tokens * 1e6


@dataclass
class IdleAllocation:
    cluster: str
    namespace: str
    pod: str
    idle_gpu_hours: float
    gpu_hours: float


@dataclass
class Report:
    start: float
    end: float
    step_seconds: float
    currency: str
    namespaces: list[NamespaceUsage]
    models: list[ModelUsage]
    idle: list[IdleAllocation]
    # energy of GPUs no pod held, per cluster (attributed to nobody, still paid for)
    unallocated_energy_joules: dict[str, float] = field(default_factory=dict)

    @property
    def price_per_gpu_hour(self) -> float | None:
        hours = sum(n.gpu_hours for n in self.namespaces)
        return sum(n.cost for n in self.namespaces) / hours if hours else None


Runner = Callable[[str], list[Series]]  # a named query of queries(), run over the period


class NoData(Exception):
    """The period holds no allocation data: nothing to report (and not a report of zeros)."""


def _gauge_hours(series: Series, step_seconds: float) -> float:
    return sum(value for _, value in series.points) * step_seconds / 3600.0


def _counter_total(series: Series) -> float:
    return sum(value for _, value in series.points)


def _ns_key(labels: dict[str, str]) -> tuple[str, str]:
    return labels.get("cluster", ""), labels.get("namespace", "")


def _model_key(labels: dict[str, str]) -> tuple[str, str, str]:
    return labels.get("cluster", ""), labels.get("namespace", ""), labels.get("model", "")


def _pod_key(labels: dict[str, str]) -> tuple[str, str, str]:
    return labels.get("cluster", ""), labels.get("namespace", ""), labels.get("pod", "")


def build_report(
    client: PrometheusClient,
    start: float,
    end: float,
    step_seconds: float,
    idle_threshold: float = DEFAULT_IDLE_SM_ACTIVITY_RATIO,
    top: int = 10,
) -> Report:
    """Run every query over (start, end] and integrate. Raises NoData when no namespace held a GPU in
    the period, PrometheusUnavailable when Prometheus cannot answer."""
    step = f"{int(step_seconds)}s"
    q = queries(step, idle_threshold)
    # samples at start+step ... end: each stands for the step that ends at it
    first = start + step_seconds

    def run(name: str) -> list[Series]:
        return client.query_range(q[name], first, end, step_seconds)

    namespaces: dict[tuple[str, str], NamespaceUsage] = {}

    def ns(labels: dict[str, str]) -> NamespaceUsage:
        cluster, namespace = key = _ns_key(labels)
        return namespaces.setdefault(key, NamespaceUsage(cluster=cluster, namespace=namespace))

    for s in run("ns_allocated"):
        ns(s.labels).gpu_hours += _gauge_hours(s, step_seconds)
    if not namespaces:
        raise NoData(
            "no GPU allocation data in the period: either no pod held a GPU, or Prometheus lacks "
            "gpupulse's recording rules (group gpupulse.activity-and-cost: namespace:gpu_allocated:sum)"
        )
    for s in run("ns_idle"):
        ns(s.labels).idle_gpu_hours += _gauge_hours(s, step_seconds)
    currencies: set[str] = set()
    for s in run("ns_cost"):
        ns(s.labels).cost += _gauge_hours(s, step_seconds)
        currencies.add(s.labels.get("currency", ""))
    for s in run("ns_idle_cost"):
        ns(s.labels).idle_cost += _gauge_hours(s, step_seconds)
    for s in run("ns_energy"):
        ns(s.labels).energy_joules += _counter_total(s)

    attributed: dict[str, float] = defaultdict(float)
    for n in namespaces.values():
        attributed[n.cluster] += n.energy_joules
    unallocated = {
        s.labels.get("cluster", ""): max(0.0, _counter_total(s) - attributed[s.labels.get("cluster", "")])
        for s in run("all_energy")
    }

    report = Report(
        start=start,
        end=end,
        step_seconds=step_seconds,
        currency="/".join(sorted(c for c in currencies if c)) or "",
        namespaces=sorted(namespaces.values(), key=lambda n: (-n.cost, -n.gpu_hours, n.cluster, n.namespace)),
        models=[],
        idle=[],
        unallocated_energy_joules=unallocated,
    )
    report.models = _models(run, step_seconds, report.price_per_gpu_hour)
    report.idle = _largest_idle(run("pod_idle"), run("pod_allocated"), step_seconds, top)
    return report


def _models(run: Runner, step_seconds: float, price: float | None) -> list[ModelUsage]:
    models: dict[tuple[str, str, str], ModelUsage] = {}

    def model(labels: dict[str, str]) -> ModelUsage:
        cluster, namespace, name = key = _model_key(labels)
        return models.setdefault(key, ModelUsage(cluster=cluster, namespace=namespace, model=name))

    for s in run("model_allocated"):
        model(s.labels).gpu_hours += _gauge_hours(s, step_seconds)
    for s in run("model_energy"):
        model(s.labels).energy_joules += _counter_total(s)
    for s in run("model_tokens"):
        m = model(s.labels)
        m.generated_tokens = (m.generated_tokens or 0.0) + _counter_total(s)
    for m in models.values():
        m.cost = m.gpu_hours * price if price is not None else None
    return sorted(models.values(), key=lambda m: (-m.gpu_hours, m.cluster, m.namespace, m.model))


def _largest_idle(
    idle: Iterable[Series], allocated: Iterable[Series], step_seconds: float, top: int
) -> list[IdleAllocation]:
    held = {_pod_key(s.labels): _gauge_hours(s, step_seconds) for s in allocated}
    rows = []
    for s in idle:
        cluster, namespace, pod = key = _pod_key(s.labels)
        hours = _gauge_hours(s, step_seconds)
        if hours > 0:
            rows.append(
                IdleAllocation(cluster, namespace, pod, idle_gpu_hours=hours, gpu_hours=held.get(key, hours))
            )
    rows.sort(key=lambda r: (-r.idle_gpu_hours, r.cluster, r.namespace, r.pod))
    return rows[:top]
