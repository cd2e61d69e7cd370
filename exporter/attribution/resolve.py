"""Process -> pod: cgroup pod UID, named through learned UIDs, the kubelet pod directory or the GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.attribution.podresources_proto import PodResources
from exporter.collectors.base import PodRef
from exporter.host.procfs import ProcessInfo

UNATTRIBUTED = PodRef(namespace="", pod="", container="")

PodKey = tuple[str, str]  # (namespace, pod name)


@dataclass(frozen=True)
class ProcessDevices:
    pid: int
    device_keys: frozenset[str]  # MIG UUIDs for MIG processes, else GPU UUIDs


class PodResolver:
    """Keeps what it learned about pod UIDs between rounds, only for pods that still exist."""

    def __init__(self, lookup_uid: Callable[[str], tuple[str, str] | None] | None = None) -> None:
        self._lookup_uid = lookup_uid
        self._uid_names: dict[str, PodKey] = {}

    @property
    def known_uids(self) -> int:
        """How many pod UIDs have a name now (bounded by the pods on the node)."""
        return len(self._uid_names)

    def resolve(
        self,
        processes: Iterable[ProcessDevices],
        infos: Mapping[int, ProcessInfo],
        allocations: Mapping[str, Sequence[PodRef]],
        pods: Sequence[PodResources],
    ) -> dict[int, PodRef]:
        """Pod of every process; UNATTRIBUTED where it cannot be told (blocking when lookup reads files)."""
        containers = {(p.namespace, p.name): tuple(c.name for c in p.containers) for p in pods}
        self._uid_names = {uid: key for uid, key in self._uid_names.items() if key in containers}
        out = {}
        seen_uids = set()
        for proc in processes:
            info = infos.get(proc.pid)
            if info is not None and info.identity is not None:
                seen_uids.add(info.identity.pod_uid)
            out[proc.pid] = self._resolve_one(proc, info, allocations, containers)
        # Forget UIDs of pods whose processes left the GPUs; they are looked up again if they return.
        self._uid_names = {uid: key for uid, key in self._uid_names.items() if uid in seen_uids}
        return out

    def _resolve_one(
        self,
        proc: ProcessDevices,
        info: ProcessInfo | None,
        allocations: Mapping[str, Sequence[PodRef]],
        containers: Mapping[PodKey, tuple[str, ...]],
    ) -> PodRef:
        identity = info.identity if info is not None else None
        if info is not None and info.cgroup_readable and identity is None:
            return UNATTRIBUTED  # a host process, even if it runs on an allocated GPU
        candidates = list(
            dict.fromkeys(ref for key in sorted(proc.device_keys) for ref in allocations.get(key, ()))
        )
        named = self._name_of(identity.pod_uid, containers) if identity is not None else None
        if named is not None:
            holding = {ref.container for ref in candidates if (ref.namespace, ref.pod) == named}
            if len(holding) == 1:
                return PodRef(named[0], named[1], holding.pop())
            # Not allocated this GPU (e.g. sees all GPUs) or several of its containers share it.
            only = containers.get(named, ())
            return PodRef(named[0], named[1], only[0] if len(only) == 1 and not holding else "")
        distinct = {(ref.namespace, ref.pod) for ref in candidates}
        if len(distinct) != 1:
            return UNATTRIBUTED  # shared GPU and no name for the UID: do not guess
        key = distinct.pop()
        if identity is not None:
            self._uid_names[identity.pod_uid] = key  # exclusive GPU: this UID is that pod
        holding = {ref.container for ref in candidates}
        return PodRef(key[0], key[1], holding.pop() if len(holding) == 1 else "")

    def _name_of(self, uid: str, containers: Mapping[PodKey, tuple[str, ...]]) -> PodKey | None:
        known = self._uid_names.get(uid)
        if known is not None:
            return known
        if self._lookup_uid is None:
            return None
        hint = self._lookup_uid(uid)
        if hint is None:
            return None
        namespace, name = hint
        if namespace:
            matches = [(namespace, name)] if (namespace, name) in containers else []
        else:
            matches = [key for key in containers if key[1] == name]
        if len(matches) != 1:
            return None
        self._uid_names[uid] = matches[0]
        return matches[0]
