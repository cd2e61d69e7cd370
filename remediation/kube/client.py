"""The one module that talks to the Kubernetes API (through kubernetes_asyncio).

Everything else in gpupulse calls `KubeClient`, receives plain JSON-shaped dicts (camelCase keys, as
`kubectl get -o json` prints them) and sees only the error types defined here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from remediation.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeTooManyRequests,
    KubeUnavailable,
)
from remediation.kube.retry import parse_retry_after

T = TypeVar("T")
JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
# what kube-apiserver answers (500, no reason) when etcd refuses an object as too large
_TOO_LARGE = "request is too large"


@dataclass(frozen=True)
class KubeClientSettings:
    """How the controller reaches the API server."""

    kubeconfig_path: str = ""  # empty: in-cluster service account
    context: str = ""
    request_timeout_seconds: float = 10.0


def _error_from(exc: ApiException) -> KubeError:
    status = int(exc.status or 0)
    body: JSON = {}
    raw = exc.body
    if isinstance(raw, bytes | str) and raw:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            body = parsed
    reason = str(body.get("reason") or exc.reason or "")
    message = str(body.get("message") or exc.reason or "")
    kind: type[KubeError]
    if status == 404:
        kind = KubeNotFound
    elif status == 409:
        kind = KubeConflict
    elif status == 429:
        kind = KubeTooManyRequests
    elif status in (401, 403):
        kind = KubeForbidden
    elif status in (400, 413, 415, 422) or (status == 500 and _TOO_LARGE in message):
        # 413: past the API server's body limit (3 MiB); 500 "etcdserver: request is too large": past
        # etcd's (1.5 MiB). The same request fails the same way every time: not worth a retry.
        kind = KubeInvalid
    else:
        kind = KubeUnavailable
    headers = exc.headers if isinstance(exc.headers, Mapping) else {}
    return kind(status, reason, message, body, parse_retry_after(headers.get("Retry-After")))


class KubeClient:
    """Typed calls for the handful of API operations gpupulse uses."""

    def __init__(self, api_client: k8s.ApiClient, settings: KubeClientSettings | None = None) -> None:
        self._api = api_client
        self._settings = settings or KubeClientSettings()
        # Any: we send JSON dicts as bodies and force content types, which the generated stubs do not model
        self._core: Any = k8s.CoreV1Api(api_client)
        self._apps: Any = k8s.AppsV1Api(api_client)
        self._coordination: Any = k8s.CoordinationV1Api(api_client)
        self._batch: Any = k8s.BatchV1Api(api_client)
        self._custom: Any = k8s.CustomObjectsApi(api_client)
        self._events: Any = k8s.EventsV1Api(api_client)

    @classmethod
    async def connect(cls, settings: KubeClientSettings) -> KubeClient:
        """Build a client from a kubeconfig file, or from the pod's service account when none is set."""
        configuration = k8s.Configuration()
        if settings.kubeconfig_path:
            await k8s_config.load_kube_config(
                config_file=str(Path(settings.kubeconfig_path)),
                context=settings.context or None,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            load_incluster: Any = k8s_config.load_incluster_config
            load_incluster(client_configuration=configuration)
        return cls(k8s.ApiClient(configuration), settings)

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except ApiException as exc:
            raise _error_from(exc) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise KubeUnavailable(0, type(exc).__name__, str(exc) or "no response") from exc

    def _json(self, obj: Any) -> JSON:
        out = self._api.sanitize_for_serialization(obj)
        return out if isinstance(out, dict) else {}

    @property
    def _timeout(self) -> float:
        return self._settings.request_timeout_seconds

    # --- pods

    async def get_pod(self, namespace: str, name: str) -> JSON:
        """Read one pod."""
        pod = await self._call(
            self._core.read_namespaced_pod(name, namespace, _request_timeout=self._timeout)
        )
        return self._json(pod)

    async def list_pods_on_node(self, node: str) -> list[JSON]:
        """All pods bound to `node`, in every namespace."""
        pods = await self._call(
            self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=self._timeout
            )
        )
        return [self._json(p) for p in pods.items or []]

    async def list_pods(self, namespace: str, label_selector: str) -> list[JSON]:
        """The pods of one namespace that match a label selector (`a=b,c=d`)."""
        pods = await self._call(
            self._core.list_namespaced_pod(
                namespace, label_selector=label_selector, _request_timeout=self._timeout
            )
        )
        return [self._json(p) for p in pods.items or []]

    async def delete_pod(
        self, namespace: str, name: str, uid: str, grace_period_seconds: int | None = None
    ) -> None:
        """Delete a pod only if it is still the one with `uid` (409 otherwise)."""
        options: JSON = {"preconditions": {"uid": uid}}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        await self._call(
            self._core.delete_namespaced_pod(name, namespace, body=options, _request_timeout=self._timeout)
        )

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Ask for a PodDisruptionBudget-respecting eviction (policy/v1) of the pod with `uid`."""
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        await self._call(
            self._core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=self._timeout)
        )

    # --- nodes

    async def get_node(self, name: str) -> JSON:
        """Read one node."""
        return self._json(await self._call(self._core.read_node(name, _request_timeout=self._timeout)))

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON:
        """JSON merge patch; put metadata.resourceVersion in `patch` to make it conditional."""
        node = await self._call(
            self._core.patch_node(
                name, dict(patch), _content_type=MERGE_PATCH, _request_timeout=self._timeout
            )
        )
        return self._json(node)

    # --- workload owners

    async def get_replica_set(self, namespace: str, name: str) -> JSON:
        """Read one ReplicaSet (to find the Deployment that owns a pod's ReplicaSet)."""
        rs = await self._call(
            self._apps.read_namespaced_replica_set(name, namespace, _request_timeout=self._timeout)
        )
        return self._json(rs)

    async def patch_deployment(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        """Merge-patch a Deployment (rollout restart)."""
        deployment = await self._call(
            self._apps.patch_namespaced_deployment(
                name, namespace, dict(patch), _content_type=MERGE_PATCH, _request_timeout=self._timeout
            )
        )
        return self._json(deployment)

    # --- training-job owners: batch Jobs and custom resources (JobSet, PyTorchJob, Volcano)

    async def get_job(self, namespace: str, name: str) -> JSON:
        """Read one batch/v1 Job."""
        job = await self._call(
            self._batch.read_namespaced_job(name, namespace, _request_timeout=self._timeout)
        )
        return self._json(job)

    async def list_jobs(self, namespace: str, label_selector: str) -> list[JSON]:
        """The batch/v1 Jobs of one namespace that match a label selector."""
        jobs = await self._call(
            self._batch.list_namespaced_job(
                namespace, label_selector=label_selector, _request_timeout=self._timeout
            )
        )
        return [self._json(j) for j in jobs.items or []]

    async def delete_job(self, namespace: str, name: str, uid: str, propagation_policy: str) -> None:
        """Delete a Job only if it is still the one with `uid`; Foreground: its pods go first."""
        options: JSON = {"preconditions": {"uid": uid}, "propagationPolicy": propagation_policy}
        await self._call(
            self._batch.delete_namespaced_job(name, namespace, body=options, _request_timeout=self._timeout)
        )

    async def get_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> JSON:
        """Read one namespaced custom resource."""
        obj = await self._call(
            self._custom.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self._timeout
            )
        )
        return obj if isinstance(obj, dict) else {}

    async def create_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Mapping[str, Any]
    ) -> JSON:
        """Create a namespaced custom resource (409 when the name is taken)."""
        obj = await self._call(
            self._custom.create_namespaced_custom_object(
                group, version, namespace, plural, dict(body), _request_timeout=self._timeout
            )
        )
        return obj if isinstance(obj, dict) else {}

    # --- events

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Create one events.k8s.io/v1 Event (what `kubectl get events` and `describe` show)."""
        event = await self._call(
            self._events.create_namespaced_event(namespace, dict(body), _request_timeout=self._timeout)
        )
        return self._json(event)

    # --- leases

    async def get_lease(self, namespace: str, name: str) -> JSON:
        """Read one coordination.k8s.io/v1 Lease."""
        lease = await self._call(
            self._coordination.read_namespaced_lease(name, namespace, _request_timeout=self._timeout)
        )
        return self._json(lease)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Create a Lease (409 when it already exists)."""
        lease = await self._call(
            self._coordination.create_namespaced_lease(namespace, dict(body), _request_timeout=self._timeout)
        )
        return self._json(lease)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> JSON:
        """Replace a Lease; 409 when body's metadata.resourceVersion is stale."""
        lease = await self._call(
            self._coordination.replace_namespaced_lease(
                name, namespace, dict(body), _request_timeout=self._timeout
            )
        )
        return self._json(lease)

    # --- custom resources (remediation.gpupulse.io: incidents and the controller's switches)

    async def list_custom_objects(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        limit: int = 500,
        label_selector: str = "",
    ) -> list[JSON]:
        """Every object of one kind in the namespace (those `label_selector` matches), read in pages
        of `limit` (continue tokens)."""
        items: list[JSON] = []
        token = ""
        while True:
            kwargs: dict[str, Any] = {"limit": limit, "_request_timeout": self._timeout}
            if label_selector:
                kwargs["label_selector"] = label_selector
            if token:
                kwargs["_continue"] = token
            page = await self._call(
                self._custom.list_namespaced_custom_object(group, version, namespace, plural, **kwargs)
            )
            items.extend(dict(i) for i in page.get("items") or [])
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    async def replace_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Mapping[str, Any]
    ) -> JSON:
        """Replace an object's status subresource; 409 when metadata.resourceVersion is stale."""
        out = await self._call(
            self._custom.replace_namespaced_custom_object_status(
                group, version, namespace, plural, name, dict(body), _request_timeout=self._timeout
            )
        )
        return dict(out)

    async def delete_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> None:
        """Delete one namespaced custom object."""
        await self._call(
            self._custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self._timeout
            )
        )

    # --- cluster-wide objects (resource.k8s.io: ResourceSlices, ResourceClaims, DeviceTaintRules)

    async def list_cluster_objects(
        self, group: str, version: str, plural: str, field_selector: str = "", limit: int = 500
    ) -> list[JSON]:
        """Every object of one cluster-wide collection (those `field_selector` matches), read in pages;
        for a namespaced kind this lists across all namespaces."""
        items: list[JSON] = []
        token = ""
        while True:
            kwargs: dict[str, Any] = {"limit": limit, "_request_timeout": self._timeout}
            if field_selector:
                kwargs["field_selector"] = field_selector
            if token:
                kwargs["_continue"] = token
            page = await self._call(self._custom.list_cluster_custom_object(group, version, plural, **kwargs))
            items.extend(dict(i) for i in page.get("items") or [])
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    async def get_cluster_object(self, group: str, version: str, plural: str, name: str) -> JSON:
        """Read one cluster-scoped object."""
        obj = await self._call(
            self._custom.get_cluster_custom_object(
                group, version, plural, name, _request_timeout=self._timeout
            )
        )
        return obj if isinstance(obj, dict) else {}

    async def create_cluster_object(
        self, group: str, version: str, plural: str, body: Mapping[str, Any]
    ) -> JSON:
        """Create one cluster-scoped object (409 when the name is taken)."""
        obj = await self._call(
            self._custom.create_cluster_custom_object(
                group, version, plural, dict(body), _request_timeout=self._timeout
            )
        )
        return obj if isinstance(obj, dict) else {}

    async def patch_cluster_object(
        self, group: str, version: str, plural: str, name: str, patch: Mapping[str, Any]
    ) -> JSON:
        """JSON merge patch of one cluster-scoped object; metadata.resourceVersion in `patch` makes it
        conditional."""
        obj = await self._call(
            self._custom.patch_cluster_custom_object(
                group, version, plural, name, dict(patch), _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )
        )  # fmt: skip
        return obj if isinstance(obj, dict) else {}

    async def delete_cluster_object(
        self, group: str, version: str, plural: str, name: str, uid: str = ""
    ) -> None:
        """Delete one cluster-scoped object (only the one with `uid` when given: 409 otherwise)."""
        kwargs: dict[str, Any] = {"_request_timeout": self._timeout}
        if uid:
            kwargs["body"] = {"preconditions": {"uid": uid}}
        await self._call(self._custom.delete_cluster_custom_object(group, version, plural, name, **kwargs))
