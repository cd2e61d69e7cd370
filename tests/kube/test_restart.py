"""restart: the right thing for the pod's owner, never a bare pod, never a replacement."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from remediation.backends.kubernetes import RESTARTED_AT, KubernetesBackend
from remediation.errors import PermanentError, TemporaryError
from remediation.model import Target
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import StepClock, backend_settings

Make = Callable[..., KubernetesBackend]


def _deployment_pod(api: FakeKubeAPI, name: str = "llm-7d9f-abcde", node: str = "gpu-1") -> str:
    api.add_deployment("ml", "llm")
    api.add_replicaset("ml", "llm-7d9f", deployment="llm")
    pod = api.add_pod("ml", name, node, owner=("ReplicaSet", "llm-7d9f"), labels={"app": "llm"}, gpus=1)
    return str(pod["metadata"]["uid"])


async def test_restart_deletes_replicaset_pod_with_uid_precondition(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    uid = _deployment_pod(kube_api)
    result = await make_backend().restart(Target(kind="pod", namespace="ml", pod="llm-7d9f-abcde"), "xid 13")
    assert result.done
    assert kube_api.deleted == [("ml/llm-7d9f-abcde", uid, "delete")]
    (delete,) = kube_api.calls("DELETE", "/pods/llm-7d9f-abcde")
    assert delete.body["preconditions"] == {"uid": uid}
    assert result.details["pods"][0]["owner"] == "ReplicaSet/llm-7d9f"


async def test_restart_never_deletes_a_replacement_with_the_same_name(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_pod("ml", "trainer-0", "gpu-1", owner=("StatefulSet", "trainer"), gpus=8)

    def statefulset_recreates_first(method: str, path: str) -> None:
        if method == "DELETE" and path.endswith("/trainer-0") and kube_api.deleted == []:
            del kube_api.pods[("ml", "trainer-0")]
            kube_api.add_pod("ml", "trainer-0", "gpu-1", owner=("StatefulSet", "trainer"), gpus=8)

    kube_api.before.append(statefulset_recreates_first)
    replacement_uid = None

    def remember(method: str, path: str) -> None:
        nonlocal replacement_uid
        if method == "DELETE":
            replacement_uid = kube_api.pods[("ml", "trainer-0")]["metadata"]["uid"]

    kube_api.before.append(remember)
    result = await make_backend().restart(Target(kind="pod", namespace="ml", pod="trainer-0"), "xid 31")
    assert result.details["pods"][0]["outcome"] == "already_replaced"
    assert kube_api.pods[("ml", "trainer-0")]["metadata"]["uid"] == replacement_uid
    assert kube_api.deleted == []


async def test_bare_pod_is_refused_unless_allowed(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    kube_api.add_pod("ml", "notebook", "gpu-1", gpus=1)
    target = Target(kind="pod", namespace="ml", pod="notebook")
    with pytest.raises(PermanentError, match="no controller"):
        await make_backend().restart(target, "xid 13")
    assert ("ml", "notebook") in kube_api.pods
    assert kube_api.calls("DELETE", "/pods/") == []
    await make_backend(allow_bare_pods=True).restart(target, "xid 13")
    assert ("ml", "notebook") not in kube_api.pods


async def test_rollout_restart_patches_the_deployment_template(
    kube_api: FakeKubeAPI, make_backend: Make, clock: StepClock
) -> None:
    _deployment_pod(kube_api)
    backend = make_backend(deployment_restart="rollout_restart")
    result = await backend.restart(Target(kind="pod", namespace="ml", pod="llm-7d9f-abcde"), "leak")
    annotations = kube_api.deployments[("ml", "llm")]["spec"]["template"]["metadata"]["annotations"]
    assert annotations[RESTARTED_AT] == clock.utcnow().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert ("ml", "llm-7d9f-abcde") in kube_api.pods  # the Deployment replaces it, we do not
    assert result.details["pods"][0]["action"] == "rollout_restart"


async def test_daemonset_pod_restart_deletes_the_pod(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    kube_api.add_pod("gpu-system", "dcgm-x1", "gpu-1", owner=("DaemonSet", "dcgm"))
    result = await make_backend().restart(Target(kind="pod", namespace="gpu-system", pod="dcgm-x1"), "hung")
    assert result.details["pods"][0]["owner"] == "DaemonSet/dcgm"
    assert [d[0] for d in kube_api.deleted] == ["gpu-system/dcgm-x1"]


async def test_restart_of_a_pod_that_is_gone_is_permanent(make_backend: Make) -> None:
    with pytest.raises(PermanentError, match="no longer exists"):
        await make_backend().restart(Target(kind="pod", namespace="ml", pod="gone"), "xid 13")


async def test_gpu_target_restarts_only_the_annotated_pod(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    kube_api.add_pod(
        "ml", "a", "gpu-1", owner=("Job", "a"), gpus=1, annotations={"gpupulse.io/gpu-uuids": "GPU-1"}
    )
    kube_api.add_pod(
        "ml", "b", "gpu-1", owner=("Job", "b"), gpus=1, annotations={"gpupulse.io/gpu-uuids": "GPU-2"}
    )
    await make_backend().restart(Target(kind="gpu", node="gpu-1", uuid="GPU-1"), "xid 13")
    assert [d[0] for d in kube_api.deleted] == ["ml/a"]


async def test_gpu_target_without_attribution_is_not_guessed(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_pod("ml", "a", "gpu-1", owner=("Job", "a"), gpus=1)
    with pytest.raises(PermanentError, match="pod identity"):
        await make_backend().restart(Target(kind="gpu", node="gpu-1", uuid="GPU-1"), "xid 13")
    assert kube_api.deleted == []


async def test_forbidden_by_rbac_is_permanent(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    _deployment_pod(kube_api)
    kube_api.fail("DELETE", "/pods/", 403, "Forbidden")
    with pytest.raises(PermanentError, match="forbidden"):
        await make_backend().restart(Target(kind="pod", namespace="ml", pod="llm-7d9f-abcde"), "xid 13")


async def test_api_outage_is_temporary(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    _deployment_pod(kube_api)
    kube_api.fail("GET", "/pods/llm", 503, "ServiceUnavailable")
    with pytest.raises(TemporaryError):
        await make_backend().restart(Target(kind="pod", namespace="ml", pod="llm-7d9f-abcde"), "xid 13")


async def test_a_replica_that_may_not_act_writes_nothing(
    kube_api: FakeKubeAPI, kube_client: object, clock: StepClock
) -> None:
    _deployment_pod(kube_api)
    backend = KubernetesBackend(kube_client, backend_settings(), clock, may_act=lambda: False)  # type: ignore[arg-type]
    with pytest.raises(TemporaryError, match="not the leader"):
        await backend.restart(Target(kind="pod", namespace="ml", pod="llm-7d9f-abcde"), "xid 13")
    with pytest.raises(TemporaryError, match="not the leader"):
        await backend.migrate(Target(kind="node", node="gpu-1"), "xid 79")
    assert [r.method for r in kube_api.requests if r.method != "GET"] == []


async def test_a_throttled_delete_changed_nothing_and_says_so(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _deployment_pod(kube_api)
    kube_api.fail("DELETE", "/pods/llm-7d9f-abcde", 429, "TooManyRequests", times=100)
    with pytest.raises(TemporaryError) as err:
        await make_backend().restart(Target(kind="pod", namespace="ml", pod="llm-7d9f-abcde"), "xid 13")
    assert err.value.nothing_changed
    assert kube_api.deleted == []


async def test_a_throttled_restart_is_retried_no_sooner_than_the_servers_retry_after(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _deployment_pod(kube_api)
    kube_api.throttle("DELETE", "/pods/llm-7d9f-abcde", retry_after="45", times=1)  # APF: header only
    with pytest.raises(TemporaryError) as err:
        await make_backend().restart(Target(kind="pod", namespace="ml", pod="llm-7d9f-abcde"), "xid 13")
    assert err.value.nothing_changed and err.value.delay_seconds == 45.0  # not the usual 10 s


async def test_a_throttled_second_delete_after_a_first_one_is_no_refusal(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    ann = {"gpupulse.io/gpu-uuids": "GPU-a"}
    kube_api.add_node("gpu-1")
    kube_api.add_pod("ml", "first", "gpu-1", owner=("Job", "a"), gpus=1, annotations=ann)
    kube_api.add_pod("ml", "second", "gpu-1", owner=("Job", "b"), gpus=1, annotations=ann)
    kube_api.fail("DELETE", "/pods/second", 429, "TooManyRequests", times=100)
    with pytest.raises(TemporaryError) as err:
        await make_backend().restart(Target(kind="gpu", node="gpu-1", uuid="GPU-a"), "xid 48")
    assert [d[0] for d in kube_api.deleted] == ["ml/first"]
    assert not err.value.nothing_changed  # one pod was replaced: that restart happened
