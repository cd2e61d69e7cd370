"""The cluster's side of pools and lemons: which nodes of a node's pool are out, and the lemon mark.

A node is out when it is cordoned (spec.unschedulable, whoever did it: a human's cordon takes
capacity as surely as ours) or carries our taint. A lemon's node gets the label gpupulse.io/lemon=true
(`kubectl get nodes -l gpupulse.io/lemon`) and an annotation naming the lemon GPUs and their history;
auto-uncordon (and validation, later) refuse a node with that label until a human removes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from remediation.kube.client import JSON, KubeClient

LEMON_LABEL = "gpupulse.io/lemon"
LEMON_ANNOTATION = "gpupulse.io/lemon-detail"
# an annotation value is bounded by the node object's size, not by 63 characters as a label's is
_DETAIL_MAX = 4096


@dataclass(frozen=True)
class PoolCount:
    """A node's pool as the cluster has it now: its name, its nodes, those of them out of service."""

    pool: str
    total: int
    out: frozenset[str]


def is_out(node: JSON, taint_key: str) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return True
    return any(t.get("key") == taint_key for t in spec.get("taints") or [])


def is_gpu_node(node: JSON, resource_prefixes: Sequence[str]) -> bool:
    """Whether the node offers a GPU resource (nvidia.com/gpu, a MIG profile): the default pool."""
    capacity = (node.get("status") or {}).get("capacity") or {}
    return any(str(k).startswith(p) for k in capacity for p in resource_prefixes)


async def count_pool(
    client: KubeClient, node: str, label: str, taint_key: str, resource_prefixes: Sequence[str]
) -> PoolCount:
    """The pool of `node`: the nodes sharing its value of `label` (with no label set, every GPU node;
    a node without the label is a pool of the nodes without it)."""
    if label:
        own = await client.get_node(node)
        value = str(((own.get("metadata") or {}).get("labels") or {}).get(label, ""))
        nodes = await client.list_nodes(f"{label}={value}" if value else f"!{label}")
        pool = f"{label}={value}" if value else f"without {label}"
    else:
        nodes = [n for n in await client.list_nodes() if is_gpu_node(n, resource_prefixes)]
        pool = ""
    names = {str(n["metadata"]["name"]) for n in nodes}
    names.add(node)  # a node the alert names is in its pool even if its capacity is not reported yet
    out = frozenset(str(n["metadata"]["name"]) for n in nodes if is_out(n, taint_key)) - {node}
    return PoolCount(pool, len(names), out)


def lemon_of(node: JSON) -> str:
    """The lemon mark on a node ("" when it has none): why it must stay out."""
    meta = node.get("metadata") or {}
    if str((meta.get("labels") or {}).get(LEMON_LABEL, "")).lower() != "true":
        return ""
    return str((meta.get("annotations") or {}).get(LEMON_ANNOTATION, "")) or "marked by a human"


async def mark_lemon(
    client: KubeClient, node: str, uuids: Sequence[str], detail: str, guard: Callable[[], None]
) -> None:
    """Label the node a lemon and say why in an annotation (one merge patch: idempotent)."""
    guard()
    text = (f"GPUs {', '.join(uuids)}: " if uuids else "") + detail
    await client.patch_node(
        node,
        {
            "metadata": {
                "labels": {LEMON_LABEL: "true"},
                "annotations": {LEMON_ANNOTATION: text[:_DETAIL_MAX]},
            }
        },
    )
