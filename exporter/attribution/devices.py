"""Device ids from the kubelet (device-plugin ids, DRA claim devices) resolved against the GPUs NVML knows."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.attribution.podresources_proto import PodResources
from exporter.attribution.slices import DEFAULT_DRIVERS, DeviceKey, SliceDevice
from exporter.collectors.base import GpuRef, PodRef

# Resource names the NVIDIA device plugin advertises: whole GPUs, time-sliced/MPS replicas
# (renamed to `.shared` when renameByDefault is set) and MIG profiles under the mixed strategy.
DEFAULT_RESOURCE_PATTERNS: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")

_REPLICA_SUFFIX = re.compile(r"::\d+$")  # time-slicing / MPS replica: GPU-<uuid>::<n>
_GKE_VGPU_SUFFIX = re.compile(r"/vgpu\d+$")  # GKE sharing: nvidia0/vgpu3
_GKE_DEVICE = re.compile(r"^nvidia(\d+)(?:/gi\d+)?$")
_OLD_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+$")  # pre-R470 MIG id: MIG-GPU-<uuid>/<gi>/<ci>


@dataclass(frozen=True)
class Allocation:
    """One device the kubelet allocated to one container."""

    device_id: str  # replica suffix removed; GPU UUID, MIG UUID or the plugin's raw id
    resource: str  # the device plugin's resource name, or the DRA driver's name
    pod: PodRef
    parent_uuid: str = ""  # a DRA MIG device's GPU, from its ResourceSlice


@dataclass(frozen=True)
class ResolvedAllocation:
    """An allocation tied to the GPU (and MIG instance) NVML knows, where it can be."""

    key: str  # GPU UUID, MIG UUID, or the raw device id when NVML does not know it
    uuid: str
    gpu: str
    mig_uuid: str
    resource: str
    pod: PodRef


def resource_matcher(extra_patterns: Sequence[str] = ()) -> ResourceMatcher:
    """Build the filter for resource names that denote NVIDIA GPUs (globs allowed)."""
    return ResourceMatcher((*DEFAULT_RESOURCE_PATTERNS, *extra_patterns))


@dataclass(frozen=True)
class ResourceMatcher:
    patterns: tuple[str, ...]

    def __call__(self, resource_name: str) -> bool:
        return any(fnmatch.fnmatchcase(resource_name, pattern) for pattern in self.patterns)


def normalize_device_id(device_id: str) -> str:
    """Strip sharing suffixes so every replica of one GPU has the same id."""
    return _GKE_VGPU_SUFFIX.sub("", _REPLICA_SUFFIX.sub("", device_id.strip()))


def allocations_from_pods(
    pods: Iterable[PodResources],
    matcher: ResourceMatcher,
    slices: Mapping[DeviceKey, SliceDevice] | None = None,
    drivers: Sequence[str] = DEFAULT_DRIVERS,
) -> tuple[Allocation, ...]:
    """Flatten pod-resources into one Allocation per (device, container), replicas merged.

    Device-plugin devices come by id; DRA claim devices of the GPU drivers by (driver, pool,
    device), named through this node's ResourceSlices. A claim device no slice names yet keeps
    `driver/pool/device` as its id, so the pod still shows, with an empty uuid. A claim shared by
    several pods is reported under each of them, so each holds a share of the device.
    """
    seen: dict[tuple[str, str, PodRef], str] = {}
    index = slices or {}
    for pod in pods:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for devices in container.devices:
                if not matcher(devices.resource_name):
                    continue
                for raw_id in devices.device_ids:
                    seen[(normalize_device_id(raw_id), devices.resource_name, ref)] = ""
            for claim in container.dynamic_resources:
                for res in claim.claim_resources:
                    if res.driver_name not in drivers:
                        continue
                    known = index.get((res.driver_name, res.pool_name, res.device_name))
                    if known is None:
                        device_id, parent = f"{res.driver_name}/{res.pool_name}/{res.device_name}", ""
                    else:
                        device_id, parent = known.uuid, known.parent_uuid
                    seen.setdefault((device_id, res.driver_name, ref), parent)
    return tuple(Allocation(device_id=d, resource=r, pod=p, parent_uuid=u) for (d, r, p), u in seen.items())


def resolve(allocations: Iterable[Allocation], gpus: Sequence[GpuRef]) -> tuple[ResolvedAllocation, ...]:
    """Tie each allocation to NVML's view: GPU UUID, MIG UUID, or GKE's nvidia<N> index form."""
    by_uuid = {g.uuid: g for g in gpus if not g.mig_uuid}
    by_mig = {g.mig_uuid: g for g in gpus if g.mig_uuid}
    by_index = {g.index: g for g in gpus if not g.mig_uuid}
    parent_index = {g.uuid: g.index for g in gpus}
    rows = []
    for alloc in allocations:
        device_id = alloc.device_id
        uuid, gpu, mig_uuid, key = "", "", "", device_id
        if device_id in by_uuid:
            ref = by_uuid[device_id]
            uuid, gpu = ref.uuid, ref.index
        elif device_id in by_mig:
            ref = by_mig[device_id]
            uuid, gpu, mig_uuid = ref.uuid, ref.index, ref.mig_uuid
        elif (old := _OLD_MIG.match(device_id)) is not None:
            # The old MIG id names the parent only; the instance stays unknown.
            uuid = old.group(1)
            gpu = parent_index.get(uuid, "")
        elif (gke := _GKE_DEVICE.match(device_id)) is not None and gke.group(1) in by_index:
            ref = by_index[gke.group(1)]
            uuid, gpu, key = ref.uuid, ref.index, ref.uuid
        elif device_id.startswith("GPU-"):
            uuid = device_id
        elif device_id.startswith("MIG-"):
            # A MIG device NVML does not list (yet); a DRA slice still names its GPU.
            mig_uuid, uuid = device_id, alloc.parent_uuid
            gpu = parent_index.get(uuid, "") if uuid else ""
        rows.append(
            ResolvedAllocation(
                key=key, uuid=uuid, gpu=gpu, mig_uuid=mig_uuid, resource=alloc.resource, pod=alloc.pod
            )
        )
    return tuple(rows)


def allocation_map(rows: Iterable[ResolvedAllocation]) -> dict[str, tuple[PodRef, ...]]:
    """Device key -> the containers holding it, in first-seen order (NodeState.allocations)."""
    out: dict[str, dict[PodRef, None]] = {}
    for row in rows:
        out.setdefault(row.key, {})[row.pod] = None
    return {key: tuple(pods) for key, pods in out.items()}
