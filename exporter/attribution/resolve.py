"""Process -> pod: cgroup pod UID, named through learned UIDs, the kubelet pod directory or the GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from exporter.attribution.podresources_proto import PodResources
from exporter.collectors.base import PodRef
from exporter.host.cgroup import CgroupIdentity
from exporter.host.procfs import ProcessInfo

UNATTRIBUTED = PodRef(namespace="", pod="", container="")

PodKey = tuple[str, str]  # (namespace, pod name)


class _Answer(NamedTuple):
    """One PID's pod and the inputs it came from."""

    identity: CgroupIdentity | None
    readable: bool | None
    device_keys: frozenset[str]
    allocations: Mapping[str, Sequence[PodRef]]
    containers: Mapping[PodKey, tuple[str, ...]]
    named: PodKey | None  # the name its pod UID had
    ref: PodRef


class ProcessDevices(NamedTuple):
    """A GPU process and the devices it is on (a round makes one per GPU process)."""

    pid: int
    device_keys: frozenset[str]  # MIG UUIDs for MIG processes, else GPU UUIDs


class PodResolver:
    """Keeps what it learned about pod UIDs between rounds, only for pods that still exist."""

    def __init__(self, lookup_uid: Callable[[str], tuple[str, str] | None] | None = None) -> None:
        self._lookup_uid = lookup_uid
        self._uid_names: dict[str, PodKey] = {}
        # containers per pod of the last kubelet answer: the tracker replaces its answer whole
        self._containers: tuple[Sequence[PodResources], dict[PodKey, tuple[str, ...]]] | None = None
        self._answers: dict[int, _Answer] = {}  # last round's answer per PID, with what it came from

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
        containers = self._containers_of(pods)
        self._uid_names = {uid: key for uid, key in self._uid_names.items() if key in containers}
        out = {}
        seen_uids = set()
        last, answers = self._answers, {}
        for proc in processes:
            info = infos.get(proc.pid)
            identity = info.identity if info is not None else None
            readable = info.cgroup_readable if info is not None else None
            named = None
            if identity is not None:
                seen_uids.add(identity.pod_uid)
                named = self._uid_names.get(identity.pod_uid)
            got = last.get(proc.pid)
            # The same inputs give the same answer, where it needs no lookup and teaches nothing: a
            # named UID, or none at all (every round once the pods are known).
            if (
                got is None
                or (identity is not None and named is None)
                or got.named != named
                or got.readable != readable
                or got.allocations is not allocations
                or got.containers is not containers
                or got.device_keys != proc.device_keys
                or (got.identity is not identity and got.identity != identity)
            ):
                ref = self._resolve_one(proc, info, allocations, containers)
                got = _Answer(identity, readable, proc.device_keys, allocations, containers, named, ref)
            answers[proc.pid] = got
            out[proc.pid] = got.ref
        self._answers = answers
        # Forget UIDs of pods whose processes left the GPUs; they are looked up again if they return.
        self._uid_names = {uid: key for uid, key in self._uid_names.items() if uid in seen_uids}
        return out

    def resolve_known(
        self,
        processes: Sequence[ProcessDevices],
        infos: Mapping[int, ProcessInfo],
        allocations: Mapping[str, Sequence[PodRef]],
        pods: Sequence[PodResources],
    ) -> dict[int, PodRef] | None:
        """What resolve() gives, when it needs no pod directory read (every pod UID it meets is named
        already or needs no name): never blocks. None, with nothing learned, when it would read one."""
        lookup, uid_names, answers = self._lookup_uid, self._uid_names, self._answers
        wanted: list[str] = []
        if lookup is not None:
            self._lookup_uid = lambda uid: wanted.append(uid)  # noted; None: as if it had no hint
        try:
            out = self.resolve(processes, infos, allocations, pods)
        finally:
            self._lookup_uid = lookup
        if wanted:
            # resolve() replaces both dicts before changing them: the ones before are untouched
            self._uid_names, self._answers = uid_names, answers
            return None
        return out

    def _containers_of(self, pods: Sequence[PodResources]) -> dict[PodKey, tuple[str, ...]]:
        memo = self._containers
        if memo is None or memo[0] is not pods:
            memo = self._containers = (
                pods,
                {(p.namespace, p.name): tuple(c.name for c in p.containers) for p in pods},
            )
        return memo[1]

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
