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

Layer = Literal["hardware", "scheduling", "serving", "training", "observability"]
LAYERS: tuple[Layer, ...] = ("hardware", "scheduling", "serving", "training", "observability")

TargetKind = Literal["pod", "gpu", "node", "exporter", "job", "controller"]
TARGET_KINDS: tuple[TargetKind, ...] = ("pod", "gpu", "node", "exporter", "job", "controller")

# A distributed training job (docs/design/training.md). Not `job`: Prometheus' own target label is
# called that, and an exported `job` would be renamed `exported_job` at scrape time.
TRAINING_JOB_LABEL = "training_job"
TRAINING_JOB_KIND_LABEL = "training_job_kind"
RANK_LABEL = "rank"
WORLD_SIZE_LABEL = "world_size"
# which per-rank signal named a straggler (TrainingRankStraggler)
SIGNAL_LABEL = "signal"

# The labels that identify a target of each kind (docs/alerts.md, "Identity of a remediation target");
# an exporter target falls back to `instance` when `node` is unknown. A job target may also name a
# suspect rank (`node`, `uuid`, `pod`, `rank`): evidence, and the node a migrate cordons.
TARGET_IDENTITY: Mapping[TargetKind, tuple[str, ...]] = {
    "pod": ("namespace", "pod"),
    "gpu": ("node", "uuid"),
    "node": ("node",),
    "exporter": ("node",),
    "job": ("namespace", TRAINING_JOB_KIND_LABEL, TRAINING_JOB_LABEL),
    # the remediation controller itself (its own alerts): never acted on, only paged, and routed past it
    "controller": ("namespace",),
}

# The values of training_job_kind: the top controller of a rank's pod as `Kind.group` (kubectl's
# spelling), which tells Volcano's Job from batch's. The controller restarts the first four
# (remediation/kube/jobs.py); the others are identified but page.
JOB_KINDS: tuple[str, ...] = (
    "JobSet.jobset.x-k8s.io",
    "PyTorchJob.kubeflow.org",
    "Job.batch.volcano.sh",
    "Job.batch",
    "LeaderWorkerSet.leaderworkerset.x-k8s.io",
    "StatefulSet.apps",
    "torchrun",  # no Kubernetes owner: named by its rendezvous endpoint (MASTER_ADDR:MASTER_PORT)
)


def job_kind(api_version: str, kind: str) -> str:
    """The training_job_kind value of an owner reference (`batch.volcano.sh/v1alpha1`, `Job`)."""
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return f"{kind}.{group}" if group else kind


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
    "controller",
    "training_hang",
    "training_straggler",
    "training_degraded",
    "training_node_fault",
)
