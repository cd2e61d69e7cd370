"""migrate: cordon + taint, then evictions that honour PodDisruptionBudgets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import PermanentError, TemporaryError
from remediation.kube.nodes import ANNOTATION_WAS_UNSCHEDULABLE
from remediation.model import Target
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import StepClock

Make = Callable[..., KubernetesBackend]
TAINT = "gpupulse.io/remediation"


def _node_with_workloads(api: FakeKubeAPI) -> None:
    api.add_node("gpu-1")
    api.add_pod("ml", "llm-0", "gpu-1", owner=("StatefulSet", "llm"), labels={"app": "llm"}, gpus=4)
    api.add_pod("ml", "embed-x", "gpu-1", owner=("ReplicaSet", "embed-5c"), labels={"app": "embed"}, gpus=1)
    api.add_pod("ml", "cpu-proxy", "gpu-1", owner=("ReplicaSet", "proxy-1"))
    api.add_pod("gpu-system", "dcgm-exporter-q", "gpu-1", owner=("DaemonSet", "dcgm-exporter"), gpus=1)
    api.add_pod(
        "kube-system", "etcd-gpu-1", "gpu-1", annotations={"kubernetes.io/config.mirror": "abc"}, gpus=1
    )
    api.add_pod("ml", "other-node", "gpu-2", owner=("ReplicaSet", "x"), gpus=1)


def _taints(api: FakeKubeAPI, node: str) -> list[dict[str, str]]:
    return list(api.nodes[node]["spec"].get("taints") or [])


async def test_migrate_cordons_taints_and_evicts_gpu_pods_skipping_daemonsets(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    result = await make_backend().migrate(
        Target(kind="gpu", node="gpu-1", uuid="GPU-aa"), "GPUFellOffBus xid=79"
    )
    node = kube_api.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is True
    assert _taints(kube_api, "gpu-1") == [
        {"key": TAINT, "value": "GPUFellOffBus_xid_79", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["annotations"]["gpupulse.io/remediation-reason"] == "GPUFellOffBus xid=79"
    assert sorted(d[0] for d in kube_api.deleted) == ["ml/embed-x", "ml/llm-0"]
    assert {d[2] for d in kube_api.deleted} == {"eviction"}
    assert result.details["skipped"] == {
        "gpu-system/dcgm-exporter-q": "daemonset_pod",
        "kube-system/etcd-gpu-1": "mirror_pod",
    }
    assert ("ml", "cpu-proxy") in kube_api.pods  # a GPU fault leaves CPU-only pods alone
    assert ("ml", "other-node") in kube_api.pods
    (eviction, *_) = kube_api.calls("POST", "/eviction")
    assert eviction.body["apiVersion"] == "policy/v1"
    assert eviction.body["deleteOptions"]["preconditions"]["uid"]


async def test_gpu_annotation_narrows_eviction_to_that_gpu(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    kube_api.add_node("gpu-1")
    ann = "gpupulse.io/gpu-uuids"
    kube_api.add_pod("ml", "on-a", "gpu-1", owner=("Job", "a"), gpus=1, annotations={ann: "GPU-a"})
    kube_api.add_pod("ml", "on-b", "gpu-1", owner=("Job", "b"), gpus=1, annotations={ann: "GPU-b"})
    result = await make_backend().migrate(Target(kind="gpu", node="gpu-1", uuid="GPU-a"), "xid 48")
    assert [d[0] for d in kube_api.deleted] == ["ml/on-a"]
    assert "annotated" in result.details["scope"]


async def test_node_scope_all_pods_drains_cpu_pods_too(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    _node_with_workloads(kube_api)
    await make_backend(node_scope="all_pods").migrate(Target(kind="node", node="gpu-1"), "node fault")
    assert sorted(d[0] for d in kube_api.deleted) == ["ml/cpu-proxy", "ml/embed-x", "ml/llm-0"]


async def test_pdb_429_backs_off_then_evicts_once_the_budget_allows(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _node_with_workloads(kube_api)
    pdb = kube_api.add_pdb("ml", "llm-pdb", {"app": "llm"}, disruptions_allowed=0)

    def replacement_becomes_ready(sleeps: int) -> None:
        if sleeps == 3:
            pdb["status"]["disruptionsAllowed"] = 1

    clock.after_sleep.append(replacement_becomes_ready)
    result = await make_backend().migrate(Target(kind="gpu", node="gpu-1", uuid="GPU-aa"), "xid 79")
    assert clock.sleeps == [1.0, 2.0, 4.0]  # exponential backoff between refusals
    assert len(kube_api.calls("POST", "/pods/llm-0/eviction")) == 4
    assert "ml/llm-0" in result.details["evicted"]
    assert result.details["blocked"] == {}


async def test_pdb_deadline_with_fail_policy_raises_temporary_and_keeps_the_pod(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _node_with_workloads(kube_api)
    kube_api.add_pdb("ml", "llm-pdb", {"app": "llm"}, disruptions_allowed=0)
    with pytest.raises(TemporaryError, match="eviction of ml/llm-0 still refused after 20s") as err:
        await make_backend(eviction_deadline_seconds=20.0).migrate(
            Target(kind="node", node="gpu-1"), "xid 79"
        )
    assert err.value.delay_seconds == 60.0
    assert sum(clock.sleeps) == pytest.approx(20.0)
    assert max(clock.sleeps) <= 8.0  # capped backoff
    assert ("ml", "llm-0") in kube_api.pods
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True  # stays cordoned for the human


async def test_pdb_deadline_with_delete_policy_force_deletes_by_uid(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    kube_api.add_pdb("ml", "llm-pdb", {"app": "llm"}, disruptions_allowed=0)
    uid = kube_api.pods[("ml", "llm-0")]["metadata"]["uid"]
    result = await make_backend(on_eviction_deadline="delete").migrate(
        Target(kind="node", node="gpu-1"), "xid 79"
    )
    assert ("ml/llm-0", uid, "delete") in kube_api.deleted
    assert result.details["forced_delete"] == ["ml/llm-0"]
    assert "force-deleted 1" in result.summary


async def test_two_pdbs_on_one_pod_is_a_permanent_misconfiguration(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _node_with_workloads(kube_api)
    kube_api.add_pdb("ml", "pdb-1", {"app": "llm"}, disruptions_allowed=1)
    kube_api.add_pdb("ml", "pdb-2", {"app": "llm"}, disruptions_allowed=1)
    with pytest.raises(PermanentError, match="more than one PodDisruptionBudget"):
        await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert clock.sleeps == []


async def test_node_patch_conflict_is_retried_after_a_reread(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_node("gpu-1")
    theirs = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}

    def another_writer(method: str, path: str) -> None:
        if (
            method == "PATCH"
            and path == "/api/v1/nodes/gpu-1"
            and len(kube_api.calls("PATCH", "/nodes/")) == 1
        ):
            node = kube_api.nodes["gpu-1"]
            node["spec"]["taints"] = [theirs]
            node["metadata"]["resourceVersion"] = kube_api.next_rv()

    kube_api.before.append(another_writer)
    result = await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert len(kube_api.calls("PATCH", "/nodes/gpu-1")) == 2
    assert {t["key"] for t in _taints(kube_api, "gpu-1")} == {TAINT, "example.com/maintenance"}
    assert result.details["node_changed"] is True


async def test_endless_node_conflicts_end_in_a_temporary_error(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.fail("PATCH", "/nodes/gpu-1", 409, "Conflict", times=5)
    with pytest.raises(TemporaryError, match="resourceVersion"):
        await make_backend(node_patch_attempts=5).migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert kube_api.calls("POST", "/eviction") == []


async def test_migrate_twice_does_not_patch_the_node_again(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    kube_api.add_node("gpu-1")
    backend = make_backend()
    await backend.migrate(Target(kind="node", node="gpu-1"), "xid 79")
    again = await backend.migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert len(kube_api.calls("PATCH", "/nodes/gpu-1")) == 1
    assert again.details["node_changed"] is False
    assert len(_taints(kube_api, "gpu-1")) == 1


async def test_migrate_of_a_deleted_node_is_permanent(make_backend: Make) -> None:
    with pytest.raises(PermanentError, match="not found"):
        await make_backend().migrate(Target(kind="node", node="gone"), "xid 79")


async def test_pod_target_cordons_its_node_and_evicts_only_that_pod(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    await make_backend().migrate(Target(kind="pod", namespace="ml", pod="embed-x"), "crash loop")
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True
    assert [d[0] for d in kube_api.deleted] == ["ml/embed-x"]


async def test_uncordon_is_a_human_call_unless_configured(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    kube_api.add_node("gpu-1")
    await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    with pytest.raises(PermanentError, match="human"):
        await make_backend().uncordon(Target(kind="node", node="gpu-1"), "resolved")
    await make_backend(auto_uncordon=True).uncordon(Target(kind="node", node="gpu-1"), "resolved")
    spec = kube_api.nodes["gpu-1"]["spec"]
    assert "unschedulable" not in spec
    assert "taints" not in spec


async def test_auto_uncordon_keeps_a_cordon_a_human_set_first(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    human = {"key": "ops/hold", "value": "disk", "effect": "NoSchedule"}
    kube_api.add_node("gpu-1", unschedulable=True, taints=[human])
    await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert kube_api.nodes["gpu-1"]["metadata"]["annotations"][ANNOTATION_WAS_UNSCHEDULABLE] == "true"
    await make_backend(auto_uncordon=True).uncordon(Target(kind="node", node="gpu-1"), "resolved")
    spec = kube_api.nodes["gpu-1"]["spec"]
    assert spec["unschedulable"] is True
    assert spec["taints"] == [human]


def _hang_kubelet(api: FakeKubeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    """Evictions are accepted but the node's kubelet never confirms them: pods stay Terminating."""
    remove = api._remove_pod

    def graceful(pod: dict[str, Any], via: str) -> None:
        if via != "eviction":
            remove(pod, via)
            return
        meta = pod["metadata"]
        _mark_terminating(api, meta["namespace"], meta["name"])
        api.deleted.append((f"{meta['namespace']}/{meta['name']}", meta["uid"], via))

    monkeypatch.setattr(api, "_remove_pod", graceful)


def _mark_terminating(api: FakeKubeAPI, namespace: str, name: str) -> None:
    api.update_pod(namespace, name, lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"))


async def test_a_pod_a_hung_kubelet_keeps_fails_migrate_on_every_attempt(
    kube_api: FakeKubeAPI, make_backend: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    _node_with_workloads(kube_api)
    _hang_kubelet(kube_api, monkeypatch)
    backend = make_backend(on_eviction_deadline="fail")
    target = Target(kind="pod", namespace="ml", pod="embed-x")
    for attempt in (1, 2, 3):
        with pytest.raises(TemporaryError, match="ml/embed-x evicted but not gone after 20s"):
            await backend.migrate(target, "crash loop")
        assert kube_api.pods[("ml", "embed-x")]["metadata"]["deletionTimestamp"], attempt
    # evicted once; the later attempts wait for it instead of calling it moved
    assert [d[0] for d in kube_api.deleted] == ["ml/embed-x"]


async def test_a_terminating_pod_that_goes_before_the_deadline_completes_migrate(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _node_with_workloads(kube_api)
    _mark_terminating(kube_api, "ml", "embed-x")
    clock.after_sleep.append(lambda n: kube_api.remove_pod("ml", "embed-x") if n == 3 else None)
    result = await make_backend().migrate(Target(kind="pod", namespace="ml", pod="embed-x"), "crash loop")
    assert result.done
    assert result.details["gone"] == ["ml/embed-x"]
    assert "ml/embed-x" not in result.details["skipped"]
    assert [d[0] for d in kube_api.deleted] == ["ml/embed-x"]  # removed by its kubelet, never evicted twice
    assert [d[2] for d in kube_api.deleted] == ["removed"]


async def test_a_terminating_pod_past_the_deadline_is_force_deleted_with_the_delete_policy(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    _mark_terminating(kube_api, "ml", "embed-x")
    uid = kube_api.pods[("ml", "embed-x")]["metadata"]["uid"]
    result = await make_backend(on_eviction_deadline="delete").migrate(
        Target(kind="pod", namespace="ml", pod="embed-x"), "crash loop"
    )
    assert ("ml/embed-x", uid, "delete") in kube_api.deleted
    assert result.details["forced_delete"] == ["ml/embed-x"]


UNDO = (
    "node gpu-1 left cordoned and tainted gpupulse.io/remediation=xid_79:NoSchedule; "
    "undo: kubectl uncordon gpu-1 && kubectl taint node gpu-1 gpupulse.io/remediation-"
)


async def test_a_migrate_forbidden_after_the_cordon_says_what_it_left_and_how_to_undo_it(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    kube_api.fail("POST", "/eviction", 403, "Forbidden", times=100)
    with pytest.raises(PermanentError, match="forbidden") as err:
        await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert kube_api.nodes["gpu-1"]["spec"]["unschedulable"] is True
    assert err.value.left == UNDO


async def test_a_migrate_past_the_pdb_deadline_says_what_it_left(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    kube_api.add_pdb("ml", "llm-pdb", {"app": "llm"}, disruptions_allowed=0)
    with pytest.raises(TemporaryError) as err:
        await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert err.value.left == UNDO


async def test_a_migrate_refused_before_the_cordon_left_nothing(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    kube_api.fail("PATCH", "/nodes/gpu-1", 403, "Forbidden", times=100)
    with pytest.raises(PermanentError) as err:
        await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert err.value.left == ""


async def test_a_migrate_throttled_before_the_cordon_changed_nothing(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    kube_api.fail("PATCH", "/nodes/gpu-1", 429, "TooManyRequests", times=100)
    with pytest.raises(TemporaryError) as err:
        await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert err.value.nothing_changed and err.value.left == ""
    assert not kube_api.nodes["gpu-1"]["spec"].get("unschedulable")
    assert kube_api.deleted == []


async def test_a_migrate_throttled_after_the_cordon_is_an_action(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _node_with_workloads(kube_api)
    kube_api.fail("GET", "/api/v1/pods", 429, "TooManyRequests", times=100)
    with pytest.raises(TemporaryError) as err:
        await make_backend().migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert not err.value.nothing_changed
    assert err.value.left == UNDO
