"""A 429's retryAfterSeconds is a floor on the next wait: the real API server says 10 s while the
disruption controller has not computed a new budget yet (the body below is its answer, recorded
from kube-apiserver 1.37.2 by tests/kube/realapi.py's control plane)."""

from __future__ import annotations

from typing import Any

from remediation.errors import KubeNotFound, KubeTooManyRequests
from remediation.kube.eviction import EvictionSettings, evict_pods
from remediation.kube.pods import PodRef
from tests.kube.conftest import StepClock

STILL_PROCESSING: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget vllm is still being processed by the server.",
            }
        ],
        "retryAfterSeconds": 10,
    },
    "code": 429,
}


class RefusesThenEvicts:
    """An eviction client that answers `refusals` 429s with `body`, then accepts."""

    def __init__(self, body: dict[str, Any], refusals: int) -> None:
        self.body, self.refusals, self.calls = body, refusals, 0

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.calls += 1
        if self.calls <= self.refusals:
            raise KubeTooManyRequests(429, "TooManyRequests", str(self.body["message"]), self.body)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raise KubeNotFound(404, "NotFound", f'pods "{name}" not found', {})  # gone once evicted


POD = PodRef(namespace="llm", name="vllm-0", uid="u-1", node="gpu-1")
SETTINGS = EvictionSettings(deadline_seconds=120, backoff_initial_seconds=1, backoff_max_seconds=30)


async def test_the_servers_retry_after_sets_the_least_wait() -> None:
    clock = StepClock()
    client = RefusesThenEvicts(STILL_PROCESSING, refusals=2)
    report = await evict_pods(client, [POD], SETTINGS, clock, lambda: None)  # type: ignore[arg-type]
    assert report.evicted == ["llm/vllm-0"]
    assert clock.sleeps == [10, 20]  # not 1, 2
    assert client.calls == 3


async def test_without_a_hint_the_backoff_starts_small() -> None:
    clock = StepClock()
    body = {**STILL_PROCESSING, "details": {"causes": STILL_PROCESSING["details"]["causes"]}}
    report = await evict_pods(RefusesThenEvicts(body, refusals=2), [POD], SETTINGS, clock, lambda: None)  # type: ignore[arg-type]
    assert report.evicted == ["llm/vllm-0"] and clock.sleeps == [1, 2]
