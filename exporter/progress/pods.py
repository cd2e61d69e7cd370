"""Which of this node's pods give a progress signal, and where: the progress plug-in's view of the
node's pod store (exporter/kube/pods.py; it has no watch of its own).

A running pod that is a rank of a training job (its controller or JobSet/LWS label, as
exporter/collectors/training.py decides) has its containers' logs read for step lines. A pod may
instead name a counter it already serves:

  gpupulse.io/progress-metric  the metric's name (a counter or gauge the job or its framework serves)
  gpupulse.io/progress-port    its port (required with the metric)
  gpupulse.io/progress-path    its path (default /metrics)
  gpupulse.io/progress-scheme  http|https (default http)
  gpupulse.io/progress-log     "false": do not read this pod's logs
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.collectors.training import pod_meta, rank_identity
from exporter.kube.pods import Pods

log = logging.getLogger(__name__)

PREFIX = "gpupulse.io/progress-"
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$")
_CONTAINER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label, as the API enforces
MAX_CONTAINERS = 16


@dataclass(frozen=True)
class MetricSource:
    """The counter a pod serves: its URL and its name."""

    url: str
    name: str


@dataclass(frozen=True)
class ProgressPod:
    """A rank pod of this node and where its progress comes from."""

    namespace: str
    name: str
    uid: str
    training_job_kind: str
    training_job: str
    rank: str
    containers: tuple[str, ...]  # whose logs are read (none when a metric is named or logs are off)
    metric: MetricSource | None = None

    @property
    def log_dir_name(self) -> str:
        """kubelet's directory of this pod under /var/log/pods."""
        return f"{self.namespace}_{self.name}_{self.uid}"


def _metric(pod: Mapping[str, Any], ann: Mapping[str, Any], where: str) -> MetricSource | None:
    name = ann.get(PREFIX + "metric")
    if not name:
        return None
    ip = (pod.get("status") or {}).get("podIP")
    try:
        port = int(ann[PREFIX + "port"])
        if not 0 < port < 65536:
            raise ValueError(port)
    except (KeyError, ValueError, TypeError):
        log.warning("pod %s: %smetric without a usable %sport", where, PREFIX, PREFIX)
        return None
    scheme = ann.get(PREFIX + "scheme", "http")
    if not isinstance(name, str) or not _METRIC_NAME.match(name) or scheme not in ("http", "https") or not ip:
        log.warning("pod %s: unusable %smetric %r (scheme %r, pod IP %r)", where, PREFIX, name, scheme, ip)
        return None
    path = str(ann.get(PREFIX + "path", "/metrics"))
    if not path.startswith("/"):
        path = "/" + path
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    return MetricSource(f"{scheme}://{host}:{port}{path}", name)


def progress_pod(pod: Mapping[str, Any]) -> ProgressPod | None:
    """The pod's progress sources, or None when it is no running rank of a job."""
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") != "Running":
        return None
    pm = pod_meta(pod)
    identity = rank_identity(pm.labels, pm.owner_refs, {})
    namespace, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
    if identity is None or not (namespace and name and uid):
        return None
    raw_ann = meta.get("annotations")
    ann: Mapping[str, Any] = raw_ann if isinstance(raw_ann, Mapping) else {}
    metric = _metric(pod, ann, f"{namespace}/{name}")
    containers: tuple[str, ...] = ()
    if metric is None and str(ann.get(PREFIX + "log", "true")).lower() != "false":
        spec = (pod.get("spec") or {}).get("containers")
        names = [c.get("name") for c in spec if isinstance(c, Mapping)] if isinstance(spec, list) else []
        containers = tuple(n for n in names if isinstance(n, str) and _CONTAINER.match(n))[:MAX_CONTAINERS]
    if metric is None and not containers:
        return None
    return ProgressPod(
        namespace,
        name,
        uid,
        identity.training_job_kind,
        identity.training_job,
        identity.rank,
        containers,
        metric,
    )


def progress_pods(pods: Pods) -> list[ProgressPod]:
    """The rank pods among this node's pods, in (namespace, name) order (the view the collector reads)."""
    return sorted(
        (p for obj in pods.values() if (p := progress_pod(obj)) is not None),
        key=lambda p: (p.namespace, p.name),
    )
