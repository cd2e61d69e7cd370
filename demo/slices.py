"""This node's ResourceSlice as NVIDIA's DRA driver publishes it, served read-only at the API server's
path, so the exporter's real ResourceSlice reflector resolves the demo's DRA claims to GPU UUIDs.

Only what the reflector uses: `GET /apis/resource.k8s.io/v1/resourceslices` with the
`spec.nodeName=<node>` field selector, as a LIST (one resourceVersion; the slice never changes) and as a
WATCH (held open without events until its timeoutSeconds, as an API server with nothing to report does);
the bearer token is checked. Other versions answer 404, so the reflector settles on v1. The full
API server for tests (versions, conversion, watch history, 410) is tests/fakes/kube_api.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from demo.kubelet import DRA_DRIVER

JSON = dict[str, Any]
RESOURCE_VERSION = "1"


def scenario_slice_devices(doc: Mapping[str, Any]) -> list[JSON]:
    """A scenario's GPUs as the driver names them (v1 form): `gpu-<index>` per GPU and
    `gpu-<index>-mig-<n>` per MIG instance, with type, uuid and (for MIG) parentUUID and profile."""
    devices: list[JSON] = []
    for index, gpu in enumerate(doc.get("gpus") or ()):
        uuid_ = str(gpu.get("uuid", ""))
        devices.append(
            {"name": f"gpu-{index}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid_}}}
        )
        for n, instance in enumerate(((gpu.get("mig") or {}).get("instances")) or ()):
            attributes = {
                "type": {"string": "mig"},
                "uuid": {"string": str(instance["uuid"])},
                "parentUUID": {"string": uuid_},
                "profile": {"string": str(instance.get("profile", ""))},
            }
            devices.append({"name": f"gpu-{index}-mig-{n}", "attributes": attributes})
    return devices


def scenario_slice(doc: Mapping[str, Any], driver: str = DRA_DRIVER) -> JSON:
    """The one ResourceSlice of the scenario's node (pool = node name), resource.k8s.io/v1."""
    node = str(doc["node"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}", "resourceVersion": RESOURCE_VERSION},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": scenario_slice_devices(doc),
        },
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    return web.json_response({**body, "code": code}, status=code)


def make_slices_app(slices: list[JSON], token: str) -> web.Application:
    """The read-only ResourceSlice endpoint over `slices`."""

    async def resourceslices(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization", "") != f"Bearer {token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if request.match_info["version"] != "v1":
            return _status(404, "NotFound", "the server could not find the requested resource")
        selector = request.query.get("fieldSelector", "")
        node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        if selector and node is None:
            return _status(400, "BadRequest", f"unsupported field selector {selector!r}")
        items = [s for s in slices if node is None or s["spec"]["nodeName"] == node]
        if request.query.get("watch") not in ("true", "1"):
            return web.json_response(
                {
                    "kind": "ResourceSliceList",
                    "apiVersion": "resource.k8s.io/v1",
                    "metadata": {"resourceVersion": RESOURCE_VERSION},
                    "items": items,
                }
            )
        try:
            timeout = min(float(request.query.get("timeoutSeconds", "300")), 3600.0)
        except ValueError:
            return _status(400, "BadRequest", "timeoutSeconds is not a number")
        stream = web.StreamResponse(headers={"Content-Type": "application/json"})
        await stream.prepare(request)
        # nothing changes: the stream ends cleanly at its timeout, or when the client goes away (as the
        # API server cancels the request's context; aiohttp would keep the handler, and its runner's
        # cleanup would wait for it)
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                return stream
            await asyncio.sleep(min(0.2, max(deadline - asyncio.get_running_loop().time(), 0.0)))
        await stream.write_eof()
        return stream

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/{version}/resourceslices", resourceslices)
    return app
