"""Return a quarantined DRA GPU to service, tested: validate it, and only on a pass delete its rules.

A fail leaves every DeviceTaintRule in place and says so (a `PermanentError` whose `left` carries the
undo), so the ladder escalates with the GPU still out of service. The node Lease is held only to
delete the rules, not through a validation that may take 45 minutes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

from gpupulse.clock import Clock
from remediation.errors import PermanentError
from remediation.kube.client import KubeClient
from remediation.kube.devices import Device
from remediation.kube.devicetaints import remove_rule, rule_name, undo_command
from remediation.kube.validation import ValidationSettings, level_for, run_validation
from remediation.model import ActionResult

NodeLock = Callable[[str], AbstractAsyncContextManager[None]]


def validation_name(incident_id: int, attempt: int) -> str:
    """One Job (and claim) per incident and attempt: a retried call waits on the same one."""
    return f"gpupulse-validate-{incident_id}-{attempt}"


async def return_device(
    client: KubeClient,
    node: str,
    uuid: str,
    devices: Sequence[Device],
    fault_class: str,
    name: str,
    settings: ValidationSettings,
    clock: Clock,
    guard: Callable[[], None],
    node_lock: NodeLock,
) -> ActionResult:
    """Validate the GPU `uuid` (its own device, not a MIG instance), then remove the rules of `devices`."""
    gpu = next((d for d in devices if d.uuid == uuid), devices[0])
    level = level_for(fault_class, settings)
    outcome = await run_validation(client, name, node, gpu, level, settings, clock, guard)
    names = [rule_name(node, d) for d in devices]
    details = {"node": node, "validation_job": outcome.job, "level": level, "passed": outcome.passed}
    if not outcome.passed:
        error = PermanentError(f"GPU {uuid} on {node} stays out of service: {outcome.reason} (level {level})")
        error.left = f"GPU {uuid} of node {node} still tainted; undo: {undo_command(' '.join(names))}"
        raise error
    async with node_lock(node):
        removed = [n for n in names if await remove_rule(client, n, guard)]
    summary = f"GPU {uuid} on {node} passed validation (level {level}); removed rules {' '.join(removed)}"
    return ActionResult(done=True, summary=summary, details={**details, "removed": removed})
