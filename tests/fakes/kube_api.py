"""An in-process Kubernetes API server (aiohttp) speaking the REST paths and semantics gpupulse uses.

Served: pods get/list/watch/delete (DeleteOptions preconditions), pods/eviction (policy/v1, PDB evaluation),
nodes get/patch (merge and strategic-merge patch, resourceVersion conflicts), Leases get/create/replace,
ReplicaSets get, Deployments get/patch, PodDisruptionBudgets list, the training-job owners: batch/v1
Jobs and the custom resources of `SERVED` (JobSet, PyTorchJob, Volcano Job and Command,
LeaderWorkerSet) get/list/create/delete, with labelSelector on lists, generateName and AlreadyExists on
create, and DeleteOptions preconditions and propagationPolicy (Foreground and Background delete the
pods the object controls, as the garbage collector would; Orphan leaves them). A group/version/plural
outside `SERVED` answers 404, as an API server without that CRD does. The kinds in `WITH_STATUS`
(the controller's own GpuIncident and GpuRemediationState) have the status subresource, as their
CRDs declare: create drops status, PUT replaces the main resource keeping status, PUT .../status
changes only status; both updates need metadata.resourceVersion (422 without, 409 when stale);
lists take limit and continue. ResourceSlices list/watch
(resource.k8s.io, in the versions `resourceslice_versions` names: v1 and v1beta2 keep device attributes
on the device, v1beta1 under `basic`, converted from one stored form as the API server does; a version
not served answers 404). ResourceClaims (list in all namespaces) and DeviceTaintRules (create, get,
merge patch, delete, validated as kube-apiserver 1.37 does) of resource.k8s.io/v1: tests/fakes/kube_dra.py.
Errors are real `Status` bodies.
Tests reach it through kubernetes_asyncio with a kubeconfig written by `write_kubeconfig`.

Pods (all namespaces or one) can be listed and watched, as the exporter does. Watches follow the API
server's watch cache (k8s.io/apiserver storage/cacher): `?watch=true` streams newline-delimited events
(ADDED, MODIFIED, DELETED, BOOKMARK with allowWatchBookmarks) of the pods matching the namespace and
the `spec.nodeName` field selector, a pod that starts or stops matching arriving as ADDED or
DELETED; resourceVersion "" or "0" starts with a synthetic ADDED per existing pod, a
number replays the events after it, and one older than the kept history (`watch_window` events, or
everything before `compact()`) gets HTTP 200 and a single ERROR event carrying a 410 Expired Status,
as the cacher's error watcher sends; timeoutSeconds ends the stream cleanly.

Standalone, for proofs that run the controller as a separate process:
    python -m tests.fakes.kube_api --kubeconfig /tmp/kc --seed cluster.json
prints its URL, serves until SIGTERM/SIGINT, and exposes (token-protected) `GET /_fake/requests` (the
request log) and `GET /_fake/state` (nodes, pods, leases, deletions) for the proof to check.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from demo.slices import scenario_slice_devices
from tests.fakes.kube_dra import DraObjects

JSON = dict[str, Any]
Key = tuple[str, str]

MERGE_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
# the real server's size limits (tests/kube/test_real_apiserver.py measures both): kube-apiserver
# refuses a request body past 3 MiB with 413; etcd refuses to store past 1.5 MiB (--max-request-bytes)
# and kube-apiserver passes that on as a 500 with no reason
API_MAX_REQUEST_BYTES = 3 * 1024 * 1024
ETCD_MAX_REQUEST_BYTES = 1536 * 1024

# (group/version, plural) -> kind of the workload objects served besides the core ones
SERVED: dict[tuple[str, str], str] = {
    ("batch/v1", "jobs"): "Job",
    ("jobset.x-k8s.io/v1alpha2", "jobsets"): "JobSet",
    ("kubeflow.org/v1", "pytorchjobs"): "PyTorchJob",
    ("batch.volcano.sh/v1alpha1", "jobs"): "Job",
    ("bus.volcano.sh/v1alpha1", "commands"): "Command",
    ("leaderworkerset.x-k8s.io/v1", "leaderworkersets"): "LeaderWorkerSet",
    ("events.k8s.io/v1", "events"): "Event",
    ("remediation.gpupulse.io/v1", "gpuincidents"): "GpuIncident",
    ("remediation.gpupulse.io/v1", "gpuremediationstates"): "GpuRemediationState",
    # a validation Job's own claim (remediation/kube/validation.py); allocated claims: tests/fakes/kube_dra.py
    ("resource.k8s.io/v1", "resourceclaims"): "ResourceClaim",
}
# kinds served with the status subresource (helm/gpupulse/crds/remediation.gpupulse.io.yaml)
WITH_STATUS = {
    ("remediation.gpupulse.io/v1", "gpuincidents"),
    ("remediation.gpupulse.io/v1", "gpuremediationstates"),
}
ObjKey = tuple[str, str, str, str]  # (group/version, plural, namespace, name)
_SELECTOR_TERM = re.compile(r"^\s*(!?)([A-Za-z0-9._/-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9._-]*))?\s*$")


def parse_label_selector(text: str) -> list[tuple[str, str, str]]:
    """(op, key, value) terms of an equality-based selector (`a=b,c!=d,e,!f`); 400 on anything else."""
    terms = []
    for part in [p for p in text.split(",") if p.strip()]:
        m = _SELECTOR_TERM.match(part)
        if m is None:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
        neg, key, op, value = m.groups()
        if neg and op:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
        terms.append(("!" if neg else (op.replace("==", "=") if op else "exists"), key, value or ""))
    return terms


def selector_matches(terms: list[tuple[str, str, str]], labels: JSON) -> bool:
    for op, key, value in terms:
        have = labels.get(key)
        if (op == "=" and have != value) or (op == "!=" and have == value):
            return False
        if (op == "exists" and have is None) or (op == "!" and have is not None):
            return False
    return True


def owner_ref(obj: JSON) -> JSON:
    """A controller ownerReference to `obj`."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def status_body(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    """A metav1.Status failure body as the API server sends it."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


async def _body(request: web.Request) -> Any:
    raw = await request.read()  # cached by aiohttp after the middleware's first read
    return json.loads(raw) if raw else None


class ApiError(Exception):
    """Raised inside handlers; turned into a Status response."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.body = status_body(code, reason, message, details)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes, objects merge, everything else replaces)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _labels_match(selector: JSON, labels: JSON) -> bool:
    match = selector.get("matchLabels") or {}
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value = labels.get(expr["key"])
        values = expr.get("values") or []
        op = expr["operator"]
        if (op == "In" and value not in values) or (op == "NotIn" and value in values):
            return False
        if (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


@dataclass
class Fault:
    """Answer the next `times` requests matching method + path regex with this error."""

    method: str
    path: str
    code: int
    reason: str
    message: str = "injected fault"
    times: int = 1
    # API Priority and Fairness' rejection: text/plain, the wait only in the Retry-After header
    retry_after: str = ""


@dataclass(frozen=True)
class WatchEvent:
    """One change of an object: its resource (pods), resourceVersion, type, and
    the object before and after it."""

    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    obj: JSON
    old: JSON | None
    resource: str = "pods"


@dataclass
class _Watcher:
    resource: str
    namespace: str | None
    node: str | None
    bookmarks: bool
    queue: asyncio.Queue[WatchEvent | str]  # events, or "BOOKMARK" / "CLOSE"
    version: str = ""  # the API version the watch asked for (ResourceSlices are converted to it)


def resourceslices_from_scenario(
    api: FakeKubeAPI, doc: dict[str, Any], driver: str = "gpu.nvidia.com"
) -> JSON:
    """Publish a scenario's GPUs as NVIDIA's DRA driver does: one slice for the node, pool = node
    name, `gpu-<index>` per GPU and `gpu-<index>-mig-<n>` per MIG instance (demo/slices.py names them)."""
    node = str(doc["node"])
    return api.add_resourceslice(f"{node}-{driver}", node, driver, node, scenario_slice_devices(doc))


def pods_to_api_from_scenario(api: FakeKubeAPI, doc: dict[str, Any]) -> list[JSON]:
    """Add a scenario's `pods` as the API server holds them (schema: docs/design/attribution.md): bound
    to the scenario's node, with their `labels` and their `owner` as the controller ownerReference,
    so the exporter's pod watch sees what a kubelet's pod-resources answer lacks."""
    added = []
    for entry in doc.get("pods") or ():
        owner = entry.get("owner")
        refs = None
        if isinstance(owner, dict):
            ref = {k: str(owner[k]) for k in ("apiVersion", "kind", "name") if k in owner}
            ref["uid"] = str(owner.get("uid") or uuid.uuid5(uuid.NAMESPACE_URL, f"owner/{ref.get('name')}"))
            refs = [{**ref, "controller": True, "blockOwnerDeletion": True}]
        pod = api.add_pod(
            str(entry.get("namespace", "default")),
            str(entry["name"]),
            str(doc.get("node", "")),
            labels={str(k): str(v) for k, v in (entry.get("labels") or {}).items()} or None,
            owner_references=refs,
        )
        added.append(pod)
    return added


def slice_as(version: str, obj: JSON) -> JSON:
    """A ResourceSlice stored in v1 form as the API server serves it in `version`."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        devices = out.get("spec", {}).get("devices", [])
        for i, device in enumerate(devices):
            basic = {k: device.pop(k) for k in ("attributes", "capacity") if k in device}
            devices[i] = {"name": device["name"], "basic": basic}
    return out


def _pod_node(pod: JSON | None) -> str | None:
    return None if pod is None else (pod.get("spec") or {}).get("nodeName")


def parse_bool(value: str | None) -> bool:
    """A query flag as the API server reads it (Go's strconv.ParseBool: kubernetes_asyncio sends "True")."""
    return value in ("1", "t", "T", "TRUE", "true", "True")


def _node_selector(request: web.Request) -> str | None:
    selector = request.query.get("fieldSelector", "")
    if not selector:
        return None
    if not selector.startswith("spec.nodeName="):
        raise ApiError(400, "BadRequest", f'"{selector}" is not a known field selector: only "spec.nodeName"')
    return selector.removeprefix("spec.nodeName=")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str


@dataclass
class FakeKubeAPI:
    """State plus the aiohttp app; `url` is set once started."""

    token: str = "gpupulse-test-token"
    pods: dict[Key, JSON] = field(default_factory=dict)
    nodes: dict[str, JSON] = field(default_factory=dict)
    leases: dict[Key, JSON] = field(default_factory=dict)
    replicasets: dict[Key, JSON] = field(default_factory=dict)
    deployments: dict[Key, JSON] = field(default_factory=dict)
    pdbs: dict[Key, JSON] = field(default_factory=dict)
    objects: dict[ObjKey, JSON] = field(default_factory=dict)  # Jobs and the custom resources of SERVED
    resourceslices: dict[Key, JSON] = field(default_factory=dict)  # ("", name) -> v1 form
    # resource.k8s.io versions served (a 1.32 cluster: v1beta1 only; 1.33: v1beta2 too; 1.34+: v1)
    resourceslice_versions: tuple[str, ...] = ("v1", "v1beta2", "v1beta1")
    requests: list[Recorded] = field(default_factory=list)
    deleted: list[tuple[str, str, str]] = field(default_factory=list)  # (ns/name, uid, "delete"|"eviction")
    faults: list[Fault] = field(default_factory=list)
    # run before a request is handled (after auth): lets a test act as a concurrent writer
    before: list[Callable[[str, str], None]] = field(default_factory=list)
    url: str = ""
    # pod watch history the server keeps (the watch cache's capacity); older resourceVersions get 410
    watch_window: int = 1000
    events: list[WatchEvent] = field(default_factory=list)
    # raw lines the next pod watch writes before its events (a corrupt stream)
    inject_watch_lines: list[bytes] = field(default_factory=list)
    _compacted_rv: int = 0
    _watchers: list[_Watcher] = field(default_factory=list)
    _watchers_changed: asyncio.Event = field(default_factory=asyncio.Event)
    _rv: int = 1000
    _runner: web.AppRunner | None = None
    dra: DraObjects = field(init=False)

    def __post_init__(self) -> None:
        self.dra = DraObjects(self._meta, self.next_rv, ApiError)

    # --- lifecycle

    async def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1 (a free port unless `port` is given)."""
        # aiohttp's own 1 MiB body limit would answer first, without a Status body
        app = web.Application(middlewares=[self._middleware], client_max_size=2 * API_MAX_REQUEST_BYTES)
        r = app.router
        r.add_get("/api/v1/pods", self._list_all_pods)
        r.add_get("/api/v1/namespaces/{ns}/{resource:pods}", self._list_namespaced)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        r.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self._delete_pod)
        r.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        r.add_get("/api/v1/nodes/{name}", self._get_node)
        r.add_patch("/api/v1/nodes/{name}", self._patch_node)
        lease_base = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        r.add_post(lease_base, self._create_lease)
        r.add_get(lease_base + "/{name}", self._get_lease)
        r.add_put(lease_base + "/{name}", self._replace_lease)
        r.add_get("/apis/apps/v1/namespaces/{ns}/replicasets/{name}", self._get_replicaset)
        r.add_get("/apis/apps/v1/namespaces/{ns}/deployments/{name}", self._get_deployment)
        r.add_patch("/apis/apps/v1/namespaces/{ns}/deployments/{name}", self._patch_deployment)
        r.add_get("/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", self._list_pdbs)
        objects = "/apis/{group}/{version}/namespaces/{ns}/{plural}"
        r.add_get(objects, self._list_objects)
        r.add_post(objects, self._create_object)
        r.add_get(objects + "/{name}", self._get_object)
        r.add_put(objects + "/{name}", self._replace_object)
        r.add_put(objects + "/{name}/status", self._replace_object_status)
        r.add_delete(objects + "/{name}", self._delete_object)
        r.add_get("/apis/resource.k8s.io/{version}/resourceslices", self._list_resourceslices)
        r.add_get("/apis/resource.k8s.io/v1/resourceclaims", self._list_resourceclaims)
        rules = "/apis/resource.k8s.io/v1/devicetaintrules"
        r.add_post(rules, self._create_rule)
        r.add_get(rules + "/{name}", self._get_rule)
        r.add_patch(rules + "/{name}", self._patch_rule)
        r.add_delete(rules + "/{name}", self._delete_rule)
        r.add_get("/_fake/requests", self._debug_requests)
        r.add_get("/_fake/state", self._debug_state)
        # a client that goes away ends its handler (a watch), as the API server cancels the request context
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig with token auth pointing at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "gpupulse", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "gpupulse"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))  # JSON is valid YAML
        return path

    # --- seeding helpers

    def next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _meta(self, name: str, namespace: str | None, **extra: Any) -> JSON:
        meta: JSON = {
            "name": name,
            "uid": str(uuid.uuid4()),
            "resourceVersion": self.next_rv(),
            "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update({k: v for k, v in extra.items() if v is not None})
        return meta

    def add_node(
        self,
        name: str,
        unschedulable: bool = False,
        taints: list[JSON] | None = None,
        labels: dict[str, str] | None = None,
    ) -> JSON:
        spec: JSON = {}
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = taints
        meta = self._meta(name, None)
        if labels:
            meta["labels"] = dict(labels)
        node = {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec}
        self.nodes[name] = node
        return node

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        owner: tuple[str, str] | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        gpus: int = 0,
        phase: str = "Running",
        controller: JSON | None = None,
        owner_references: list[JSON] | None = None,
    ) -> JSON:
        """A pod bound to `node`; owner is (kind, name) of its controller, or `controller` an object
        added with add_object (its ownerReference, uid included), or owner_references given as is."""
        owners = owner_references
        if controller is not None:
            owners = [owner_ref(controller)]
        elif owner is not None:
            api = "v1" if owner[0] == "ReplicationController" else "apps/v1"
            api = "batch/v1" if owner[0] == "Job" else api
            owners = [
                {
                    "apiVersion": api,
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        resources: JSON = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": self._meta(
                name, namespace, labels=labels, annotations=annotations, ownerReferences=owners
            ),
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "registry.example/app:1", "resources": resources}],
            },
            "status": {"phase": phase},
        }
        self.pods[(namespace, name)] = pod
        self._emit("ADDED", pod, None)
        return pod

    # --- pod changes, as watchers see them

    def update_pod(self, namespace: str, name: str, change: Callable[[JSON], None]) -> JSON:
        """Apply `change` to a copy of the pod and store it with a new resourceVersion (MODIFIED)."""
        old = self.pods[(namespace, name)]
        pod = copy.deepcopy(old)
        change(pod)
        pod["metadata"]["resourceVersion"] = self.next_rv()
        self.pods[(namespace, name)] = pod
        self._emit("MODIFIED", pod, old)
        return pod

    def remove_pod(self, namespace: str, name: str) -> None:
        """Delete a pod as the kubelet's final status update does (DELETED)."""
        self._remove_pod(self.pods[(namespace, name)], "removed")

    def compact(self) -> None:
        """Forget the watch history (as etcd compaction does): a watch from an older RV gets 410."""
        self._compacted_rv = self._rv
        self.events.clear()

    def bookmark(self) -> None:
        """Send a BOOKMARK (the current resourceVersion) to every watch that allows bookmarks."""
        for w in self._watchers:
            if w.bookmarks:
                w.queue.put_nowait("BOOKMARK")

    def close_watches(self) -> None:
        """End every open watch stream (an API server restart, or its own watch timeout)."""
        for w in self._watchers:
            w.queue.put_nowait("CLOSE")

    @property
    def open_watches(self) -> int:
        """Watch streams being served right now."""
        return len(self._watchers)

    async def wait_open_watches(self, count: int, timeout_seconds: float = 5.0) -> None:
        """Wait until exactly `count` watch streams are open (a client connected, or went away)."""
        async with asyncio.timeout(timeout_seconds):
            while len(self._watchers) != count:
                await self._watchers_changed.wait()
                self._watchers_changed.clear()

    def _store(self, resource: str) -> dict[Key, JSON]:
        stores = {"pods": self.pods, "resourceslices": self.resourceslices}
        if resource not in stores:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({resource})")
        return stores[resource]

    def _emit(self, kind: str, pod: JSON, old: JSON | None, resource: str = "pods") -> None:
        event = WatchEvent(int(pod["metadata"]["resourceVersion"]), kind, copy.deepcopy(pod), old, resource)
        self.events.append(event)
        if len(self.events) > self.watch_window:
            dropped = self.events.pop(0)
            self._compacted_rv = max(self._compacted_rv, dropped.rv)
        for w in self._watchers:
            w.queue.put_nowait(event)

    def add_resourceslice(
        self, name: str, node: str, driver: str, pool: str, devices: list[JSON], generation: int = 0
    ) -> JSON:
        """A ResourceSlice of `node` (v1 form: devices [{name, attributes: {k: {string: v}}}])."""
        obj: JSON = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": self._meta(name, None),
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                "devices": copy.deepcopy(devices),
            },
        }
        old = self.resourceslices.get(("", name))
        if old is not None:
            obj["metadata"]["uid"] = old["metadata"]["uid"]
        self.resourceslices[("", name)] = obj
        self._emit("MODIFIED" if old is not None else "ADDED", obj, old, "resourceslices")
        return obj

    def remove_resourceslice(self, name: str) -> None:
        """Delete a ResourceSlice (the driver unpublished it)."""
        old = self.resourceslices.pop(("", name))
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self.next_rv()
        self._emit("DELETED", gone, old, "resourceslices")

    def add_replicaset(self, namespace: str, name: str, deployment: str | None) -> None:
        owners = (
            [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": deployment,
                    "uid": "d",
                    "controller": True,
                }
            ]
            if deployment
            else None
        )
        self.replicasets[(namespace, name)] = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": self._meta(name, namespace, ownerReferences=owners),
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}},
        }

    def add_deployment(self, namespace: str, name: str) -> None:
        self.deployments[(namespace, name)] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self._meta(name, namespace),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}},
            },
        }

    def add_pdb(
        self, namespace: str, name: str, match_labels: dict[str, str], disruptions_allowed: int
    ) -> JSON:
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self._meta(name, namespace),
            "spec": {"minAvailable": 1, "selector": {"matchLabels": match_labels}},
            "status": {
                "disruptionsAllowed": disruptions_allowed,
                "currentHealthy": 1,
                "desiredHealthy": 1,
                "expectedPods": 1,
                "observedGeneration": 1,
            },
        }
        self.pdbs[(namespace, name)] = pdb
        return pdb

    def add_object(
        self,
        api_version: str,
        plural: str,
        namespace: str,
        name: str,
        spec: JSON | None = None,
        labels: dict[str, str] | None = None,
        controller: JSON | None = None,
    ) -> JSON:
        """A Job or custom resource of SERVED, optionally controlled by another object."""
        kind = SERVED[(api_version, plural)]
        owners = [owner_ref(controller)] if controller is not None else None
        body: JSON = dict(spec or {})
        obj: JSON = {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": self._meta(name, namespace, labels=labels, ownerReferences=owners),
            "spec": body,
        }
        if api_version == "batch/v1":  # the API server defaults and requires these on every Job
            body.setdefault("completionMode", "NonIndexed")
            if "backoffLimitPerIndex" not in body:
                body.setdefault("backoffLimit", 6)
            body.setdefault(
                "template", {"spec": {"containers": [{"name": "main", "image": "registry.example/train:1"}]}}
            )
        self.objects[(api_version, plural, namespace, name)] = obj
        return obj

    def objects_of(self, api_version: str, plural: str) -> list[JSON]:
        return [o for (av, pl, _, _), o in self.objects.items() if (av, pl) == (api_version, plural)]

    def seed(self, doc: dict[str, Any]) -> None:
        """Load nodes, pods, ReplicaSets, Deployments and PDBs from a JSON-shaped document."""
        for n in doc.get("nodes") or []:
            self.add_node(n["name"], bool(n.get("unschedulable")), n.get("taints"))
        for d in doc.get("deployments") or []:
            self.add_deployment(d["namespace"], d["name"])
        for rs in doc.get("replicasets") or []:
            self.add_replicaset(rs["namespace"], rs["name"], rs.get("deployment"))
        for p in doc.get("pods") or []:
            owner = tuple(p["owner"]) if p.get("owner") else None
            self.add_pod(
                p["namespace"],
                p["name"],
                p["node"],
                owner=owner,
                labels=p.get("labels"),
                annotations=p.get("annotations"),
                gpus=int(p.get("gpus", 0)),
            )
        for b in doc.get("pdbs") or []:
            self.add_pdb(b["namespace"], b["name"], b["match_labels"], int(b["disruptions_allowed"]))

    def fail(self, method: str, path: str, code: int, reason: str, times: int = 1, message: str = "") -> None:
        """Inject `times` failures for requests whose path matches the regex `path`."""
        self.faults.append(Fault(method, path, code, reason, message or f"injected {reason}", times))

    def throttle(self, method: str, path: str, retry_after: str, times: int = 1) -> None:
        """Refuse `times` matching requests as API Priority and Fairness does: 429, a plain-text body,
        `Retry-After: <retry_after>` (kube-apiserver's filters/priority-and-fairness.go)."""
        self.faults.append(Fault(method, path, 429, "TooManyRequests", "", times, retry_after))

    def calls(self, method: str, path_regex: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and re.search(path_regex, r.path)]

    # --- plumbing

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if auth != f"Bearer {self.token}":
            return web.json_response(status_body(401, "Unauthorized", "Unauthorized"), status=401)
        raw = await request.read()
        if len(raw) > API_MAX_REQUEST_BYTES:
            message = f"Request entity too large: limit is {API_MAX_REQUEST_BYTES}"
            return web.json_response(status_body(413, "RequestEntityTooLarge", message), status=413)
        body = json.loads(raw) if raw else None
        self.requests.append(
            Recorded(request.method, request.path, dict(request.query), body, request.content_type)
        )
        for hook in list(self.before):
            hook(request.method, request.path)
        for fault in self.faults:
            if fault.times > 0 and fault.method == request.method and re.search(fault.path, request.path):
                fault.times -= 1
                if fault.retry_after:
                    return web.Response(
                        status=fault.code,
                        text="Too many requests, please try again later.\n",
                        headers={"Retry-After": fault.retry_after},
                    )
                return web.json_response(
                    status_body(fault.code, fault.reason, fault.message), status=fault.code
                )
        try:
            result: web.StreamResponse = await handler(request)
        except ApiError as err:
            return web.json_response(err.body, status=err.code)
        return result

    @staticmethod
    def _not_found(resource: str, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})

    @staticmethod
    def _conflict(resource: str, name: str) -> ApiError:
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            {"name": name, "kind": resource},
        )

    def _pod(self, request: web.Request) -> JSON:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.pods:
            raise self._not_found("pods", key[1])
        return self.pods[key]

    @staticmethod
    def _list(kind: str, items: list[JSON], rv: str) -> web.Response:
        return web.json_response(
            {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}
        )

    @staticmethod
    def _check_preconditions(obj: JSON, options: JSON | None) -> None:
        # worded as the real server's storage layer words it, for a delete and an eviction alike
        # (tests/kube/test_shared_behaviour.py runs the same calls against both)
        pre = (options or {}).get("preconditions") or {}
        meta = obj["metadata"]
        what = f'Operation cannot be fulfilled on {obj.get("kind", "Pod")} "{meta["name"]}"'
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"{what}: the UID in the precondition ({pre['uid']}) does not match the UID in record "
                f"({meta['uid']}). The object might have been deleted and then recreated",
                {"name": meta["name"], "kind": "pods"},
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f"{what}: the ResourceVersion in the precondition ({pre['resourceVersion']}) does not "
                f"match the ResourceVersion in record ({meta['resourceVersion']}). "
                "The object might have been modified",
                {"name": meta["name"]},
            )

    def _remove_pod(self, pod: JSON, via: str) -> None:
        meta = pod["metadata"]
        del self.pods[(meta["namespace"], meta["name"])]
        self.deleted.append((f"{meta['namespace']}/{meta['name']}", meta["uid"], via))
        gone = copy.deepcopy(pod)
        gone["metadata"]["resourceVersion"] = self.next_rv()
        self._emit("DELETED", gone, pod)

    # --- pods

    async def _list_all_pods(self, request: web.Request) -> web.StreamResponse:
        return await self._collection(request, "pods", None)

    async def _list_namespaced(self, request: web.Request) -> web.StreamResponse:
        return await self._collection(request, request.match_info["resource"], request.match_info["ns"])

    async def _list_resourceslices(self, request: web.Request) -> web.StreamResponse:
        version = request.match_info["version"]
        if version not in self.resourceslice_versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        node = _node_selector(request)
        if parse_bool(request.query.get("watch")):
            return await self._watch(request, "resourceslices", None, node, version)
        items = [
            slice_as(version, o) for o in self.resourceslices.values() if node is None or _pod_node(o) == node
        ]
        return web.json_response(
            {
                "kind": "ResourceSliceList",
                "apiVersion": f"resource.k8s.io/{version}",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    # --- ResourceClaims and DeviceTaintRules (tests/fakes/kube_dra.py)

    async def _list_resourceclaims(self, request: web.Request) -> web.Response:
        return self._list("ResourceClaimList", self.dra.list_claims(), str(self._rv))

    async def _create_rule(self, request: web.Request) -> web.Response:
        body = await _body(request)
        return web.json_response(self.dra.create_rule(body if isinstance(body, dict) else {}), status=201)

    async def _get_rule(self, request: web.Request) -> web.Response:
        return web.json_response(self.dra.rule(request.match_info["name"]))

    async def _patch_rule(self, request: web.Request) -> web.Response:
        if request.content_type not in MERGE_PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType", f"the fake does not support {request.content_type}")
        patch = await _body(request) or {}
        return web.json_response(self.dra.patch_rule(request.match_info["name"], patch, merge_patch))

    async def _delete_rule(self, request: web.Request) -> web.Response:
        options = await _body(request)
        return web.json_response(self.dra.delete_rule(request.match_info["name"], options))

    async def _collection(
        self, request: web.Request, resource: str, namespace: str | None
    ) -> web.StreamResponse:
        """LIST or (with watch=true) WATCH a collection, optionally in one namespace."""
        node = _node_selector(request) if resource == "pods" else None
        if parse_bool(request.query.get("watch")):
            return await self._watch(request, resource, namespace, node)
        terms = parse_label_selector(request.query.get("labelSelector", ""))
        items = [
            o
            for (ns, _), o in self._store(resource).items()
            if (namespace is None or ns == namespace)
            and (node is None or _pod_node(o) == node)
            and selector_matches(terms, o["metadata"].get("labels") or {})
        ]
        return self._list("PodList", copy.deepcopy(items), str(self._rv))

    @staticmethod
    def _as_seen(event: WatchEvent, w: _Watcher) -> tuple[str, JSON] | None:
        """The event as this watch gets it, if at all."""
        if event.resource != w.resource:
            return None
        if w.namespace is not None and event.obj["metadata"].get("namespace") != w.namespace:
            return None
        node = w.node
        if node is None:
            return event.type, event.obj
        now, before = _pod_node(event.obj) == node, _pod_node(event.old) == node
        if event.type == "DELETED":
            return ("DELETED", event.obj) if before or now else None
        if now and (event.type == "ADDED" or not before):
            return "ADDED", event.obj
        if now:
            return "MODIFIED", event.obj
        if before:  # left the selector: the watch sees it deleted
            return "DELETED", event.obj
        return None

    async def _watch(
        self, request: web.Request, resource: str, namespace: str | None, node: str | None, version: str = ""
    ) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version: {since}")
        timeout = float(request.query.get("timeoutSeconds") or 0) or None
        bookmarks = parse_bool(request.query.get("allowWatchBookmarks"))
        watcher = _Watcher(resource, namespace, node, bookmarks, asyncio.Queue(), version)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: JSON) -> None:
            if resource == "resourceslices" and kind != "ERROR" and kind != "BOOKMARK":
                obj = slice_as(version, obj)
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since not in ("", "0") and int(since) < self._compacted_rv:
            oldest = self.events[0].rv - 1 if self.events else self._rv
            await send("ERROR", status_body(410, "Expired", f"too old resource version: {since} ({oldest})"))
            await response.write_eof()
            return response
        if since in ("", "0"):
            backlog = [
                ("ADDED", o)
                for (ns, _), o in self._store(resource).items()
                if (namespace is None or ns == namespace) and (node is None or _pod_node(o) == node)
            ]
        else:
            seen = (self._as_seen(e, watcher) for e in self.events if e.rv > int(since))
            backlog = [s for s in seen if s is not None]
        self._watchers.append(watcher)
        self._watchers_changed.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for line in self.inject_watch_lines:
                await response.write(line)
            self.inject_watch_lines.clear()
            for kind, obj in backlog:
                await send(kind, copy.deepcopy(obj))
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                transport = request.transport
                if transport is None or transport.is_closing():
                    break  # the client went away (the API server's request context is done)
                try:
                    # wake up now and then to notice a client that left without a word
                    item = await asyncio.wait_for(watcher.queue.get(), min(left or 0.2, 0.2))
                except TimeoutError:
                    continue
                if item == "CLOSE":
                    break
                if item == "BOOKMARK":
                    bookmark = {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(self._rv)},
                    }
                    await send("BOOKMARK", bookmark)
                    continue
                assert isinstance(item, WatchEvent)
                seen_event = self._as_seen(item, watcher)
                if seen_event is not None:
                    await send(seen_event[0], copy.deepcopy(seen_event[1]))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.remove(watcher)
            self._watchers_changed.set()
        return response

    async def _get_pod(self, request: web.Request) -> web.Response:
        return web.json_response(self._pod(request))

    async def _delete_pod(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        self._check_preconditions(pod, await _body(request))
        self._remove_pod(pod, "delete")
        return web.json_response(pod)

    async def _evict(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        body = await _body(request) or {}
        if body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            raise ApiError(400, "BadRequest", "expected a policy/v1 Eviction")
        self._check_preconditions(pod, body.get("deleteOptions"))
        ns, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels") or {}
        matching = [
            p
            for (pns, _), p in self.pdbs.items()
            if pns == ns and _labels_match(p["spec"]["selector"], labels)
        ]
        if len(matching) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, "
                "which the eviction subresource does not support.",
            )
        if matching:
            pdb = matching[0]
            if pdb["status"]["disruptionsAllowed"] <= 0:
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb['metadata']['name']} needs "
                                f"{pdb['status']['desiredHealthy']} healthy pods and has "
                                f"{pdb['status']['currentHealthy']} currently",
                            }
                        ]
                    },
                )
            pdb["status"]["disruptionsAllowed"] -= 1
        self._remove_pod(pod, "eviction")
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
            status=201,
        )

    # --- nodes

    def _node(self, name: str) -> JSON:
        if name not in self.nodes:
            raise self._not_found("nodes", name)
        return self.nodes[name]

    async def _get_node(self, request: web.Request) -> web.Response:
        return web.json_response(self._node(request.match_info["name"]))

    async def _apply_patch(self, obj: JSON, request: web.Request, resource: str) -> JSON:
        if request.content_type not in MERGE_PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType", f"the fake does not support {request.content_type}")
        patch = copy.deepcopy(await _body(request) or {})
        meta_patch = patch.get("metadata") or {}
        wanted_rv = meta_patch.pop("resourceVersion", None)
        if wanted_rv is not None and wanted_rv != obj["metadata"]["resourceVersion"]:
            raise self._conflict(resource, obj["metadata"]["name"])
        # strategic merge treats node taints (no patchMergeKey) and our other fields like a merge patch
        patched: JSON = merge_patch(obj, patch)
        patched["metadata"]["resourceVersion"] = self.next_rv()
        return patched

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.nodes[name] = await self._apply_patch(self._node(name), request, "nodes")
        return web.json_response(self.nodes[name])

    # --- leases

    def _lease(self, ns: str, name: str) -> JSON:
        if (ns, name) not in self.leases:
            raise self._not_found("leases.coordination.k8s.io", name)
        return self.leases[(ns, name)]

    async def _get_lease(self, request: web.Request) -> web.Response:
        return web.json_response(self._lease(request.match_info["ns"], request.match_info["name"]))

    async def _create_lease(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        body = copy.deepcopy(await _body(request) or {})
        name = body.get("metadata", {}).get("name", "")
        if (ns, name) in self.leases:
            raise ApiError(
                409,
                "AlreadyExists",
                f'leases.coordination.k8s.io "{name}" already exists',
                {"name": name, "group": "coordination.k8s.io", "kind": "leases"},
            )
        body["metadata"] = self._meta(name, ns)
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        body.setdefault("kind", "Lease")
        self.leases[(ns, name)] = body
        return web.json_response(body, status=201)

    async def _replace_lease(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        current = self._lease(ns, name)
        body = copy.deepcopy(await _body(request) or {})
        wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise self._conflict("leases.coordination.k8s.io", name)
        body["metadata"] = {**current["metadata"], "resourceVersion": self.next_rv()}
        self.leases[(ns, name)] = body
        return web.json_response(body)

    # --- apps and policy

    async def _get_replicaset(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.replicasets:
            raise self._not_found("replicasets.apps", key[1])
        return web.json_response(self.replicasets[key])

    def _deployment(self, request: web.Request) -> JSON:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.deployments:
            raise self._not_found("deployments.apps", key[1])
        return self.deployments[key]

    async def _get_deployment(self, request: web.Request) -> web.Response:
        return web.json_response(self._deployment(request))

    async def _patch_deployment(self, request: web.Request) -> web.Response:
        deployment = await self._apply_patch(self._deployment(request), request, "deployments.apps")
        key = (request.match_info["ns"], request.match_info["name"])
        self.deployments[key] = deployment
        return web.json_response(deployment)

    async def _list_pdbs(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        items = [p for (pns, _), p in self.pdbs.items() if pns == ns]
        return self._list("PodDisruptionBudgetList", copy.deepcopy(items), str(self._rv))

    # --- batch Jobs and custom resources

    @staticmethod
    def _served(request: web.Request) -> tuple[str, str, str]:
        m = request.match_info
        api_version = f"{m['group']}/{m['version']}"
        if (api_version, m["plural"]) not in SERVED:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return api_version, m["plural"], m["ns"]

    def _object(self, request: web.Request) -> tuple[ObjKey, JSON]:
        api_version, plural, ns = self._served(request)
        key = (api_version, plural, ns, request.match_info["name"])
        if key not in self.objects:
            raise self._not_found(f"{plural}.{request.match_info['group']}", key[3])
        return key, self.objects[key]

    async def _list_objects(self, request: web.Request) -> web.Response:
        api_version, plural, ns = self._served(request)
        terms = parse_label_selector(request.query.get("labelSelector", ""))
        items = sorted(
            (
                o
                for (av, pl, ons, _), o in self.objects.items()
                if (av, pl, ons) == (api_version, plural, ns)
                and selector_matches(terms, o["metadata"].get("labels") or {})
            ),
            key=lambda o: str(o["metadata"]["name"]),
        )
        meta: JSON = {"resourceVersion": str(self._rv)}
        start = request.query.get("continue", "")
        if start:  # opaque to clients; the API server encodes a key the same way in spirit
            items = [o for o in items if str(o["metadata"]["name"]) > start]
        limit = int(request.query.get("limit", "0") or 0)
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = str(items[-1]["metadata"]["name"])
        kind = SERVED[(api_version, plural)]
        return web.json_response(
            {
                "kind": f"{kind}List",
                "apiVersion": api_version,
                "metadata": meta,
                "items": copy.deepcopy(items),
            }
        )

    async def _get_object(self, request: web.Request) -> web.Response:
        return web.json_response(self._object(request)[1])

    async def _create_object(self, request: web.Request) -> web.Response:
        api_version, plural, ns = self._served(request)
        body = await _body(request)
        if not isinstance(body, dict) or body.get("apiVersion") != api_version:
            raise ApiError(400, "BadRequest", f"the body is not a {api_version} object")
        meta = dict(body.get("metadata") or {})
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        if (api_version, plural, ns, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists', {"name": name})
        obj = dict(body)
        obj["metadata"] = {**meta, **self._meta(name, ns)}
        if (api_version, plural) in WITH_STATUS:  # the status subresource: a create does not set status
            obj.pop("status", None)
            obj["metadata"]["generation"] = 1
        self._store_object((api_version, plural, ns, name), obj)
        return web.json_response(obj, status=201)

    def _check_update(self, key: ObjKey, current: JSON, body: JSON) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        resource = f"{key[1]}.{key[0].split('/')[0]}"
        if not wanted:  # custom resources do not allow unconditional updates
            raise ApiError(
                422,
                "Invalid",
                f'{resource} "{key[3]}" is invalid: metadata.resourceVersion: Invalid value: 0: '
                "must be specified for an update",
            )
        if wanted != current["metadata"]["resourceVersion"]:
            raise self._conflict(resource, key[3])

    def _with_status(self, request: web.Request) -> tuple[ObjKey, JSON]:
        key, current = self._object(request)
        if (key[0], key[1]) not in WITH_STATUS:
            raise ApiError(
                405, "MethodNotAllowed", "this fake serves updates for the status-subresource kinds only"
            )
        return key, current

    async def _replace_object(self, request: web.Request) -> web.Response:
        key, current = self._with_status(request)
        body = copy.deepcopy(await _body(request) or {})
        self._check_update(key, current, body)
        new = {k: v for k, v in body.items() if k != "status"}
        if "status" in current:  # the main resource never changes status
            new["status"] = copy.deepcopy(current["status"])
        meta = body.get("metadata") or {}
        new["metadata"] = {
            **current["metadata"],
            "labels": meta.get("labels"),
            "resourceVersion": self.next_rv(),
        }
        if body.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        self._store_object(key, new)
        return web.json_response(new)

    async def _replace_object_status(self, request: web.Request) -> web.Response:
        key, current = self._with_status(request)
        body = copy.deepcopy(await _body(request) or {})
        self._check_update(key, current, body)
        new = copy.deepcopy(current)  # a status write changes only status
        new["status"] = body.get("status") or {}
        new["metadata"]["resourceVersion"] = self.next_rv()
        self._store_object(key, new)
        return web.json_response(new)

    def _store_object(self, key: ObjKey, obj: JSON) -> None:
        """Keep `obj` unless etcd would refuse it as too large (500, as kube-apiserver passes it on)."""
        if len(json.dumps(obj).encode()) > ETCD_MAX_REQUEST_BYTES:
            raise ApiError(500, "", "etcdserver: request is too large")
        self.objects[key] = obj

    async def _delete_object(self, request: web.Request) -> web.Response:
        key, obj = self._object(request)
        options = await _body(request)
        self._check_preconditions(obj, options)
        policy = (options or {}).get("propagationPolicy") or "Background"
        del self.objects[key]
        uid = obj["metadata"]["uid"]
        self.deleted.append((f"{key[2]}/{key[3]}", uid, f"delete {key[1]} {policy}"))
        if policy in ("Foreground", "Background"):
            for pod in [
                p
                for p in self.pods.values()
                if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])
            ]:
                self._remove_pod(pod, f"garbage-collected ({policy})")
        return web.json_response(obj)

    # --- debug endpoints for out-of-process proofs

    async def _debug_requests(self, request: web.Request) -> web.Response:
        log = [r for r in self.requests if not r.path.startswith("/_fake/")]
        return web.json_response(
            [{"method": r.method, "path": r.path, "query": r.query, "body": r.body} for r in log]
        )

    async def _debug_state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "nodes": self.nodes,
                "pods": {f"{ns}/{name}": p for (ns, name), p in self.pods.items()},
                "leases": {f"{ns}/{name}": lease for (ns, name), lease in self.leases.items()},
                "deleted": [list(d) for d in self.deleted],
                "custom": {f"{pl}/{ns}/{n}": o for (_, pl, ns, n), o in self.objects.items()},
            }
        )


async def _serve(args: argparse.Namespace, seed: dict[str, Any]) -> None:
    api = FakeKubeAPI(token=args.token)
    api.seed(seed)
    url = await api.start(args.port)
    api.write_kubeconfig(Path(args.kubeconfig))
    print(url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await api.stop()


def main() -> None:
    """Run the fake API server as a process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="gpupulse-test-token")
    parser.add_argument("--kubeconfig", required=True, help="where to write a kubeconfig for this server")
    parser.add_argument(
        "--seed", default="", help="JSON document: nodes, pods, replicasets, deployments, pdbs"
    )
    args = parser.parse_args()
    seed = json.loads(Path(args.seed).read_text()) if args.seed else {}
    asyncio.run(_serve(args, seed))


if __name__ == "__main__":
    main()
