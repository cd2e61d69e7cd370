"""The shape of one catalog entry: every metric gpupulse exports is declared once as a MetricSpec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "histogram", "info"]
Stability = Literal["stable", "experimental"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: the single source for code, docs, alerts and dashboards."""

    name: str  # full exposition name; counters end in _total, info metrics in _info
    type: MetricType
    unit: str  # base unit ("bytes", "seconds", "ratio", "celsius", "watts", "hertz", "joules") or ""
    labels: tuple[str, ...]
    help: str
    collector: str  # the --collector.<name> that produces it
    stability: Stability = "stable"
