"""This node's pods' labels and controller ownerReference, the attribution plug-in's view of the
node's pod store (the kubelet's pod-resources API has neither): what training.py needs to name a GPU
process's job.

Only the two small parts are kept per pod in the view (the store holds the objects once for every
plug-in). Off without API access: then a process's job comes from its environment alone
(exporter/attribution/training.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.kube.pods import Pods

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodMeta:
    """The parts of a pod's metadata that say which job it belongs to."""

    labels: Mapping[str, str]
    owner_refs: tuple[Mapping[str, Any], ...]  # the controller ownerReference only (at most one)


def pod_meta(pod: Mapping[str, Any]) -> PodMeta:
    """The labels (string values only) and the controller ownerReference of a pod object."""
    meta = pod.get("metadata") or {}
    raw = meta.get("labels")
    labels = (
        {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(raw, Mapping)
        else {}
    )
    refs = meta.get("ownerReferences")
    owners = tuple(
        {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
        for r in (refs if isinstance(refs, list) else ())
        if isinstance(r, Mapping) and r.get("controller") is True
    )[:1]
    return PodMeta(labels, owners)


PodMetas = Mapping[tuple[str, str], PodMeta]  # (namespace, name) -> its metadata


def pod_metas(pods: Pods) -> PodMetas:
    """Every pod's metadata: a map made whole on each change, never changed in place (the rank rows
    are kept while it is the same object)."""
    # rebuilt per change: pods of one node are few, and a rebuild never leaves a deleted pod behind
    return {key: pod_meta(pod) for key, pod in pods.items()}
