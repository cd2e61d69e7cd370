"""A fake kubelet serving pod-resources v1 `List` over a unix socket with grpc.aio (device-plugin
devices and DRA claims, `dynamic_resources`, in the real v1 messages): demo/kubelet.py's server plus the
failures tests need (an error status, garbage bytes) and a call count."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import grpc
import grpc.aio

from demo.kubelet import DRA_DRIVER, PodResourcesServer, pod, pods_from_scenario
from exporter.attribution.podresources_proto import PodResources

__all__ = ["DRA_DRIVER", "FakeKubelet", "pod", "pod_uid", "pods_from_scenario"]


def pod_uid(namespace: str, name: str) -> str:
    """A stable pod UID for scenario pods (the kubelet does not report UIDs; cgroups do)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpupulse-test/{namespace}/{name}"))


class FakeKubelet(PodResourcesServer):
    """Serves whatever `pods` holds; `fail_with` makes List return that status instead."""

    def __init__(self, socket_path: str, pods: Iterable[PodResources] = ()) -> None:
        super().__init__(socket_path, pods)
        self.fail_with: grpc.StatusCode | None = None
        self.garbage: bytes | None = None
        self.calls = 0

    async def _list(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        if self.fail_with is not None:
            await context.abort(self.fail_with, "fake kubelet failure")
        if self.garbage is not None:
            return self.garbage
        return await super()._list(request, context)
