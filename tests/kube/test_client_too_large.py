"""An object too large to store is refused for good, not retried: the two answers a real API server
gives (tests/kube/test_real_apiserver.py measures them), replayed by the in-process fake."""

from __future__ import annotations

import pytest

from remediation.errors import KubeInvalid, KubeUnavailable
from remediation.kube.client import KubeClient
from tests.fakes.kube_api import FakeKubeAPI

STATUS = r"/gpuincidents/incident-1/status$"


async def _write(kube_client: KubeClient) -> None:
    await kube_client.replace_custom_object_status(
        "remediation.gpupulse.io", "v1", "gpupulse", "gpuincidents", "incident-1", {"status": {}}
    )


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728"),  # the API server's
        (500, "", "etcdserver: request is too large"),  # etcd's 1.5 MiB, passed on with no reason
    ],
)
async def test_a_body_past_the_servers_or_etcds_limit_is_invalid(
    kube_api: FakeKubeAPI, kube_client: KubeClient, code: int, reason: str, message: str
) -> None:
    kube_api.fail("PUT", STATUS, code, reason, message=message)
    with pytest.raises(KubeInvalid) as refused:
        await _write(kube_client)
    assert refused.value.status == code


async def test_any_other_500_stays_unavailable(kube_api: FakeKubeAPI, kube_client: KubeClient) -> None:
    kube_api.fail("PUT", STATUS, 500, "InternalError", message="etcdserver: request timed out")
    with pytest.raises(KubeUnavailable):
        await _write(kube_client)
