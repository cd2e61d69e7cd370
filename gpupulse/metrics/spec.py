"""The shape of one catalog entry and the naming rules every entry follows.

Every metric gpupulse exports (the exporter's and the controller's) is declared once as a MetricSpec
in one module per producing part (`gpupulse.metrics.gpu`, `.engines`, ...); `gpupulse.metrics.catalog`
gathers them. `gauge`, `counter`, `info` and `histogram` are the one way those modules write a spec.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "histogram", "info"]
Stability = Literal["stable", "experimental"]

# Every per-GPU series starts with these labels (uuid to join on, gpu = the NVML index).
GPU_LABELS: tuple[str, ...] = ("uuid", "gpu")


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: the single source for code, docs, alerts and dashboards."""

    name: str  # full exposition name; counters end in _total, info metrics in _info
    type: MetricType
    unit: str  # base unit ("bytes", "seconds", "ratio", "celsius", "watts", "hertz", "joules") or ""
    labels: tuple[str, ...]
    help: str
    collector: str  # the --collector.<name> that produces it; "controller" for the controller's own
    stability: Stability = "stable"
    # Histogram bucket upper bounds; empty = the client library's defaults.
    buckets: tuple[float, ...] = ()


def gauge(
    name: str, unit: str, help: str, collector: str, labels: tuple[str, ...] = GPU_LABELS
) -> MetricSpec:
    """A gauge spec (per GPU unless labels say otherwise)."""
    return MetricSpec(name=name, type="gauge", unit=unit, labels=labels, help=help, collector=collector)


def counter(
    name: str, unit: str, help: str, collector: str, labels: tuple[str, ...] = GPU_LABELS
) -> MetricSpec:
    """A counter spec (per GPU unless labels say otherwise); the name ends in _total."""
    return MetricSpec(name=name, type="counter", unit=unit, labels=labels, help=help, collector=collector)


def info(name: str, help: str, collector: str, labels: tuple[str, ...]) -> MetricSpec:
    """An info spec: a row of 1 per combination of static facts; the name ends in _info."""
    return MetricSpec(name=name, type="info", unit="", labels=labels, help=help, collector=collector)


def histogram(
    name: str, unit: str, help: str, collector: str, labels: tuple[str, ...], buckets: tuple[float, ...] = ()
) -> MetricSpec:
    """A histogram spec; empty buckets = the client library's defaults."""
    return MetricSpec(
        name=name, type="histogram", unit=unit, labels=labels, help=help, collector=collector, buckets=buckets
    )


def validate(specs: Iterable[MetricSpec]) -> list[str]:
    """Naming problems in the given specs (empty when they all follow the conventions)."""
    problems: list[str] = []
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            problems.append(f"{spec.name}: declared twice")
        seen.add(spec.name)
        if spec.type == "counter" and not spec.name.endswith("_total"):
            problems.append(f"{spec.name}: counters end in _total")
        if spec.type != "counter" and spec.name.endswith("_total"):
            problems.append(f"{spec.name}: only counters end in _total")
        if spec.type == "info" and not spec.name.endswith("_info"):
            problems.append(f"{spec.name}: info metrics end in _info")
        if spec.unit and spec.unit not in spec.name:
            problems.append(f"{spec.name}: unit {spec.unit} missing from the name")
        if not spec.help.strip():
            problems.append(f"{spec.name}: no help text")
        if spec.buckets and (spec.type != "histogram" or list(spec.buckets) != sorted(set(spec.buckets))):
            problems.append(f"{spec.name}: buckets belong to histograms, strictly increasing")
        # attribution's and progress's series are per process, rank or pod: their labels say which
        per_gpu = spec.collector not in ("attribution", "progress")
        if spec.name.startswith("gpu_") and spec.labels[:2] != GPU_LABELS and per_gpu:
            problems.append(f"{spec.name}: per-GPU series start with the uuid and gpu labels")
    return problems
