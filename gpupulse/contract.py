"""The contract between alerts and the controller, written once: the labels every alert carries, their
values, and how the labels identify a remediation target.

The rule sources (alerts/rules/), the controller (remediation/ladder.py, remediation/signatures.py),
docs/alerts.md (a test compares its tables with this module) and the tests all read it. It is data
only; the XID classes that refine `fault_class` live beside it in gpupulse/xid.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

# The labels every gpupulse alert carries besides alertname (docs/alerts.md, "Labels every gpupulse
# alert carries"); the controller keys on fault_class and target_kind.
SEVERITY_LABEL = "severity"
LAYER_LABEL = "layer"
FAULT_CLASS_LABEL = "fault_class"
TARGET_KIND_LABEL = "target_kind"
ALERT_LABELS: tuple[str, ...] = (SEVERITY_LABEL, LAYER_LABEL, FAULT_CLASS_LABEL, TARGET_KIND_LABEL)

Severity = Literal["critical", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info")

Layer = Literal["hardware", "scheduling", "serving", "observability"]
LAYERS: tuple[Layer, ...] = ("hardware", "scheduling", "serving", "observability")

TargetKind = Literal["pod", "gpu", "node", "exporter"]
TARGET_KINDS: tuple[TargetKind, ...] = ("pod", "gpu", "node", "exporter")

# The labels that identify a target of each kind (docs/alerts.md, "Identity of a remediation target");
# an exporter target falls back to `instance` when `node` is unknown.
TARGET_IDENTITY: Mapping[TargetKind, tuple[str, ...]] = {
    "pod": ("namespace", "pod"),
    "gpu": ("node", "uuid"),
    "node": ("node",),
    "exporter": ("node",),
}

# The fault_class values an alert may carry (the table of docs/alerts.md; a test keeps them in step).
FAULT_CLASSES: tuple[str, ...] = (
    "xid_app",
    "xid_reset",
    "gpu_lost",
    "gpu_hardware",
    "thermal",
    "memory_leak",
    "memory_pressure",
    "idle_allocated",
    "serving_latency",
    "kv_cache",
    "host_starvation",
    "page_cache_eviction",
    "model_artifact",
    "crash_loop",
    "observability",
)
