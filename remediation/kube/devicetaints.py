"""Quarantine of one DRA device: a DeviceTaintRule (resource.k8s.io/v1, Kubernetes 1.37) per device.

The rule's name is derived from the node and the device, so a retried or repeated migrate finds the
rule it made before instead of adding a second one. A rule is only ever raised (None < NoSchedule <
NoExecute), never lowered by a later, milder request; removing it is `remove_rule` (or the undo a page
prints). Rules carry our managed-by label: a rule of that name that is not ours is never touched.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from remediation.errors import KubeConflict, KubeNotFound, PermanentError
from remediation.kube.client import KubeClient
from remediation.kube.devices import RESOURCE_GROUP, RESOURCE_VERSION, Device
from remediation.kube.nodes import taint_value

JSON = dict[str, Any]
DeviceTaintEffect = Literal["None", "NoSchedule", "NoExecute"]
EFFECTS: tuple[DeviceTaintEffect, ...] = ("None", "NoSchedule", "NoExecute")  # mildest first
PLURAL = "devicetaintrules"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpupulse-remediation"}
UUID_ANNOTATION = "gpupulse.io/gpu-uuid"
NODE_ANNOTATION = "gpupulse.io/node"
REASON_ANNOTATION = "gpupulse.io/reason"
_NAME_MAX = 253
_UNSAFE = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class RuleChange:
    """What ensure_rule did: the rule's name, its effect now, and whether this call changed it."""

    name: str
    effect: str
    changed: bool
    uid: str = ""


def rule_name(node: str, device: Device) -> str:
    """The one name of the rule that taints `device` of `node` (a DNS subdomain, at most 253)."""
    digest = hashlib.sha256(f"{node}|{device.key}".encode()).hexdigest()[:10]
    readable = _UNSAFE.sub("-", f"{node}-{device.name}".lower()).strip("-")
    head = f"gpupulse-{readable}"[: _NAME_MAX - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


def undo_command(name: str) -> str:
    """What a human runs to return the device to service."""
    return f"kubectl delete devicetaintrule {name}"


def rule_body(
    node: str, device: Device, gpu_uuid: str, key: str, reason: str, effect: DeviceTaintEffect
) -> JSON:
    """The DeviceTaintRule that taints exactly one device (driver, pool and name all set)."""
    return {
        "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(node, device),
            "labels": dict(MANAGED_BY),
            # annotations: a node name or a reason may not fit a label value
            "annotations": {UUID_ANNOTATION: gpu_uuid, NODE_ANNOTATION: node, REASON_ANNOTATION: reason},
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": {"key": key, "value": taint_value(reason), "effect": effect},
        },
    }


def _ours(rule: Mapping[str, Any]) -> bool:
    labels = (rule.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in MANAGED_BY.items())


def _rank(effect: str) -> int:
    # an effect unknown to us (a later Kubernetes) counts as None, as the API asks consumers to
    ranks: dict[str, int] = {e: i for i, e in enumerate(EFFECTS)}
    return ranks.get(effect, 0)


async def ensure_rule(client: KubeClient, body: Mapping[str, Any], guard: Callable[[], None]) -> RuleChange:
    """Create the rule, or raise an existing one of ours to `body`'s effect; idempotent."""
    name = str(body["metadata"]["name"])
    wanted = str(body["spec"]["taint"]["effect"])
    guard()
    try:
        made = await client.create_cluster_object(RESOURCE_GROUP, RESOURCE_VERSION, PLURAL, body)
        return RuleChange(name, wanted, True, str((made.get("metadata") or {}).get("uid") or ""))
    except KubeConflict:
        pass  # there already: ours from an earlier attempt, or someone else's
    current = await client.get_cluster_object(RESOURCE_GROUP, RESOURCE_VERSION, PLURAL, name)
    uid = str((current.get("metadata") or {}).get("uid") or "")
    if not _ours(current):
        raise PermanentError(f"DeviceTaintRule {name} exists and is not gpupulse's: left alone")
    taint = (current.get("spec") or {}).get("taint") or {}
    have = str(taint.get("effect") or "None")
    same_device = (current.get("spec") or {}).get("deviceSelector") == body["spec"]["deviceSelector"]
    if same_device and _rank(have) >= _rank(wanted):
        return RuleChange(name, have, False, uid)
    guard()
    rv = str(current["metadata"].get("resourceVersion") or "")
    patch = {"metadata": {"resourceVersion": rv}, "spec": body["spec"]}
    await client.patch_cluster_object(RESOURCE_GROUP, RESOURCE_VERSION, PLURAL, name, patch)
    return RuleChange(name, wanted, True, uid)


async def remove_rule(client: KubeClient, name: str, guard: Callable[[], None]) -> bool:
    """Delete our rule of this name; False when there was none (or it is not ours)."""
    try:
        current = await client.get_cluster_object(RESOURCE_GROUP, RESOURCE_VERSION, PLURAL, name)
    except KubeNotFound:
        return False
    if not _ours(current):
        return False
    guard()
    try:
        uid = str(current["metadata"].get("uid") or "")
        await client.delete_cluster_object(RESOURCE_GROUP, RESOURCE_VERSION, PLURAL, name, uid)
    except KubeNotFound:
        return False
    return True
