"""This node's pods' labels and controller ownerReference, from a pod watch (the kubelet's
pod-resources API has neither): what training.py needs to name a GPU process's job.

Only the two small parts are kept per pod, never the whole object (a node runs ~100 pods; their
specs would be most of the memory). Off without API access: then a process's job comes from its
environment alone (exporter/attribution/training.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.kube.reflector import PodReflector

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


class PodMetadataSource(PodReflector):
    """(namespace, name) -> PodMeta for this node's pods; `lookup` never waits on the API server."""

    log = log

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meta: dict[tuple[str, str], PodMeta] = {}

    def lookup(self, namespace: str, name: str) -> PodMeta | None:
        """The pod's metadata, or None when the watch has not seen it (or is off or failing)."""
        return self._meta.get((namespace, name))

    def __len__(self) -> int:
        return len(self._meta)

    @property
    def metas(self) -> Mapping[tuple[str, str], PodMeta]:
        """Every pod's metadata now: a map replaced whole on each change, never changed in place."""
        return self._meta

    def _publish(self) -> None:
        # rebuilt per change: pods of one node are few, and a rebuild never leaves a deleted pod behind
        self._meta = {key: pod_meta(pod) for key, pod in self._objects.items()}
