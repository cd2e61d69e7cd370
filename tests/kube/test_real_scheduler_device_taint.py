"""The real kube-scheduler 1.37 honours the controller's DeviceTaintRule: a new claim is allocated a
healthy GPU of the same node, never the tainted one; with only the tainted GPU left the pod waits
Unschedulable; the undo the page prints (deleting the rule) lets it have the GPU again. The
validation Job's claim, which tolerates the taint, is given the quarantined GPU, and its pass
returns it.

A control plane of its own (tests/kube/realapi.py's, plus kube-scheduler from the same module), and
no stand-in kubelet: here the scheduler, not our player, binds pods and allocates claims.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from demo.neighbours import neighbour_binary
from gpupulse.clock import SystemClock
from remediation.backends.kubernetes import KubernetesBackend
from remediation.kube.client import KubeClient, KubeClientSettings
from remediation.kube.devicetaints import remove_rule
from remediation.kube.validation import ValidationSettings
from remediation.model import Target
from tests.kube.conftest import backend_settings
from tests.kube.realapi import (
    ADMIN_TOKEN,
    JSON,
    ControlPlane,
    ControlPlaneError,
    RealKube,
    add_node,
    ensure_namespace,
    env_missing_reason,
    free_port,
    wait_for,
    write_kubeconfig,
)

pytestmark = [pytest.mark.real_apiserver, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

DRIVER = "gpu.example.com"
R = "/apis/resource.k8s.io/v1"
NODE = "dra-1"
NS = "serve"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler; one DRA node, two GPUs."""
    reason = env_missing_reason()
    if reason is not None:  # scripts/setup builds them: a missing binary is a failure, not a skip
        pytest.fail(reason)
    plane = ControlPlane(tmp_path_factory.mktemp("scheduler-plane"))
    try:
        plane.start()
        kubeconfig = write_kubeconfig(
            plane.workdir / "scheduler.kubeconfig", plane.url, plane.ca_file, ADMIN_TOKEN
        )
        plane._spawn(
            "kube-scheduler",
            [
                str(neighbour_binary("kubernetes", "kube-scheduler")),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
        )
        kube = plane.client()
        add_node(kube, NODE)
        ensure_namespace(kube, NS)
        _publish(kube)
    except BaseException as e:
        logs = plane.logs()
        plane.stop()
        raise ControlPlaneError(f"the control plane did not start: {e}\n{logs}") from None
    try:
        yield plane
    finally:
        plane.stop()


def _publish(kube: RealKube) -> None:
    kube.post(
        f"{R}/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
    )
    devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in range(2)]
    kube.post(
        f"{R}/resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
    )


@pytest.fixture
async def client(plane: ControlPlane, tmp_path: Path) -> AsyncIterator[KubeClient]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", plane.url, plane.ca_file, ADMIN_TOKEN)
    c = await KubeClient.connect(
        KubeClientSettings(kubeconfig_path=str(kubeconfig), request_timeout_seconds=10)
    )
    yield c
    await c.close()


def _claimed_pod(kube: RealKube, name: str) -> None:
    """A pod asking for one GPU of the fake driver through a claim of its own; no node named."""
    kube.post(
        f"{R}/namespaces/{NS}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        },
    )
    kube.post(
        f"/api/v1/namespaces/{NS}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [
                    {"name": "main", "image": "vllm:test", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )


def _allocated(kube: RealKube, claim: str) -> str:
    """The device the scheduler allocated to the claim ("" while none)."""
    status = kube.get(f"{R}/namespaces/{NS}/resourceclaims/{claim}").get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return str(results[0]["device"]) if results else ""


def _unschedulable(kube: RealKube, pod: str) -> JSON:
    conditions = (kube.get(f"/api/v1/namespaces/{NS}/pods/{pod}").get("status") or {}).get("conditions") or []
    return next(
        (c for c in conditions if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"), {}
    )


async def test_the_scheduler_keeps_new_claims_off_the_tainted_gpu_until_the_undo(
    plane: ControlPlane, client: KubeClient
) -> None:
    kube = plane.client()
    backend = KubernetesBackend(
        client, backend_settings(namespace="default", dra_drivers=(DRIVER,)), SystemClock()
    )
    result = await backend.migrate(Target(kind="gpu", node=NODE, uuid="GPU-0"), "xid 48")
    (rule,) = result.details["device_taint_rules"]

    _claimed_pod(kube, "first")
    wait_for(lambda: bool(_allocated(kube, "first")), 60, "the scheduler to allocate the first claim")
    assert _allocated(kube, "first") == "gpu-1"  # the node's healthy GPU, not the tainted gpu-0
    assert kube.get(f"/api/v1/namespaces/{NS}/pods/first")["spec"].get("nodeName") == NODE

    _claimed_pod(kube, "second")  # only the tainted GPU is free now
    wait_for(lambda: bool(_unschedulable(kube, "second")), 60, "the second pod to be found unschedulable")
    assert _allocated(kube, "second") == ""

    assert await remove_rule(client, rule["name"], lambda: None) is True
    wait_for(lambda: _allocated(kube, "second") == "gpu-0", 90, "the returned GPU to be allocated")


async def test_the_validation_job_lands_on_the_tainted_gpu_and_its_pass_returns_it(
    plane: ControlPlane, client: KubeClient
) -> None:
    """The validation's claim tolerates our taint, so the real scheduler gives it the quarantined GPU
    (and nothing else gets it); the Job completing (the test plays the kubelet) deletes the rule."""
    kube = plane.client()
    node = "dra-2"
    add_node(kube, node)
    devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-2-{i}"}}} for i in range(2)]
    kube.post(
        f"{R}/resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
    )
    validation = ValidationSettings(
        namespace=NS, image="dcgm:test", device_class=DRIVER, poll_seconds=0.2, timeout_seconds={2: 120.0}
    )
    settings = backend_settings(namespace="default", dra_drivers=(DRIVER,), validation=validation)
    backend = KubernetesBackend(client, settings, SystemClock())
    target = Target(kind="gpu", node=node, uuid="GPU-2-1")
    (rule,) = (await backend.migrate(target, "xid 48")).details["device_taint_rules"]

    returning = asyncio.ensure_future(backend.return_to_service(target, "xid_reset", 42, 1))
    name = "gpupulse-validate-42-1"

    def scheduled_pod() -> JSON:
        pods = kube.get(f"/api/v1/namespaces/{NS}/pods?labelSelector=job-name%3D{name}").get("items") or []
        return next((p for p in pods if p["spec"].get("nodeName")), {})

    await asyncio.to_thread(wait_for, lambda: bool(scheduled_pod()), 60, "the validation pod to be scheduled")
    assert _allocated(kube, name) == "gpu-1"  # the quarantined GPU itself, allowed by the toleration
    pod = scheduled_pod()
    assert pod["spec"]["nodeName"] == node
    assert kube.exists(f"{R}/devicetaintrules/{rule['name']}")  # still out while it validates
    kube.merge_patch(
        f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status", {"status": {"phase": "Succeeded"}}
    )
    result = await asyncio.wait_for(returning, 120)
    assert result.details["passed"] is True and result.details["removed"] == [rule["name"]]
    assert not kube.exists(f"{R}/devicetaintrules/{rule['name']}")
