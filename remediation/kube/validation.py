"""Test before return to service (issue 39 item 3, first part): a validation Job on the quarantined GPU.

The Job runs the configured command (default `dcgmi diag -r <level>`, the level chosen by the fault
class: docs/design/device-quarantine.md) on exactly the quarantined device: its pod holds a
ResourceClaim whose CEL selector names the GPU's UUID and which tolerates our taint, so the
validation lands on the tainted GPU and no other work does. Pass is the Job's `Complete` condition;
`Failed` or the deadline is a fail. Only a pass lets the caller lift the quarantine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupulse.clock import Clock
from remediation.errors import KubeConflict
from remediation.kube.client import KubeClient
from remediation.kube.devices import RESOURCE_GROUP, RESOURCE_VERSION, Device

JSON = dict[str, Any]
LEVEL_PLACEHOLDER = "{level}"
# DCGM diagnostics: r1 seconds (software, row remap), r2 about 2 min (memory, PCIe), r3 about 15 min
DEFAULT_LEVELS: Mapping[str, int] = {
    "xid_app": 1,
    "xid_reset": 2,
    "gpu_hardware": 2,
    "thermal": 2,
    "gpu_lost": 3,
}
DEFAULT_TIMEOUTS: Mapping[int, float] = {1: 300.0, 2: 900.0, 3: 2700.0}
LABELS = {"app.kubernetes.io/managed-by": "gpupulse-remediation", "app.kubernetes.io/component": "validation"}


@dataclass(frozen=True)
class ValidationSettings:
    """What the validation Job runs, where, and for how long."""

    namespace: str  # the controller's namespace: the Job and its claim live there
    image: str
    command: tuple[str, ...] = ("dcgmi", "diag", "-r", LEVEL_PLACEHOLDER)
    levels: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LEVELS))
    default_level: int = 2
    timeout_seconds: Mapping[int, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    device_class: str = "gpu.nvidia.com"  # the DeviceClass of the DRA driver's GPUs
    taint_key: str = "gpupulse.io/remediation"
    service_account: str = ""
    poll_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("validation needs an image (with dcgmi for the default command)")
        for level in {self.default_level, *self.levels.values()}:
            if level not in (1, 2, 3):
                raise ValueError(f"validation level {level} is not 1, 2 or 3 (dcgmi diag -r)")


@dataclass(frozen=True)
class ValidationOutcome:
    """How one validation ended: passed, why, and the Job that ran it."""

    passed: bool
    reason: str
    job: str
    level: int


def validation_from_mapping(raw: Mapping[str, Any], namespace: str) -> ValidationSettings:
    """The `validation` mapping of a backend config file (unknown keys are an error); the Job lives
    in the controller's namespace unless the mapping names another."""
    if not isinstance(raw, Mapping):
        raise ValueError("validation must be a mapping")
    known = set(ValidationSettings.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown validation settings: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {"namespace": namespace, **raw}
    if "command" in values:
        values["command"] = tuple(str(part) for part in values["command"])
    if "levels" in values:
        values["levels"] = {str(k): int(v) for k, v in dict(values["levels"]).items()}
    if "timeout_seconds" in values:
        values["timeout_seconds"] = {int(k): float(v) for k, v in dict(values["timeout_seconds"]).items()}
    return ValidationSettings(**values)


def level_for(fault_class: str, settings: ValidationSettings) -> int:
    """The diagnostic level for a fault: deeper the more the fault says about the hardware."""
    return settings.levels.get(fault_class, settings.default_level)


def validation_objects(
    name: str, node: str, device: Device | None, level: int, settings: ValidationSettings
) -> tuple[JSON, JSON | None]:
    """The Job (and, for a DRA device, its ResourceClaim) that validates `device` or the whole `node`."""
    command = [part.replace(LEVEL_PLACEHOLDER, str(level)) for part in settings.command]
    container: JSON = {"name": "validate", "image": settings.image, "command": command}
    pod: JSON = {"restartPolicy": "Never"}
    claim: JSON | None = None
    if device is not None:
        selector = f'device.attributes["{device.driver}"].uuid == "{device.uuid}"'
        request = {
            "name": "gpu",
            "exactly": {
                "deviceClassName": settings.device_class,
                "selectors": [{"cel": {"expression": selector}}],
                # the device carries our taint: without this the scheduler never allocates it
                "tolerations": [{"key": settings.taint_key, "operator": "Exists"}],
            },
        }
        claim = {
            "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": settings.namespace, "labels": dict(LABELS)},
            "spec": {"devices": {"requests": [request]}},
        }
        container["resources"] = {"claims": [{"name": "gpu"}]}
        pod["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    else:
        pod["nodeName"] = node
        pod["tolerations"] = [
            {"key": settings.taint_key, "operator": "Exists"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        ]
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    pod["containers"] = [container]
    job: JSON = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": dict(LABELS)},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(settings.timeout_seconds.get(level, DEFAULT_TIMEOUTS[3])),
            "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": {"labels": dict(LABELS)}, "spec": pod},
        },
    }
    return job, claim


def job_verdict(job: Mapping[str, Any]) -> tuple[bool, str] | None:
    """(passed, reason) once the Job finished; None while it runs."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return True, "validation Job completed"
        if condition.get("type") == "Failed":
            why = condition.get("message") or condition.get("reason") or "failed"
            return False, f"validation Job failed: {why}"
    return None


async def _create(client: KubeClient, group: str, version: str, plural: str, body: JSON) -> None:
    try:
        await client.create_custom_object(group, version, str(body["metadata"]["namespace"]), plural, body)
    except KubeConflict:
        pass  # made by an earlier attempt of this validation: wait on that one


async def run_validation(
    client: KubeClient,
    name: str,
    node: str,
    device: Device | None,
    level: int,
    settings: ValidationSettings,
    clock: Clock,
    guard: Callable[[], None],
) -> ValidationOutcome:
    """Start the validation (idempotently by name) and wait for its verdict until its deadline."""
    job, claim = validation_objects(name, node, device, level, settings)
    guard()
    if claim is not None:
        await _create(client, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", claim)
    await _create(client, "batch", "v1", "jobs", job)
    deadline = clock.monotonic() + settings.timeout_seconds.get(level, DEFAULT_TIMEOUTS[3])
    while True:
        verdict = job_verdict(await client.get_job(settings.namespace, name))
        if verdict is not None:
            return ValidationOutcome(verdict[0], verdict[1], name, level)
        if clock.monotonic() >= deadline:
            return ValidationOutcome(False, f"validation Job {name} gave no verdict in time", name, level)
        await clock.sleep(settings.poll_seconds)
