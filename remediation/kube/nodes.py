"""Cordon, taint and uncordon a Node with optimistic concurrency (resourceVersion, re-read on 409)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupulse.clock import Clock
from remediation.errors import KubeConflict
from remediation.kube.client import JSON, KubeClient
from remediation.kube.timing import micro_time

ANNOTATION_REASON = "gpupulse.io/remediation-reason"
ANNOTATION_CORDONED_AT = "gpupulse.io/cordoned-at"
# set when the node was already unschedulable before we touched it: auto-uncordon then leaves it so
ANNOTATION_WAS_UNSCHEDULABLE = "gpupulse.io/was-unschedulable"

_TAINT_VALUE_MAX = 63


class NodeConflict(Exception):
    """Every attempt to patch the node met a newer resourceVersion."""


@dataclass(frozen=True)
class NodeChange:
    """What a cordon or uncordon did."""

    node: str
    changed: bool
    attempts: int
    resource_version: str


def taint_value(reason: str) -> str:
    """A label-value-safe short form of `reason` (<= 63 chars, alphanumerics at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", reason)[:_TAINT_VALUE_MAX]
    return cleaned.strip("._-") or "remediation"


def _taints(node: JSON) -> list[dict[str, Any]]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or []]


async def _patch_with_retry(
    client: KubeClient,
    name: str,
    build: Callable[[JSON], Mapping[str, Any] | None],
    attempts: int,
    guard: Callable[[], None],
) -> NodeChange:
    """Read, build a patch from what was read, write it conditionally; on 409 start over."""
    for attempt in range(1, attempts + 1):
        node = await client.get_node(name)
        rv = str((node.get("metadata") or {}).get("resourceVersion") or "")
        patch = build(node)
        if patch is None:
            return NodeChange(name, False, attempt, rv)
        guard()
        body = dict(patch)
        body["metadata"] = {**dict(body.get("metadata") or {}), "resourceVersion": rv}
        try:
            written = await client.patch_node(name, body)
        except KubeConflict:
            continue
        return NodeChange(
            name, True, attempt, str((written.get("metadata") or {}).get("resourceVersion") or "")
        )
    raise NodeConflict(f"node {name}: {attempts} patches in a row met a newer resourceVersion")


async def cordon_and_taint(
    client: KubeClient,
    name: str,
    taint_key: str,
    reason: str,
    clock: Clock,
    attempts: int,
    guard: Callable[[], None],
) -> NodeChange:
    """spec.unschedulable=true plus a `taint_key`=<reason>:NoSchedule taint; a no-op when already so."""
    value = taint_value(reason)

    def build(node: JSON) -> Mapping[str, Any] | None:
        spec = node.get("spec") or {}
        taints = _taints(node)
        ours = [t for t in taints if t.get("key") == taint_key and t.get("effect") == "NoSchedule"]
        if spec.get("unschedulable") and ours:
            return None
        annotations: dict[str, Any] = {
            ANNOTATION_REASON: reason[:1024],
            ANNOTATION_CORDONED_AT: micro_time(clock.utcnow()),
        }
        if spec.get("unschedulable") and not ours:
            annotations[ANNOTATION_WAS_UNSCHEDULABLE] = "true"
        if not ours:
            taints.append({"key": taint_key, "value": value, "effect": "NoSchedule"})
        # the taint list is replaced whole: resourceVersion makes this read-modify-write safe
        return {"metadata": {"annotations": annotations}, "spec": {"unschedulable": True, "taints": taints}}

    return await _patch_with_retry(client, name, build, attempts, guard)


async def uncordon(
    client: KubeClient, name: str, taint_key: str, attempts: int, guard: Callable[[], None]
) -> NodeChange:
    """Undo what cordon_and_taint did: our taint goes; unschedulable only if we set it."""

    def build(node: JSON) -> Mapping[str, Any] | None:
        taints = _taints(node)
        kept = [t for t in taints if t.get("key") != taint_key]
        if len(kept) == len(taints):
            return None  # not ours: a human or another tool cordoned it
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        was_unschedulable = annotations.get(ANNOTATION_WAS_UNSCHEDULABLE) == "true"
        return {
            "metadata": {
                "annotations": {
                    ANNOTATION_REASON: None,
                    ANNOTATION_CORDONED_AT: None,
                    ANNOTATION_WAS_UNSCHEDULABLE: None,
                }
            },
            "spec": {"unschedulable": was_unschedulable or None, "taints": kept or None},
        }

    return await _patch_with_retry(client, name, build, attempts, guard)
