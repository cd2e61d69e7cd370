"""Return to service, tested: a validation Job on exactly the quarantined GPU (a claim that names its
UUID and tolerates our taint), its level chosen by the fault, and the DeviceTaintRule deleted only on
a pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import PermanentError
from remediation.kube.validation import ValidationSettings
from remediation.model import Target
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import StepClock

Make = Callable[..., KubernetesBackend]
DRIVER = "gpu.nvidia.com"
JOB = ("batch/v1", "jobs", "gpupulse", "gpupulse-validate-7-1")
CLAIM = ("resource.k8s.io/v1", "resourceclaims", "gpupulse", "gpupulse-validate-7-1")
TARGET = Target(kind="gpu", node="gpu-1", uuid="GPU-1")


def _quarantined(api: FakeKubeAPI) -> None:
    api.add_node("gpu-1")
    devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in range(2)]
    api.add_resourceslice("s", "gpu-1", DRIVER, "gpu-1", devices)


def _finish_job_after(
    api: FakeKubeAPI, clock: StepClock, sleeps: int, condition: str, message: str = ""
) -> None:
    """Play the Job controller: the Job reaches `condition` after that many polls."""

    def finish(n: int) -> None:
        if n == sleeps and JOB in api.objects:
            api.objects[JOB]["status"] = {
                "conditions": [{"type": condition, "status": "True", "message": message}]
            }

    clock.after_sleep.append(finish)


def _settings(**overrides: object) -> ValidationSettings:
    values: dict[str, object] = {
        "namespace": "gpupulse",
        "image": "registry.example/dcgm:test",
        "poll_seconds": 5.0,
    }
    values.update(overrides)
    return ValidationSettings(**values)  # type: ignore[arg-type]


async def test_a_pass_deletes_the_rule_and_the_job_ran_on_that_gpu_only(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _quarantined(kube_api)
    backend = make_backend()
    await backend.migrate(TARGET, "xid 48")
    assert len(kube_api.dra.rules) == 1
    _finish_job_after(kube_api, clock, 2, "Complete")
    result = await make_backend(validation=_settings()).return_to_service(TARGET, "xid_reset", 7, 1)

    assert not kube_api.dra.rules
    assert result.details["passed"] is True and result.details["level"] == 2
    job = kube_api.objects[JOB]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["dcgmi", "diag", "-r", "2"]  # xid_reset: memory and PCIe too
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 900
    (request,) = kube_api.objects[CLAIM]["spec"]["devices"]["requests"]
    (selector,) = request["exactly"]["selectors"]
    assert selector["cel"]["expression"] == 'device.attributes["gpu.nvidia.com"].uuid == "GPU-1"'
    assert request["exactly"]["tolerations"] == [{"key": "gpupulse.io/remediation", "operator": "Exists"}]
    assert "nodeName" not in job["spec"]["template"]["spec"]  # the claim places it, on that device


async def test_a_fail_keeps_the_gpu_out_and_says_how_to_undo(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _quarantined(kube_api)
    backend = make_backend()
    await backend.migrate(TARGET, "xid 79")
    _finish_job_after(kube_api, clock, 1, "Failed", "BackoffLimitExceeded")
    with pytest.raises(PermanentError, match=r"stays out of service.*BackoffLimitExceeded") as caught:
        await make_backend(validation=_settings()).return_to_service(TARGET, "gpu_lost", 7, 1)
    assert len(kube_api.dra.rules) == 1
    assert "kubectl delete devicetaintrule" in caught.value.left
    command = kube_api.objects[JOB]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-1] == "3"  # a GPU that fell off the bus gets the long diagnostic


async def test_no_verdict_by_the_deadline_is_a_fail(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    _quarantined(kube_api)
    backend = make_backend()
    await backend.migrate(TARGET, "xid 48")
    with pytest.raises(PermanentError, match="no verdict in time"):
        await make_backend(validation=_settings(timeout_seconds={2: 30.0})).return_to_service(
            TARGET, "thermal", 7, 1
        )
    assert len(kube_api.dra.rules) == 1


async def test_a_retried_call_waits_on_the_job_it_started(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _quarantined(kube_api)
    backend = make_backend()
    await backend.migrate(TARGET, "xid 48")
    with pytest.raises(PermanentError):
        await make_backend(validation=_settings(timeout_seconds={2: 10.0})).return_to_service(
            TARGET, "xid_reset", 7, 1
        )
    _finish_job_after(kube_api, clock, len(clock.sleeps) + 1, "Complete")
    await make_backend(validation=_settings()).return_to_service(TARGET, "xid_reset", 7, 1)
    assert len(kube_api.calls("POST", "/jobs$")) == 2  # the second create met 409 and waited on the first
    assert not kube_api.dra.rules


def test_settings_refuse_a_level_dcgmi_does_not_have_and_a_missing_image() -> None:
    with pytest.raises(ValueError, match="level 4"):
        _settings(levels={"gpu_lost": 4})
    with pytest.raises(ValueError, match="image"):
        _settings(image="")


async def test_without_a_configured_validation_the_gpu_stays_out(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _quarantined(kube_api)
    await make_backend().migrate(TARGET, "xid 48")
    with pytest.raises(PermanentError, match="no validation is configured"):
        await make_backend().return_to_service(TARGET, "xid_reset", 7, 1)
    assert len(kube_api.dra.rules) == 1 and not kube_api.calls("POST", "/jobs$")


def test_the_backend_config_file_carries_the_validation() -> None:
    from remediation.backends.kubernetes import settings_from_mapping

    raw = {
        "namespace": "gpupulse",
        "identity": "a",
        "validation": {
            "image": "dcgm:1",
            "command": ["sh", "-c", "dcgmi diag -r {level}"],
            "levels": {"thermal": 1},
        },
    }
    validation = settings_from_mapping(raw).validation
    assert validation is not None and validation.namespace == "gpupulse"
    assert validation.command == ("sh", "-c", "dcgmi diag -r {level}") and validation.levels == {"thermal": 1}
    with pytest.raises(ValueError, match="unknown validation settings: imag"):
        settings_from_mapping({**raw, "validation": {"imag": "x"}})
