"""The migrate rung for one GPU where DRA allocates GPUs: taint its devices, move the pods holding them.

Where GPUs are allocated by DRA, the scheduler honours a device's taints, so one bad GPU of eight
is taken out with a DeviceTaintRule while the node and its other GPUs keep serving (no cordon). The
pods that hold the device move according to the taint's effect:
  - NoSchedule (the default): the rule keeps new claims off the device, and gpupulse evicts the
    holders through the Eviction API, so PodDisruptionBudgets are honoured; a holder whose claim
    tolerates the taint stays.
  - NoExecute: kube-controller-manager's device-taint eviction deletes the holders that do not
    tolerate the taint (tolerations yes, PodDisruptionBudgets no); gpupulse evicts nothing itself.
  - None: nothing moves; the controller-manager writes what NoExecute would evict into the rule's
    EvictionInProgress condition (a preview).
Which faults take this path and why the node path stays for the others: docs/design/device-quarantine.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpupulse.clock import Clock
from remediation.errors import PermanentError, TemporaryError
from remediation.kube.client import KubeClient
from remediation.kube.devices import Device, Holder, find_holders
from remediation.kube.devicetaints import DeviceTaintEffect, RuleChange, ensure_rule, rule_body, undo_command
from remediation.kube.eviction import EvictionReport, EvictionSettings, evict_pods
from remediation.kube.nodes import taint_value
from remediation.kube.pods import PodRef, is_terminating, skip_reason
from remediation.model import ActionResult


@dataclass(frozen=True)
class DeviceQuarantineSettings:
    """How a device is taken out (KubernetesBackendSettings carries these)."""

    taint_key: str
    effect: DeviceTaintEffect
    eviction: EvictionSettings
    blocked_retry_delay_seconds: float


def left_text(node: str, uuid: str, changes: Sequence[RuleChange], devices: Sequence[Device]) -> str:
    """What the quarantine leaves on the cluster, and the command that undoes it."""
    names = " ".join(c.name for c in changes)
    where = ", ".join(d.key for d in devices)
    effect = changes[0].effect if changes else "?"
    return (
        f"GPU {uuid} of node {node} ({where}) tainted by DeviceTaintRule {names} ({effect}); "
        f"the node is not cordoned; undo: {undo_command(names)}"
    )


async def quarantine_device(
    client: KubeClient,
    node: str,
    uuid: str,
    devices: Sequence[Device],
    reason: str,
    settings: DeviceQuarantineSettings,
    clock: Clock,
    guard: Callable[[], None],
    left: list[str],
) -> ActionResult:
    """Taint each device of GPU `uuid` with its own rule, then move its holders per the effect."""
    changes = []
    for device in devices:
        body = rule_body(node, device, uuid, settings.taint_key, reason, settings.effect)
        changes.append(await ensure_rule(client, body, guard))
    if changes:
        left.append(left_text(node, uuid, changes, devices))
    taint = {"key": settings.taint_key, "value": taint_value(reason), "effect": settings.effect}
    holders = await find_holders(client, devices, taint)
    details: dict[str, Any] = {
        "node": node,
        "quarantine": "device",
        "cordoned": False,
        "device_taint_rules": [
            {"name": c.name, "device": d.key, "effect": c.effect, "changed": c.changed}
            for c, d in zip(changes, devices, strict=True)
        ],
        "holders": [h.key for h in holders],
        "tolerating": [h.key for h in holders if h.tolerates],
        "left": "; ".join(left),
    }
    rules = ", ".join(c.name for c in changes)
    moving = [h for h in holders if not h.tolerates]
    if settings.effect != "NoSchedule":
        who = "kube-controller-manager evicts" if settings.effect == "NoExecute" else "would affect"
        details["evicted"] = []
        summary = f"tainted GPU {uuid} on {node} ({rules}, {settings.effect}); {who} {len(moving)} pod(s)"
        return ActionResult(done=True, summary=summary, details=details)
    report = await _evict_holders(client, node, moving, settings, clock, guard)
    details.update(
        evicted=sorted(report.evicted),
        gone=sorted(report.gone),
        blocked=dict(sorted(report.blocked.items())),
        terminating=dict(sorted(report.terminating.items())),
        misconfigured=dict(sorted(report.misconfigured.items())),
        eviction_attempts=report.attempts,
    )
    what = f"GPU {uuid} on {node} tainted ({rules})"
    if report.misconfigured:
        first = next(iter(report.misconfigured.values()))
        raise PermanentError(f"{what}; eviction refused as misconfigured: {first}")
    stuck = {**report.blocked, **report.terminating}
    if stuck:
        raise TemporaryError(
            f"{what}; {', '.join(sorted(stuck))} not moved after {settings.eviction.deadline_seconds:.0f}s "
            f"({len(report.evicted)} evicted): {next(iter(stuck.values()))}",
            settings.blocked_retry_delay_seconds,
        )
    summary = (
        f"tainted GPU {uuid} on {node} ({rules}), evicted {len(report.evicted)} pod(s); node not cordoned"
    )
    return ActionResult(done=True, summary=summary, details=details)


async def preview_device(
    client: KubeClient,
    node: str,
    uuid: str,
    devices: Sequence[Device],
    reason: str,
    taint_key: str,
    guard: Callable[[], None],
) -> ActionResult:
    """The dry run's quarantine: each device's rule with effect None, which moves nothing and which
    kube-controller-manager answers with what NoExecute would evict (a stronger rule stays as it is)."""
    changes = [
        await ensure_rule(client, rule_body(node, d, uuid, taint_key, reason, "None"), guard) for d in devices
    ]
    names = " ".join(c.name for c in changes)
    details: dict[str, Any] = {
        "node": node,
        "quarantine": "device",
        "device_taint_rules": [
            {"name": c.name, "device": d.key, "effect": c.effect, "changed": c.changed}
            for c, d in zip(changes, devices, strict=True)
        ],
        "left": left_text(node, uuid, changes, devices),
    }
    summary = (
        f"dry run: DeviceTaintRule {names} has effect {changes[0].effect}; its status says what would move"
    )
    return ActionResult(done=True, summary=summary, details=details)


async def _evict_holders(
    client: KubeClient,
    node: str,
    holders: Sequence[Holder],
    settings: DeviceQuarantineSettings,
    clock: Clock,
    guard: Callable[[], None],
) -> EvictionReport:
    """Evict the holders still on the node (an already terminating one is only waited for)."""
    wanted = {(h.key, h.uid) for h in holders}
    on_node = await client.list_pods_on_node(node)
    mine = [p for p in on_node if (PodRef.of(p).key, PodRef.of(p).uid) in wanted]
    live = [p for p in mine if skip_reason(p) in ("", "terminating")]
    return await evict_pods(
        client,
        [PodRef.of(p) for p in live if not is_terminating(p)],
        settings.eviction,
        clock,
        guard,
        terminating=[PodRef.of(p) for p in live if is_terminating(p)],
    )
