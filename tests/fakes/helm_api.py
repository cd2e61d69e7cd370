"""An in-process Kubernetes API server (aiohttp) just real enough for `helm install`/`upgrade` (the Go
Helm 4 library bundled by helm-sdkpy) to run against it.

Serves what Helm asks for: /version, legacy discovery (/api, /apis, /api/v1, /apis/<group>/<version>)
for the kinds the gpupulse chart uses, namespace GET, and a generic object store with GET (404 when
absent), LIST (labelSelector equality terms), POST (create, echoed back with uid/resourceVersion/
creationTimestamp), PUT, merge and (approximated) strategic-merge PATCH, DELETE. Helm's release
storage is an ordinary Secret of type helm.sh/release.v1 in that store; its storage driver writes it
as protobuf, which `secret_from_protobuf` decodes. Everything else answers a 404 Status. Every request
is logged (`requests`), every POSTed object kept (`created`), every PATCH body kept (`patches`).

HTTPS with a self-signed certificate for 127.0.0.1, because client-go sends the kubeconfig's
credentials only over TLS (on a plain-http server it silently drops them); the bearer token is checked.
Keep-alive is off so no pooled TLS connection outlives `stop()`.
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

JSON = dict[str, Any]
# (group/version, plural, namespace or "", name)
Key = tuple[str, str, str, str]
RELEASE_SECRET_TYPE = "helm.sh/release.v1"


@dataclass(frozen=True)
class Resource:
    """One entry of an APIResourceList."""

    plural: str
    kind: str
    namespaced: bool


VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]

# group/version ("v1" for the core group) → resources served
RESOURCES: dict[str, list[Resource]] = {
    "v1": [
        Resource("namespaces", "Namespace", False),
        Resource("secrets", "Secret", True),
        Resource("configmaps", "ConfigMap", True),
        Resource("services", "Service", True),
        Resource("serviceaccounts", "ServiceAccount", True),
        Resource("persistentvolumeclaims", "PersistentVolumeClaim", True),
        Resource("pods", "Pod", True),
    ],
    "apps/v1": [
        Resource("daemonsets", "DaemonSet", True),
        Resource("deployments", "Deployment", True),
        Resource("statefulsets", "StatefulSet", True),
    ],
    "rbac.authorization.k8s.io/v1": [
        Resource("clusterroles", "ClusterRole", False),
        Resource("clusterrolebindings", "ClusterRoleBinding", False),
        Resource("roles", "Role", True),
        Resource("rolebindings", "RoleBinding", True),
    ],
    "networking.k8s.io/v1": [Resource("networkpolicies", "NetworkPolicy", True)],
    "policy/v1": [Resource("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "node.k8s.io/v1": [Resource("runtimeclasses", "RuntimeClass", False)],
    "coordination.k8s.io/v1": [Resource("leases", "Lease", True)],
    "flowcontrol.apiserver.k8s.io/v1": [Resource("flowschemas", "FlowSchema", False)],
    "apiextensions.k8s.io/v1": [Resource("customresourcedefinitions", "CustomResourceDefinition", False)],
    "monitoring.coreos.com/v1": [
        Resource("servicemonitors", "ServiceMonitor", True),
        Resource("podmonitors", "PodMonitor", True),
        Resource("prometheusrules", "PrometheusRule", True),
        Resource("thanosrulers", "ThanosRuler", True),
    ],
    "monitoring.coreos.com/v1alpha1": [Resource("alertmanagerconfigs", "AlertmanagerConfig", True)],
}


def status_body(code: int, reason: str, message: str) -> JSON:
    """A metav1.Status failure body as the API server sends it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(status_body(code, reason, message), status=code)


def _selector_matches(selector: str, labels: JSON) -> bool:
    """Equality-based label selector (a=b,c==d,e!=f), the form Helm's storage driver sends."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif labels.get(term) is None:  # bare key: exists
            return False
    return True


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value)


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; `strategic` approximates a strategic merge patch: lists of objects with a
    `name` (containers, volumes, env, ports) merge element-wise by name and `$` directives are dropped.
    """
    if strategic and _named_list(target) and _named_list(patch):
        merged = {item["name"]: item for item in target}
        for item in patch:
            merged[item["name"]] = merge_patch(merged.get(item["name"]), item, strategic)
        return list(merged.values())
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value, strategic)
    return out


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for IP 127.0.0.1 and its key (openssl; EC, so it takes milliseconds)."""
    cert, key = directory / "apiserver.pem", directory / "apiserver.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=fake-kube-apiserver",
         "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:TRUE",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


PROTOBUF = "application/vnd.kubernetes.protobuf"
PROTOBUF_MAGIC = b"k8s\x00"


def _protobuf_fields(data: bytes) -> dict[int, list[Any]]:
    """Protobuf wire format → field number → values (ints for varints, bytes for length-delimited)."""
    fields: dict[int, list[Any]] = {}
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while pos < len(data):
        tag = varint()
        number, wire = tag >> 3, tag & 7
        value: Any
        if wire == 0:
            value = varint()
        elif wire == 2:
            length = varint()
            value, pos = data[pos : pos + length], pos + length
        elif wire in (1, 5):  # fixed64 / fixed32: unused by the objects decoded here
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


def _protobuf_map(entries: list[bytes]) -> dict[str, bytes]:
    out = {}
    for entry in entries:
        f = _protobuf_fields(entry)
        out[f[1][0].decode()] = f.get(2, [b""])[0]
    return out


def secret_from_protobuf(body: bytes) -> JSON:
    """A v1 Secret sent as application/vnd.kubernetes.protobuf (how Helm's storage driver writes).

    Envelope: magic + runtime.Unknown{1: typeMeta, 2: raw}; Secret{1: metadata, 2: data, 3: type};
    ObjectMeta{1: name, 3: namespace, 11: labels, 12: annotations} (field numbers of k8s.io/api).
    """
    if not body.startswith(PROTOBUF_MAGIC):
        raise ValueError("not a Kubernetes protobuf envelope")
    unknown = _protobuf_fields(body[len(PROTOBUF_MAGIC) :])
    type_meta = _protobuf_fields(unknown[1][0])
    kind = type_meta.get(2, [b""])[0].decode()
    if kind != "Secret":
        raise ValueError(f"protobuf decoding supports Secret only, got {kind!r}")
    secret = _protobuf_fields(unknown[2][0])
    meta = _protobuf_fields(secret.get(1, [b""])[0])
    metadata: JSON = {"name": meta[1][0].decode()}
    if 3 in meta:
        metadata["namespace"] = meta[3][0].decode()
    for number, name in ((11, "labels"), (12, "annotations")):
        if number in meta:
            metadata[name] = {k: v.decode() for k, v in _protobuf_map(meta[number]).items()}
    obj: JSON = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata}
    if 2 in secret:
        obj["data"] = {k: base64.b64encode(v).decode() for k, v in _protobuf_map(secret[2]).items()}
    if 3 in secret:
        obj["type"] = secret[3][0].decode()
    return obj


async def _object_body(request: web.Request) -> JSON:
    raw = await request.read()
    if request.content_type == PROTOBUF:
        return secret_from_protobuf(raw)
    body: JSON = json.loads(raw)
    return body


@dataclass
class Request:
    """One logged request."""

    method: str
    path: str
    query: dict[str, str]


@dataclass
class FakeHelmAPI:
    """Object store plus the aiohttp app; `url` is set once started."""

    token: str = "gpupulse-helm-test-token"
    namespaces: set[str] = field(default_factory=lambda: {"default"})
    objects: dict[Key, JSON] = field(default_factory=dict)
    created: list[JSON] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    patches: list[tuple[str, JSON]] = field(default_factory=list)  # (request path, patch body)
    url: str = ""
    _ca_pem: bytes = b""
    _rv: int = 100
    _runner: web.AppRunner | None = None

    # --- lifecycle

    async def start(self, tls_dir: Path) -> str:
        """Serve HTTPS on a free port of 127.0.0.1, with a certificate made in `tls_dir`."""
        cert, key = make_certificate(tls_dir)
        self._ca_pem = cert.read_bytes()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        app = web.Application(middlewares=[self._middleware])
        r = app.router
        r.add_get("/version", self._version)
        r.add_get("/api", self._api_versions)
        r.add_get("/apis", self._api_groups)
        r.add_get("/api/v1", self._core_resources)
        r.add_get("/apis/{group}/{version}", self._group_resources)
        r.add_get("/api/v1/namespaces/{name}", self._get_namespace)
        core = "/api/{version:v1}"
        grouped = "/apis/{group}/{version}"
        for base in (core, grouped):
            for scope in (base + "/namespaces/{ns}/{plural}", base + "/{plural}"):
                r.add_get(scope, self._list)
                r.add_post(scope, self._create)
                r.add_get(scope + "/{name}", self._get)
                r.add_put(scope + "/{name}", self._replace)
                r.add_patch(scope + "/{name}", self._patch)
                r.add_delete(scope + "/{name}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"https://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig with token auth pointing at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fake",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self._ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "helm", "user": {"token": self.token}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "helm", "namespace": namespace}}
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))  # JSON is valid YAML
        return path

    # --- what the chart produced

    def chart_objects(self) -> list[JSON]:
        """Every object the install created from the chart's templates (not Helm's release record,
        not the CRDs of crds/, which Helm installs first and apart from the release's manifest)."""
        return [
            o
            for o in self.created
            if o.get("type") != RELEASE_SECRET_TYPE and o.get("kind") != "CustomResourceDefinition"
        ]

    def crds(self) -> list[JSON]:
        """CustomResourceDefinitions created (Helm installs the chart's crds/ before its templates)."""
        return [o for o in self.created if o.get("kind") == "CustomResourceDefinition"]

    def stored(self, group_version: str, plural: str, namespace: str, name: str) -> JSON | None:
        """The object as the store holds it now (after updates and patches)."""
        return self.objects.get((group_version, plural, namespace, name))

    def release_records(self) -> list[JSON]:
        """Helm's release Secrets as currently stored."""
        return [o for o in self.objects.values() if o.get("type") == RELEASE_SECRET_TYPE]

    # --- plumbing

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append(Request(request.method, request.path, dict(request.query)))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            denied = _error(401, "Unauthorized", "Unauthorized")
            denied.force_close()
            return denied
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPNotFound:
            response = _error(
                404, "NotFound", f"the server could not find the requested resource ({request.path})"
            )
        # No keep-alive: the Go client pools connections, and an idle TLS connection left open at
        # stop() would outlive the test's event loop.
        response.force_close()
        return response

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    @staticmethod
    def _group_version(request: web.Request) -> str:
        group = request.match_info.get("group")
        version = request.match_info["version"]
        return f"{group}/{version}" if group else version

    def _resource(self, request: web.Request) -> tuple[str, Resource]:
        """The served resource the path names; 404 (no Status body, like an unknown path) otherwise."""
        gv = self._group_version(request)
        plural = request.match_info["plural"]
        for res in RESOURCES.get(gv, []):
            if res.plural == plural and res.namespaced == ("ns" in request.match_info):
                return gv, res
        raise web.HTTPNotFound()

    def _key(self, request: web.Request, gv: str, res: Resource, name: str) -> Key:
        return (gv, res.plural, request.match_info.get("ns", ""), name)

    # --- discovery

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "major": "1",
                "minor": "31",
                "gitVersion": "v1.31.0",
                "gitCommit": "fake",
                "gitTreeState": "clean",
                "buildDate": "2024-08-13T00:00:00Z",
                "goVersion": "go1.22.5",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def _api_versions(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }
        )

    async def _api_groups(self, request: web.Request) -> web.Response:
        groups: dict[str, list[str]] = {}
        for gv in RESOURCES:
            if "/" in gv:
                group, version = gv.split("/")
                groups.setdefault(group, []).append(version)
        body = {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
                }
                for group, versions in groups.items()
            ],
        }
        return web.json_response(body)

    @staticmethod
    def _resource_list(gv: str) -> JSON:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {
                    "name": res.plural,
                    "singularName": res.kind.lower(),
                    "namespaced": res.namespaced,
                    "kind": res.kind,
                    "verbs": VERBS,
                }
                for res in RESOURCES[gv]
            ],
        }

    async def _core_resources(self, request: web.Request) -> web.Response:
        return web.json_response(self._resource_list("v1"))

    async def _group_resources(self, request: web.Request) -> web.Response:
        gv = self._group_version(request)
        if gv not in RESOURCES:
            return _error(404, "NotFound", f"no group version {gv}")
        return web.json_response(self._resource_list(gv))

    async def _get_namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.namespaces:
            return _error(404, "NotFound", f'namespaces "{name}" not found')
        return web.json_response(
            {
                "kind": "Namespace",
                "apiVersion": "v1",
                "metadata": {"name": name},
                "status": {"phase": "Active"},
            }
        )

    # --- objects

    async def _list(self, request: web.Request) -> web.Response:
        gv, res = self._resource(request)
        ns = request.match_info.get("ns", "")
        selector = request.query.get("labelSelector", "")
        items = [
            obj
            for (ogv, plural, ons, _), obj in sorted(self.objects.items())
            if ogv == gv
            and plural == res.plural
            and (not ns or ons == ns)
            and _selector_matches(selector, obj["metadata"].get("labels") or {})
        ]
        body = {
            "kind": f"{res.kind}List",
            "apiVersion": gv,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }
        return web.json_response(body)

    async def _get(self, request: web.Request) -> web.Response:
        gv, res = self._resource(request)
        name = request.match_info["name"]
        obj = self.objects.get(self._key(request, gv, res, name))
        if obj is None:
            return _error(404, "NotFound", f'{res.plural} "{name}" not found')
        return web.json_response(obj)

    async def _create(self, request: web.Request) -> web.Response:
        gv, res = self._resource(request)
        obj = await _object_body(request)
        meta = obj.setdefault("metadata", {})
        key = self._key(request, gv, res, meta.get("name", ""))
        if key in self.objects:
            return _error(409, "AlreadyExists", f'{res.plural} "{key[3]}" already exists')
        if res.namespaced:
            meta["namespace"] = key[2]
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self._next_rv(),
            creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        if res.kind == "CustomResourceDefinition":
            # what the apiextensions controllers report moments after a valid CRD is created; Helm
            # waits for Established before it installs the chart
            obj["status"] = {
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
                ],
                "acceptedNames": obj.get("spec", {}).get("names", {}),
                "storedVersions": [
                    v["name"] for v in obj.get("spec", {}).get("versions", []) if v.get("storage")
                ],
            }
        self.objects[key] = obj
        self.created.append(copy.deepcopy(obj))
        return web.json_response(obj, status=201)

    async def _replace(self, request: web.Request) -> web.Response:
        gv, res = self._resource(request)
        key = self._key(request, gv, res, request.match_info["name"])
        if key not in self.objects:
            return _error(404, "NotFound", f'{res.plural} "{key[3]}" not found')
        obj = await _object_body(request)
        old_meta = self.objects[key]["metadata"]
        obj["metadata"].update(uid=old_meta["uid"], resourceVersion=self._next_rv())
        self.objects[key] = obj
        return web.json_response(obj)

    async def _patch(self, request: web.Request) -> web.Response:
        gv, res = self._resource(request)
        key = self._key(request, gv, res, request.match_info["name"])
        if key not in self.objects:
            return _error(404, "NotFound", f'{res.plural} "{key[3]}" not found')
        strategic = request.content_type == "application/strategic-merge-patch+json"
        if request.content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            return _error(415, "UnsupportedMediaType", f"patch type {request.content_type} not served")
        body: JSON = await request.json()
        self.patches.append((request.path, body))
        obj = merge_patch(self.objects[key], body, strategic)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key] = obj
        return web.json_response(obj)

    async def _delete(self, request: web.Request) -> web.Response:
        gv, res = self._resource(request)
        key = self._key(request, gv, res, request.match_info["name"])
        obj = self.objects.pop(key, None)
        if obj is None:
            return _error(404, "NotFound", f'{res.plural} "{key[3]}" not found')
        return web.json_response(obj)
