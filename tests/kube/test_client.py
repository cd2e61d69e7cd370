"""The real client library against the fake server: paths, bodies and error mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.errors import KubeConflict, KubeForbidden, KubeNotFound, KubeUnavailable
from remediation.kube.client import KubeClient, KubeClientSettings
from tests.fakes.kube_api import FakeKubeAPI


async def test_reads_pod_through_kubeconfig_with_token(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    kube_api.add_pod("ml", "web-1", "gpu-node-1", owner=("StatefulSet", "web"), gpus=1)
    pod = await kube_client.get_pod("ml", "web-1")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert pod["spec"]["nodeName"] == "gpu-node-1"


async def test_wrong_token_is_forbidden(kube_api: FakeKubeAPI, tmp_path: Path) -> None:
    kube_api.token = "something-else"
    path = FakeKubeAPI(token="wrong", url=kube_api.url).write_kubeconfig(tmp_path / "kc")
    async with await KubeClient.connect(KubeClientSettings(kubeconfig_path=str(path))) as client:
        with pytest.raises(KubeForbidden):
            await client.get_node("n")


async def test_missing_object_and_server_errors_map_to_own_types(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    with pytest.raises(KubeNotFound) as missing:
        await kube_client.get_node("nope")
    assert missing.value.reason == "NotFound"
    kube_api.add_node("n1")
    kube_api.fail("GET", "/api/v1/nodes/n1", 503, "ServiceUnavailable")
    with pytest.raises(KubeUnavailable):
        await kube_client.get_node("n1")


async def test_lease_create_twice_conflicts(kube_client: KubeClient) -> None:
    body = {"metadata": {"name": "l1"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 5}}
    created = await kube_client.create_lease("gpupulse", body)
    assert created["spec"]["holderIdentity"] == "a"
    with pytest.raises(KubeConflict) as again:
        await kube_client.create_lease("gpupulse", body)
    assert again.value.reason == "AlreadyExists"


async def test_node_patch_is_a_merge_patch_with_resource_version(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    kube_api.add_node("n1")
    node = await kube_client.get_node("n1")
    rv = node["metadata"]["resourceVersion"]
    await kube_client.patch_node("n1", {"metadata": {"resourceVersion": rv}, "spec": {"unschedulable": True}})
    assert kube_api.calls("PATCH", "/nodes/n1")[0].content_type == "application/merge-patch+json"
    with pytest.raises(KubeConflict):
        await kube_client.patch_node(
            "n1", {"metadata": {"resourceVersion": rv}, "spec": {"unschedulable": False}}
        )
    assert kube_api.nodes["n1"]["spec"]["unschedulable"] is True
