"""A fake kubelet serving pod-resources v1 `List` over a unix socket with grpc.aio (device-plugin
devices and DRA claims, `dynamic_resources`, in the real v1 messages)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import grpc
import grpc.aio

from exporter.attribution.podresources_proto import (
    SERVICE_NAME,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
    decode_list_request,
    encode_list_response,
)

DRA_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver


def _identity(data: bytes) -> bytes:
    return data


def pod(namespace: str, name: str, containers: Mapping[str, Mapping[str, Sequence[str]]]) -> PodResources:
    """Build a PodResources: {container: {resource_name: [device ids]}}."""
    return PodResources(
        name=name,
        namespace=namespace,
        containers=tuple(
            ContainerResources(
                name=cname,
                devices=tuple(ContainerDevices(resource, tuple(ids)) for resource, ids in devices.items()),
            )
            for cname, devices in containers.items()
        ),
    )


def pod_uid(namespace: str, name: str) -> str:
    """A stable pod UID for scenario pods (the kubelet does not report UIDs; cgroups do)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpupulse-test/{namespace}/{name}"))


def pods_from_scenario(doc: Mapping[str, Any]) -> tuple[PodResources, ...]:
    """A scenario's `pods` section as the kubelet would list it (schema: docs/design/attribution.md).

    containers[].gpus: NVML indices (whole GPUs, or time-slice replicas `GPU-…::<n>` with
    `shared: true`); containers[].mig: [gpu index, index into mig.instances] pairs; `resource` overrides the
    resource name. GPUs without a `uuid` in the scenario fall back to GKE's `nvidia<index>` ids.
    containers[].claims: [{name, namespace?, devices: [DRA device names]}], ResourceClaims of NVIDIA's
    DRA driver in the pool named after the scenario's node (tests/fakes/kube_api.py publishes the slice).
    A pod's `labels` and `owner` and a container's `env` are not read: pod-resources carries none of
    them (kube_api.pods_to_api_from_scenario and helpers.procfs_from_scenario do).
    """
    gpus = list(doc.get("gpus") or ())
    replica = 0
    out = []
    for entry in doc.get("pods") or ():
        containers: dict[str, dict[str, list[str]]] = {}
        claims: dict[str, tuple[DynamicResource, ...]] = {}
        for container in entry.get("containers") or ():
            shared = bool(container.get("shared", False))
            default = "nvidia.com/gpu.shared" if shared else "nvidia.com/gpu"
            if container.get("mig"):
                default = "nvidia.com/mig-1g.10gb"
            resource = str(container.get("resource", default))
            ids: list[str] = []
            for index in container.get("gpus") or ():
                gpu_id = (
                    str(gpus[index].get("uuid", f"nvidia{index}")) if index < len(gpus) else f"nvidia{index}"
                )
                if shared:
                    gpu_id, replica = f"{gpu_id}::{replica}", replica + 1
                ids.append(gpu_id)
            for gpu_index, instance in container.get("mig") or ():
                ids.append(str(gpus[gpu_index]["mig"]["instances"][instance]["uuid"]))
            containers[str(container["name"])] = {resource: ids} if ids else {}
            claims[str(container["name"])] = tuple(
                DynamicResource(
                    str(c["name"]),
                    str(c.get("namespace", entry.get("namespace", "default"))),
                    tuple(
                        ClaimResource(DRA_DRIVER, str(doc.get("node", "")), str(d))
                        for d in c.get("devices", ())
                    ),
                )
                for c in container.get("claims") or ()
            )
        built = pod(str(entry.get("namespace", "default")), str(entry["name"]), containers)
        with_claims = tuple(replace(c, dynamic_resources=claims.get(c.name, ())) for c in built.containers)
        out.append(replace(built, containers=with_claims))
    return tuple(out)


class FakeKubelet:
    """Serves whatever `pods` holds; `fail_with` makes List return that status instead."""

    def __init__(self, socket_path: str, pods: Iterable[PodResources] = ()) -> None:
        self.socket_path = socket_path
        self.pods: tuple[PodResources, ...] = tuple(pods)
        self.fail_with: grpc.StatusCode | None = None
        self.garbage: bytes | None = None
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    async def _list(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        decode_list_request(request)
        if self.fail_with is not None:
            await context.abort(self.fail_with, "fake kubelet failure")
        if self.garbage is not None:
            return self.garbage
        return encode_list_response(self.pods)

    async def start(self) -> None:
        """Listen on the unix socket (like a kubelet start or restart)."""
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(
            self._list, request_deserializer=_identity, response_serializer=_identity
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, {"List": handler}),)
        )
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving and remove the socket file (a kubelet going away)."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
