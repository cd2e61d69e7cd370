"""Pod UID and container id from the text of /proc/<pid>/cgroup.

Handled layouts (cgroup v1 and v2, either kubelet cgroup driver, any CRI):
  systemd:  .../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope  (crio-, docker-)
  cgroupfs: .../kubepods/burstable/pod<uid>/<id>
and the same with the Guaranteed QoS class (no QoS level), nested kubelets (kind) and paths seen
through a cgroup namespace (prefixed with /../..). Only the pod segment is required.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_POD_UID = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})(?:\.slice)?(?:/|$)"
)
# The segment after the pod: systemd scope with a CRI prefix, or the bare id (cgroupfs driver).
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-fA-F]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupIdentity:
    pod_uid: str  # lower-case, dashed
    container_id: str  # 64 hex digits, or "" when the process sits in the pod cgroup itself


def parse_cgroup(text: str) -> CgroupIdentity | None:
    """Find the pod (and container) a process belongs to; None for processes outside pods."""
    best: CgroupIdentity | None = None
    for line in text.splitlines():
        # v1: "<id>:<controllers>:<path>", v2: "0::<path>"; the path may itself contain ':'.
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        identity = _parse_path(parts[2])
        if identity is None:
            continue
        if identity.container_id:
            return identity
        best = best or identity
    return best


def _parse_path(path: str) -> CgroupIdentity | None:
    match = _POD_UID.search(path)
    if match is None:
        return None
    uid = match.group(1).replace("_", "-").lower()
    rest = [segment for segment in path[match.end() :].split("/") if segment]
    container_id = ""
    if rest:
        # crio-conmon-<id>.scope is the monitor, not the container; it does not match _CONTAINER.
        found = _CONTAINER.match(rest[0])
        if found is not None:
            container_id = found.group(1).lower()
    return CgroupIdentity(pod_uid=uid, container_id=container_id)
