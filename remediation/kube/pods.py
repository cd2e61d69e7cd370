"""Pure reading of pod objects: owners, kinds of pods we must not touch, which pods use a GPU."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

JSON = Mapping[str, Any]

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class PodRef:
    """Enough to act on one pod and to say so in the ledger."""

    namespace: str
    name: str
    uid: str
    node: str

    @classmethod
    def of(cls, pod: JSON) -> PodRef:
        """Identity of an API pod object."""
        meta = pod.get("metadata") or {}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            node=str((pod.get("spec") or {}).get("nodeName") or ""),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def controller_owner(obj: JSON) -> JSON | None:
    """The ownerReference with controller=true, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def is_daemonset_pod(pod: JSON) -> bool:
    """Owned by a DaemonSet (it would come straight back on the same node)."""
    owner = controller_owner(pod)
    return owner is not None and owner.get("kind") == "DaemonSet"


def is_mirror_pod(pod: JSON) -> bool:
    """A static pod's read-only mirror: the kubelet owns it, the API cannot really delete it."""
    return MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {})


def is_terminating(pod: JSON) -> bool:
    """Deletion already requested."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_finished(pod: JSON) -> bool:
    """Succeeded or Failed: nothing runs any more."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def requests_gpu(pod: JSON, resource_prefixes: Iterable[str]) -> bool:
    """Any container (or init container) asks for a GPU or MIG resource."""
    prefixes = tuple(resource_prefixes)
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            if any(str(name).startswith(prefixes) for name in (resources.get(section) or {})):
                return True
    return False


def gpu_uuids(pod: JSON, annotation: str) -> set[str] | None:
    """GPU UUIDs the pod is annotated with, or None when it carries no such annotation."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(annotation)
    if value is None:
        return None
    return {part.strip() for part in str(value).split(",") if part.strip()}


def skip_reason(pod: JSON) -> str:
    """Why a drain leaves this pod alone ('' when it should be evicted)."""
    if is_mirror_pod(pod):
        return "mirror_pod"
    if is_daemonset_pod(pod):
        return "daemonset_pod"
    if is_terminating(pod):
        return "terminating"
    if is_finished(pod):
        return "finished"
    return ""


def pods_using_gpu(
    pods: Iterable[JSON], uuid: str, resource_prefixes: Iterable[str], annotation: str
) -> tuple[list[JSON], bool]:
    """GPU pods that may use `uuid`, and whether every one of them was matched exactly by annotation.

    An annotated pod is taken only when its list names `uuid`; an unannotated GPU pod is always taken,
    because the API server alone cannot tell which device the device plugin gave it.
    """
    gpu_pods = [p for p in pods if requests_gpu(p, resource_prefixes)]
    annotated = [(p, gpu_uuids(p, annotation)) for p in gpu_pods]
    chosen = [p for p, ids in annotated if ids is None or not uuid or uuid in ids]
    return chosen, bool(uuid) and all(ids is not None for _, ids in annotated)
