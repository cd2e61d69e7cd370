"""An eviction 500 is a misconfiguration only when it says so (several PodDisruptionBudgets select the
pod, as the real API server words it: tests/kube/test_real_apiserver.py and test_migrate.py); any other
500 (an etcd timeout, a failing admission webhook) is retried."""

from __future__ import annotations

from collections.abc import Callable

from remediation.backends.kubernetes import KubernetesBackend
from remediation.model import Target
from tests.fakes.kube_api import FakeKubeAPI

Make = Callable[..., KubernetesBackend]
TARGET = Target(kind="pod", node="gpu-1", namespace="ml", pod="llm-0")


def _pod(api: FakeKubeAPI) -> None:
    api.add_node("gpu-1")
    api.add_pod("ml", "llm-0", "gpu-1", owner=("StatefulSet", "llm"), labels={"app": "llm"}, gpus=1)


async def test_an_etcd_timeout_on_eviction_is_retried_and_the_pod_evicted(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    _pod(kube_api)
    kube_api.fail(
        "POST", r"/pods/llm-0/eviction$", 500, "InternalError", message="etcdserver: request timed out"
    )
    result = await make_backend().migrate(TARGET, "xid 79")
    assert result.details["evicted"] == ["ml/llm-0"] and result.details["misconfigured"] == {}
    assert len(kube_api.calls("POST", r"/pods/llm-0/eviction$")) == 2
