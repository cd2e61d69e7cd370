"""migrate of one GPU where DRA allocates it: a DeviceTaintRule for that device, no cordon, its
holders evicted within their PodDisruptionBudgets; device-plugin clusters keep the node path."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import PermanentError, TemporaryError
from remediation.kube.devices import Device, holders_of, tolerates
from remediation.kube.devicetaints import rule_name
from remediation.model import Target
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import StepClock

Make = Callable[..., KubernetesBackend]
DRIVER = "gpu.nvidia.com"
TAINT = "gpupulse.io/remediation"


def _gpu(index: int, uuid: str) -> dict[str, object]:
    return {"name": f"gpu-{index}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}


def _dra_node(api: FakeKubeAPI, node: str = "gpu-1", gpus: int = 8) -> None:
    """A node whose GPUs NVIDIA's DRA driver publishes (pool = node name), one pod per GPU."""
    api.add_node(node)
    api.add_resourceslice(f"{node}-{DRIVER}", node, DRIVER, node, [_gpu(i, f"GPU-{i}") for i in range(gpus)])
    for i in range(gpus):
        pod = api.add_pod("ml", f"rank-{i}", node, owner=("Job", f"train-{i}"))
        api.dra.add_claim("ml", f"rank-{i}-gpu", (DRIVER, node, f"gpu-{i}"), pod)


def _target(uuid: str = "GPU-3", node: str = "gpu-1") -> Target:
    return Target(kind="gpu", node=node, uuid=uuid)


async def test_gpu_fault_taints_only_that_device_and_evicts_only_its_pod(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _dra_node(kube_api)
    result = await make_backend().migrate(_target(), "GPUFellOffBus xid=79")

    name = rule_name("gpu-1", Device(DRIVER, "gpu-1", "gpu-3", "GPU-3"))
    (rule,) = kube_api.dra.rules.values()
    assert rule["metadata"]["name"] == name
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "gpu-1", "device": "gpu-3"}
    assert rule["spec"]["taint"]["key"] == TAINT
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert rule["spec"]["taint"]["value"] == "GPUFellOffBus_xid_79"
    assert rule["metadata"]["annotations"]["gpupulse.io/gpu-uuid"] == "GPU-3"
    # the node keeps serving: no cordon, no node taint; only GPU 3's pod moves, by eviction
    node = kube_api.nodes["gpu-1"]
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
    assert kube_api.deleted and [(d[0], d[2]) for d in kube_api.deleted] == [("ml/rank-3", "eviction")]
    assert result.details["quarantine"] == "device"
    assert result.details["evicted"] == ["ml/rank-3"]
    assert f"kubectl delete devicetaintrule {name}" in result.details["left"]
    assert "not cordoned" in result.summary


async def test_repeated_migrate_finds_its_rule_instead_of_adding_one(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _dra_node(kube_api, gpus=2)
    backend = make_backend()
    await backend.migrate(_target("GPU-1"), "xid 48")
    again = await backend.migrate(_target("GPU-1"), "xid 48 again")
    assert len(kube_api.dra.rules) == 1
    assert again.details["device_taint_rules"][0]["changed"] is False
    assert len(kube_api.calls("POST", "/devicetaintrules$")) == 2  # the second create met 409
    assert not kube_api.calls("PATCH", "/devicetaintrules/")


async def test_a_stronger_effect_raises_the_rule_and_a_milder_one_never_lowers_it(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _dra_node(kube_api, gpus=2)
    await make_backend(device_taint_effect="None").migrate(_target("GPU-0"), "preview")
    (rule,) = kube_api.dra.rules.values()
    assert rule["spec"]["taint"]["effect"] == "None"
    assert not kube_api.deleted  # a None taint moves nothing
    await make_backend(device_taint_effect="NoExecute").migrate(_target("GPU-0"), "xid 79")
    (rule,) = kube_api.dra.rules.values()
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    assert rule["metadata"]["generation"] == 2
    # NoExecute: kube-controller-manager evicts (tolerations honoured); gpupulse evicts nothing itself
    assert not kube_api.deleted
    await make_backend().migrate(_target("GPU-0"), "xid 48")
    assert kube_api.dra.rules[rule["metadata"]["name"]]["spec"]["taint"]["effect"] == "NoExecute"


async def test_mig_instances_of_the_faulty_gpu_are_tainted_with_it(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_node("gpu-1")
    mig = {
        "name": "gpu-0-mig-0",
        "attributes": {"uuid": {"string": "MIG-a"}, "gpu.nvidia.com/parentUUID": {"string": "GPU-0"}},
    }
    kube_api.add_resourceslice("s", "gpu-1", DRIVER, "gpu-1", [_gpu(0, "GPU-0"), mig, _gpu(1, "GPU-1")])
    result = await make_backend().migrate(_target("GPU-0"), "row remap failure")
    devices = sorted(r["spec"]["deviceSelector"]["device"] for r in kube_api.dra.rules.values())
    assert devices == ["gpu-0", "gpu-0-mig-0"]
    assert len(result.details["device_taint_rules"]) == 2


async def test_a_holder_whose_claim_tolerates_the_taint_stays(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_resourceslice("s", "gpu-1", DRIVER, "gpu-1", [_gpu(0, "GPU-0")])
    diag = kube_api.add_pod("ml", "diag", "gpu-1", owner=("Job", "diag"))
    work = kube_api.add_pod("ml", "work", "gpu-1", owner=("Job", "work"))
    toleration = {"key": TAINT, "operator": "Exists"}
    kube_api.dra.add_claim("ml", "diag-gpu", (DRIVER, "gpu-1", "gpu-0"), diag, tolerations=[toleration])
    kube_api.dra.add_claim("ml", "work-gpu", (DRIVER, "gpu-1", "gpu-0"), work)
    result = await make_backend().migrate(_target("GPU-0"), "xid 48")
    assert [d[0] for d in kube_api.deleted] == ["ml/work"]
    assert result.details["tolerating"] == ["ml/diag"]


async def test_pdb_blocking_a_holder_is_temporary_and_leaves_the_rule_in_place(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_resourceslice("s", "gpu-1", DRIVER, "gpu-1", [_gpu(0, "GPU-0")])
    pod = kube_api.add_pod("ml", "llm-0", "gpu-1", owner=("StatefulSet", "llm"), labels={"app": "llm"})
    kube_api.dra.add_claim("ml", "llm-0-gpu", (DRIVER, "gpu-1", "gpu-0"), pod)
    kube_api.add_pdb("ml", "llm", {"app": "llm"}, 0)
    with pytest.raises(TemporaryError) as caught:
        await make_backend().migrate(_target("GPU-0"), "xid 48")
    assert "ml/llm-0" in str(caught.value)
    assert "kubectl delete devicetaintrule" in caught.value.left
    assert len(kube_api.dra.rules) == 1


async def test_device_plugin_cluster_keeps_the_node_path(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_pod("ml", "llm-0", "gpu-1", owner=("StatefulSet", "llm"), gpus=1)
    result = await make_backend().migrate(_target("GPU-0"), "xid 79")
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True
    assert not kube_api.dra.rules
    assert result.details["cordoned"] is True


async def test_server_without_resource_api_keeps_the_node_path(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.resourceslice_versions = ("v1beta1",)  # a 1.32 cluster: no resource.k8s.io/v1
    kube_api.add_node("gpu-1")
    result = await make_backend().migrate(_target("GPU-0"), "xid 79")
    assert result.details["cordoned"] is True and not kube_api.dra.rules


async def test_node_faults_and_quarantine_off_keep_the_node_path(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _dra_node(kube_api, gpus=2)
    await make_backend().migrate(Target(kind="node", node="gpu-1"), "node fault")
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True
    assert not kube_api.dra.rules and not kube_api.calls("GET", "/resourceslices")
    kube_api.nodes["gpu-1"]["spec"] = {}
    await make_backend(device_quarantine="off").migrate(_target("GPU-0"), "xid 79")
    assert not kube_api.dra.rules


async def test_a_rule_of_that_name_that_is_not_ours_is_left_alone(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _dra_node(kube_api, gpus=1)
    name = rule_name("gpu-1", Device(DRIVER, "gpu-1", "gpu-0", "GPU-0"))
    selector = {"driver": DRIVER, "pool": "gpu-1", "device": "gpu-0"}
    taint = {"key": "someone.else/broken", "effect": "NoSchedule"}
    kube_api.dra.create_rule(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {"deviceSelector": selector, "taint": taint},
        }
    )
    with pytest.raises(PermanentError, match="not gpupulse's"):
        await make_backend().migrate(_target("GPU-0"), "xid 48")
    assert kube_api.dra.rules[name]["spec"]["taint"]["key"] == "someone.else/broken"


async def test_rule_names_are_stable_valid_and_distinct_per_device() -> None:
    a = rule_name("gpu-1", Device(DRIVER, "gpu-1", "gpu-3", "GPU-3"))
    assert a == rule_name("gpu-1", Device(DRIVER, "gpu-1", "gpu-3", "GPU-x"))  # from node and device only
    assert a != rule_name("gpu-1", Device(DRIVER, "gpu-1", "gpu-4", "GPU-4"))
    assert a != rule_name("gpu-1", Device("other.driver", "gpu-1", "gpu-3", "GPU-3"))
    long = rule_name("n" * 253, Device(DRIVER, "p", "Gpu_0", "u"))
    assert len(long) <= 253 and long == long.lower() and "_" not in long


async def test_uncordon_of_a_gpu_target_deletes_only_its_rule(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _dra_node(kube_api, gpus=2)
    await make_backend().migrate(_target("GPU-0"), "xid 48")
    await make_backend().migrate(_target("GPU-1"), "xid 48")
    with pytest.raises(PermanentError, match="auto_uncordon is off"):
        await make_backend().uncordon(_target("GPU-0"), "verified")
    result = await make_backend(auto_uncordon=True).uncordon(_target("GPU-0"), "verified")
    left = [r["spec"]["deviceSelector"]["device"] for r in kube_api.dra.rules.values()]
    assert left == ["gpu-1"]
    assert result.details["removed"] == [rule_name("gpu-1", Device(DRIVER, "gpu-1", "gpu-0", "GPU-0"))]
    again = await make_backend(auto_uncordon=True).uncordon(_target("GPU-0"), "verified")
    assert again.details["changed"] is False


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
        ({"key": TAINT, "operator": "Exists"}, True),
        ({"key": TAINT, "value": "xid_48"}, True),  # Equal is the default operator
        ({"key": TAINT, "value": "other"}, False),
        ({"key": TAINT, "operator": "Exists", "effect": "NoExecute"}, False),  # another effect
        ({"key": "other.io/key", "operator": "Exists"}, False),
    ],
)
def test_claim_tolerations_follow_kubernetes_rules(toleration: dict[str, str], tolerated: bool) -> None:
    assert tolerates([toleration], TAINT, "xid_48", "NoSchedule") is tolerated


def test_holders_are_the_pods_a_claim_on_the_device_is_reserved_for() -> None:
    device = Device(DRIVER, "gpu-1", "gpu-3", "GPU-3")
    claim = {
        "metadata": {"namespace": "ml", "name": "c"},
        "status": {
            "allocation": {"devices": {"results": [{"driver": DRIVER, "pool": "gpu-1", "device": "gpu-3"}]}},
            "reservedFor": [
                {"resource": "pods", "name": "a", "uid": "1"},
                {"resource": "jobs", "name": "j", "uid": "2"},  # not a pod: nothing to evict
            ],
        },
    }
    other = {**claim, "status": {**claim["status"], "allocation": {"devices": {"results": [
        {"driver": DRIVER, "pool": "gpu-1", "device": "gpu-4"}
    ]}}}}  # fmt: skip
    taint = {"key": TAINT, "value": "v", "effect": "NoSchedule"}
    assert [h.key for h in holders_of([claim, other], [device], taint)] == ["ml/a"]
