"""Device quarantine on a real kube-apiserver and kube-controller-manager 1.37 (tests/kube/realapi.py):
the controller, with the chart's ServiceAccount and ClusterRole, finds a GPU in a ResourceSlice of a
fake DRA driver and taints that one device. The server's own validation accepts the DeviceTaintRule
(resource.k8s.io/v1 is served by default in 1.37: no feature gate, no --runtime-config), and the
controller-manager's device-taint eviction reports on it (EvictionInProgress) and, for NoExecute,
evicts the pod holding the device while its neighbour on the next GPU stays."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpupulse.clock import SystemClock
from remediation.backends.kubernetes import KubernetesBackend
from remediation.kube.client import KubeClient, KubeClientSettings
from remediation.kube.devicetaints import remove_rule
from remediation.model import Target
from tests.kube.conftest import backend_settings
from tests.kube.realapi import (
    JSON,
    KubeHTTPError,
    RealCluster,
    RealKube,
    add_node,
    ensure_namespace,
    real_cluster,
    service_account_token,
    wait_for,
    write_kubeconfig,
)

pytestmark = [pytest.mark.real_apiserver, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]
__all__ = ["real_cluster"]  # the session fixture, imported so that pytest finds it here

CONTROLLER_NS = "gpupulse"
RELEASE = "pulse"
DRIVER = "gpu.example.com"  # a fake DRA driver: nothing but its ResourceSlices and claims
R = "/apis/resource.k8s.io/v1"
GPUS = 4


def _create(kube: RealKube, obj: JSON) -> None:
    clean = {k: v for k, v in obj.items() if k != "status"}
    clean["metadata"] = {k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels")}
    try:
        kube.apply(clean)
    except KubeHTTPError as e:
        if e.status != 409:  # applied by an earlier module of this session
            raise


@pytest.fixture(scope="module")
def controller_token(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The chart's controller ServiceAccount, ClusterRole and binding applied as Helm renders them."""
    from tests.helm.installs import install_values  # helm-sdkpy, which scripts/setup installs

    kube = real_cluster.kube
    ensure_namespace(kube, CONTROLLER_NS)
    installed = install_values(tmp_path_factory.mktemp("helm"), CONTROLLER_NS, {})
    name = f"{RELEASE}-gpupulse-controller"
    for obj in installed.objects:
        if obj["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            if obj["metadata"]["name"] == name:
                if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
                    obj = {**obj, "metadata": {**obj["metadata"], "namespace": CONTROLLER_NS}}
                _create(kube, obj)
    with contextlib.suppress(KubeHTTPError):  # one class for the fake driver, as a driver ships it
        kube.post(
            f"{R}/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
            },
        )
    return service_account_token(kube, CONTROLLER_NS, name)


@pytest.fixture
async def client(
    real_cluster: RealCluster, controller_token: str, tmp_path: Path
) -> AsyncIterator[KubeClient]:
    plane = real_cluster.plane
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", plane.url, plane.ca_file, controller_token)
    c = await KubeClient.connect(
        KubeClientSettings(kubeconfig_path=str(kubeconfig), request_timeout_seconds=10)
    )
    yield c
    await c.close()


@contextlib.contextmanager
def dra_node(real_cluster: RealCluster) -> Iterator[tuple[str, str]]:
    """A node whose GPUs the fake driver publishes (pool = node, uuid attribute as NVIDIA's driver
    has it) and a namespace with one pod per GPU, each holding its GPU through an allocated claim."""
    kube = real_cluster.kube
    node, ns = real_cluster.unique("dra"), real_cluster.unique("train")
    add_node(kube, node)
    ensure_namespace(kube, ns)
    devices = [
        {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node}-{i}"}}}
        for i in range(GPUS)
    ]
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
    for i in range(GPUS):
        _pod_holding(kube, ns, node, i)
    try:
        yield node, ns
    finally:
        kube.delete(f"/api/v1/namespaces/{ns}")
        for path in (f"{R}/resourceslices/{node}-{DRIVER}", f"/api/v1/nodes/{node}"):
            with contextlib.suppress(KubeHTTPError):
                kube.delete(path)


def _pod_holding(kube: RealKube, ns: str, node: str, index: int) -> None:
    """rank-<index> on `node`, holding gpu-<index> as the scheduler and the driver would leave it."""
    claim = f"rank-{index}-gpu"
    kube.post(
        f"{R}/namespaces/{ns}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        },
    )
    pod = kube.post(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"rank-{index}", "namespace": ns},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [
                    {"name": "main", "image": "trainer:test", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    current = kube.get(f"{R}/namespaces/{ns}/resourceclaims/{claim}")
    on_node = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    current["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{index}"}]
            },
            "nodeSelector": {"nodeSelectorTerms": [on_node]},
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }
    kube.request("PUT", f"{R}/namespaces/{ns}/resourceclaims/{claim}/status", current)


def _backend(client: KubeClient, **overrides: object) -> KubernetesBackend:
    settings = backend_settings(namespace=CONTROLLER_NS, dra_drivers=(DRIVER,), **overrides)
    return KubernetesBackend(client, settings, SystemClock())


def _live_pods(kube: RealKube, ns: str) -> list[str]:
    items = kube.get(f"/api/v1/namespaces/{ns}/pods").get("items") or []
    return sorted(p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp"))


def _condition(kube: RealKube, rule: str) -> JSON:
    conditions = (kube.get(f"{R}/devicetaintrules/{rule}").get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "EvictionInProgress"), {})


async def test_the_server_accepts_the_rule_and_only_the_pod_on_that_gpu_moves(
    real_cluster: RealCluster, client: KubeClient
) -> None:
    kube = real_cluster.kube
    with dra_node(real_cluster) as (node, ns):
        result = await _backend(client).migrate(Target(kind="gpu", node=node, uuid=f"GPU-{node}-2"), "xid 48")
        (made,) = result.details["device_taint_rules"]
        rule = kube.get(f"{R}/devicetaintrules/{made['name']}")
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": "gpu-2"}
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        assert rule["spec"]["taint"]["timeAdded"]  # the server's defaulting ran: the object is stored
        assert rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpupulse-remediation"
        assert result.details["evicted"] == [f"{ns}/rank-2"]
        wait_for(lambda: "rank-2" not in _live_pods(kube, ns), 30, "rank-2 evicted")
        assert _live_pods(kube, ns) == ["rank-0", "rank-1", "rank-3"]  # the other GPUs keep serving
        spec = kube.get(f"/api/v1/nodes/{node}").get("spec") or {}
        assert not spec.get("unschedulable") and not spec.get("taints")
        # the controller-manager has seen it: NoSchedule evicts nothing by itself
        wait_for(lambda: bool(_condition(kube, made["name"])), 30, "EvictionInProgress on the rule")
        assert _condition(kube, made["name"])["status"] == "False"
        # again: the same rule is found (409 on create, then get), nothing else changes
        again = await _backend(client).migrate(Target(kind="gpu", node=node, uuid=f"GPU-{node}-2"), "xid 48")
        assert again.details["device_taint_rules"][0]["changed"] is False
        # the undo the page prints, with the chart's grants
        assert await remove_rule(client, made["name"], lambda: None) is True
        assert not kube.exists(f"{R}/devicetaintrules/{made['name']}")


async def test_effect_none_previews_and_noexecute_lets_the_controller_manager_evict(
    real_cluster: RealCluster, client: KubeClient
) -> None:
    kube = real_cluster.kube
    with dra_node(real_cluster) as (node, ns):
        target = Target(kind="gpu", node=node, uuid=f"GPU-{node}-1")
        preview = await _backend(client, device_taint_effect="None").migrate(target, "xid 79")
        name = preview.details["device_taint_rules"][0]["name"]
        wait_for(lambda: bool(_condition(kube, name)), 30, "the preview on the rule")
        condition = _condition(kube, name)
        assert (condition["status"], condition["reason"]) == ("False", "NoEffect")
        assert "1 pod would be evicted" in condition["message"]
        assert _live_pods(kube, ns) == [f"rank-{i}" for i in range(GPUS)]
        # raised to NoExecute: the same rule, patched; the controller-manager deletes the holder
        moved = await _backend(client, device_taint_effect="NoExecute").migrate(target, "xid 79")
        assert moved.details["device_taint_rules"][0] == {
            "name": name,
            "device": f"{DRIVER}/{node}/gpu-1",
            "effect": "NoExecute",
            "changed": True,
        }
        wait_for(lambda: "rank-1" not in _live_pods(kube, ns), 30, "rank-1 evicted by the controller-manager")
        assert _live_pods(kube, ns) == ["rank-0", "rank-2", "rank-3"]
        assert kube.get(f"{R}/devicetaintrules/{name}")["metadata"]["generation"] == 2
        await remove_rule(client, name, lambda: None)


def test_the_server_accepts_the_validation_job_and_its_claim(real_cluster: RealCluster) -> None:
    """The objects remediation/kube/validation.py makes pass the real server's validation: a claim
    whose CEL selector names the GPU and which tolerates our taint, a Job whose pod holds it."""
    from remediation.kube.devices import Device
    from remediation.kube.validation import ValidationSettings, validation_objects

    kube = real_cluster.kube
    ns = real_cluster.unique("validate")
    ensure_namespace(kube, ns)
    try:
        settings = ValidationSettings(namespace=ns, image="registry.example/dcgm:test", device_class=DRIVER)
        job, claim = validation_objects(
            "gpupulse-validate-1-1", "n", Device(DRIVER, "n", "gpu-0", "GPU-0"), 2, settings
        )
        assert claim is not None
        stored = kube.post(f"{R}/namespaces/{ns}/resourceclaims", claim)
        (request,) = stored["spec"]["devices"]["requests"]
        assert request["exactly"]["tolerations"] == [{"key": "gpupulse.io/remediation", "operator": "Exists"}]
        made = kube.post(f"/apis/batch/v1/namespaces/{ns}/jobs", job)
        assert made["spec"]["template"]["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": "gpupulse-validate-1-1"}
        ]
        node_job, none = validation_objects("gpupulse-validate-2-1", "n", None, 1, settings)
        assert none is None
        kube.post(f"/apis/batch/v1/namespaces/{ns}/jobs", node_job)
    finally:
        kube.delete(f"/api/v1/namespaces/{ns}")
