"""A real Kubernetes control plane for tests: etcd, kube-apiserver and kube-controller-manager built
by scripts/neighbours, on 127.0.0.1 with free ports in a temporary folder.

The API server runs with authorization mode RBAC, a static admin token, ServiceAccount token signing
keys (EC P-256 from openssl) and its default admission plugins; the controller manager runs the
garbage collector, disruption, ReplicaSet, Deployment, Job, ServiceAccount, Namespace and DRA
device-taint eviction controllers with one ServiceAccount credential per controller (resource.k8s.io/v1
with DeviceTaintRules is served by default in 1.37: no feature gate, no --runtime-config). There is no
scheduler and no kubelet: `Kubelet` (a watch of ours) binds unscheduled pods to a schedulable node,
reports them Running and Ready, and confirms a graceful delete the way a kubelet does (a delete with
grace period 0), so owners, PDB status and re-created pods behave as in a cluster. Every wait is on an
answer (a health endpoint, an object), with a deadline; teardown signals only the processes started
here, by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from demo.neighbours import MissingNeighbourError, neighbour_binary

JSON = dict[str, Any]
ADMIN_TOKEN = "gpupulse-real-admin-token"
KCM_TOKEN = "gpupulse-real-kcm-token"
# Only these controllers: no node lifecycle controller (it would taint and evict on nodes whose
# kubelet never heartbeats), no scheduler.
CONTROLLERS = (
    "garbage-collector-controller",
    "disruption-controller",
    "replicaset-controller",
    "deployment-controller",
    "job-controller",
    "serviceaccount-controller",
    "namespace-controller",
    # DeviceTaintRules: their EvictionInProgress status, and NoExecute evictions (DRA, GA in 1.37)
    "device-taint-eviction-controller",
)


class ControlPlaneError(Exception):
    """The control plane did not come up (or a wait on it ran out)."""


class KubeHTTPError(Exception):
    """A non-2xx answer of the real API server."""

    def __init__(self, status: int, body: JSON) -> None:
        super().__init__(f"{status} {body.get('reason', '')}: {body.get('message', '')}")
        self.status = status
        self.body = body


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], bool], within_seconds: float, what: str, every: float = 0.1) -> None:
    """Ask `predicate` (an API read, a health probe) until it holds, or raise ControlPlaneError."""
    deadline = time.monotonic() + within_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {within_seconds} s waiting for {what}")
        time.sleep(every)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


class RealKube:
    """A small JSON client for the real API server (admin token unless another is given)."""

    def __init__(self, url: str, ca_file: Path, token: str = ADMIN_TOKEN) -> None:
        self.url = url
        self.token = token
        self._tls = ssl.create_default_context(cafile=str(ca_file))
        # one opener, no proxies: urlopen builds an opener per call whose ProxyHandler reads
        # os.environ, which pytest changes in another thread (PYTEST_CURRENT_TEST) while the
        # stand-in kubelet's thread calls; a dict changing size under iteration killed that thread
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self._tls)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_seconds: float = 30.0,
    ) -> JSON:
        """One call; the decoded answer, or KubeHTTPError with the Status body."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with self._opener.open(req, timeout=timeout_seconds) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = {"message": raw.decode(errors="replace")}
            raise KubeHTTPError(e.code, parsed if isinstance(parsed, dict) else {}) from None
        out = json.loads(raw) if raw else {}
        return out if isinstance(out, dict) else {}

    def healthy(self, path: str = "/readyz") -> bool:
        """A health endpoint answers 200 (its body is text, not JSON)."""
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with self._opener.open(req, timeout=5) as r:
                return int(r.status) == 200
        except urllib.error.HTTPError:
            return False

    def get(self, path: str) -> JSON:
        return self.request("GET", path)

    def post(self, path: str, body: Mapping[str, Any]) -> JSON:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> JSON:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str, body: Mapping[str, Any] | None = None) -> JSON:
        return self.request("DELETE", path, body)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except KubeHTTPError as e:
            if e.status == 404:
                return False
            raise
        return True

    def apply(self, obj: Mapping[str, Any]) -> JSON:
        """Create `obj` at the path its apiVersion, kind and namespace name (409 is left to the caller)."""
        return self.post(collection_path(obj), obj)

    def stream(self, path: str) -> Iterator[JSON]:
        """A watch: one decoded event per line until the server ends it."""
        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        )
        with self._opener.open(req, timeout=60) as r:
            for line in r:
                if line.strip():
                    yield json.loads(line)


_PLURALS = {
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
    "Node": "nodes",
    "Pod": "pods",
    "Deployment": "deployments",
    "ReplicaSet": "replicasets",
    "StatefulSet": "statefulsets",
    "Job": "jobs",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Lease": "leases",
}
_CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace", "Node"}


def collection_path(obj: Mapping[str, Any]) -> str:
    """The REST collection an object is created in."""
    api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind in _CLUSTER_SCOPED:
        return f"{prefix}/{_PLURALS[kind]}"
    namespace = obj["metadata"].get("namespace", "default")
    return f"{prefix}/namespaces/{namespace}/{_PLURALS[kind]}"


@dataclass
class _Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    log_path: Path

    def tail(self, lines: int = 40) -> str:
        self.log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, within_seconds: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(within_seconds)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager under `workdir`.

    With `audit_policy` (an audit.k8s.io/v1 Policy) the API server writes its audit log, one JSON
    event per line, to `audit_log`: the server's own account of every request it was sent. `users`
    adds static bearer tokens (token -> user name) beside the admin's and the controller manager's."""

    workdir: Path
    audit_policy: JSON | None = None
    users: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    processes: list[_Process] = field(default_factory=list)
    startup_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "apiserver.pem"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def audit_events(self) -> list[JSON]:
        """Every audit event written so far (blocking mode: a request's event is written before its
        answer is sent)."""
        if not self.audit_log.exists():
            return []
        lines = self.audit_log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def _audit_flags(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self.workdir / "audit-policy.json"  # YAML, being a superset of JSON, reads it
        policy.write_text(json.dumps(self.audit_policy))
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",  # never rotated: a test reads one file
        ]

    def client(self, token: str = ADMIN_TOKEN) -> RealKube:
        return RealKube(self.url, self.ca_file, token)

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        log_path = self.workdir / f"{name}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        started = _Process(name, proc, log, log_path)
        self.processes.append(started)
        return started

    def _wait(self, process: _Process, probe: Callable[[], bool], within_seconds: float) -> None:
        start = time.monotonic()

        def ready() -> bool:
            if not process.alive():
                raise ControlPlaneError(f"{process.name} exited: {process.tail()}")
            try:
                return probe()
            except (OSError, ValueError, KubeHTTPError):
                return False

        try:
            wait_for(ready, within_seconds, f"{process.name} to be ready")
        except ControlPlaneError as e:
            raise ControlPlaneError(f"{e}\n{process.tail()}") from e
        self.startup_seconds[process.name] = round(time.monotonic() - start, 2)

    def _pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(parents=True)
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-days", "2", "-subj", "/CN=gpupulse-test-apiserver",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.pem"),
        )  # fmt: skip
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(pki / "sa.key"))
        _openssl("ec", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
        (pki / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},gpupulse-admin,gpupulse-admin,"system:masters"\n'
            f"{KCM_TOKEN},system:kube-controller-manager,system:kube-controller-manager\n"
            + "".join(f"{token},{user},{user}\n" for token, user in self.users.items())
        )

    def start(self) -> None:
        etcd_bin = neighbour_binary("etcd")
        apiserver_bin = neighbour_binary("kubernetes", "kube-apiserver")
        kcm_bin = neighbour_binary("kubernetes", "kube-controller-manager")
        self._pki()
        pki = self.workdir / "pki"
        client_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        self.etcd_url = etcd_url  # its /metrics: the database size a storm test watches
        peer = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(etcd_bin),
                f"--data-dir={self.workdir / 'etcd'}",
                "--name=gpupulse",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=gpupulse={peer}",
                "--unsafe-no-fsync",  # a throwaway test store on a shared disk
                "--log-level=warn",
            ],
        )
        self._wait(etcd, lambda: _http_json(etcd_url + "/health").get("health") == "true", 60)
        self.url = f"https://127.0.0.1:{api_port}"
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(apiserver_bin),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",  # no loopback address in the kubernetes Endpoints
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki / 'apiserver.pem'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                "--profiling=false",
                "--v=1",
                *self._audit_flags(),
            ],
        )
        admin = self.client()
        self._wait(apiserver, admin.healthy, 120)
        kubeconfig = write_kubeconfig(self.workdir / "kcm.kubeconfig", self.url, self.ca_file, KCM_TOKEN)
        kcm = self._spawn(
            "kube-controller-manager",
            [
                str(kcm_bin),
                f"--kubeconfig={kubeconfig}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--use-service-account-credentials",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                "--v=1",
            ],
        )
        # the ServiceAccount controller creating `default` in `default` says the controllers run
        self._wait(kcm, lambda: admin.exists("/api/v1/namespaces/default/serviceaccounts/default"), 120)

    def restart_apiserver(self, down_seconds: float = 0.0) -> float:
        """Stop kube-apiserver (SIGTERM, as a rollout does), keep it down `down_seconds`, start it
        again with the same flags (etcd keeps the state); the seconds until it answered /readyz."""
        (old,) = [p for p in self.processes if p.name.startswith("kube-apiserver")]
        assert isinstance(old.proc.args, list)  # as _spawn started it
        argv = [str(a) for a in old.proc.args]
        old.stop()
        self.processes.remove(old)
        time.sleep(down_seconds)
        start = time.monotonic()
        restarts = sum(1 for name in self.startup_seconds if name.startswith("kube-apiserver"))
        process = self._spawn(f"kube-apiserver-{restarts + 1}", argv)
        self._wait(process, self.client().healthy, 120)
        return time.monotonic() - start

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail()}" for p in self.processes)


def _http_json(url: str) -> JSON:
    with urllib.request.urlopen(url, timeout=5) as r:
        out = json.loads(r.read())
    return out if isinstance(out, dict) else {}


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str, namespace: str = "default") -> Path:
    """A kubeconfig with one cluster, one bearer-token user and one context."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [
            {"name": "real", "context": {"cluster": "real", "user": "user", "namespace": namespace}}
        ],
        "current-context": "real",
    }
    path.write_text(json.dumps(config))
    return path


def service_account_token(kube: RealKube, namespace: str, name: str, seconds: int = 3600) -> str:
    """Mint a token for a ServiceAccount with the TokenRequest API (as the kubelet does for a pod)."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }
    out = kube.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
    return str(out["status"]["token"])


def ensure_namespace(kube: RealKube, name: str) -> None:
    """Create the namespace and wait for its `default` ServiceAccount (pod admission needs it)."""
    with contextlib.suppress(KubeHTTPError):
        kube.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(
        lambda: kube.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        30,
        f"the default ServiceAccount of {name}",
    )


def add_node(kube: RealKube, name: str, gpus: int = 8, labels: Mapping[str, str] | None = None) -> JSON:
    """A Node object with a Ready condition and GPU capacity (no kubelet behind it)."""
    kube.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        },
    )
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                    "message": "played by tests/kube/realapi.py",
                },
            ],
        }
    }
    kube.merge_patch(f"/api/v1/nodes/{name}/status", status)
    # the TaintNodesByCondition admission plugin creates every node with the not-ready taint; the node
    # lifecycle controller (not run here: it would evict from nodes that never heartbeat) lifts it
    return kube.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})


class Kubelet:
    """Plays the scheduler and the kubelets of every node from one watch on all pods.

    An unscheduled pod is bound to the first node (by name) that is schedulable, carries no
    NoSchedule/NoExecute taint and has every label of the pod's nodeSelector; a bound pod is
    reported Running and Ready; a pod being deleted is
    confirmed with a delete of grace period 0 and its UID, unless its node is in `hung_nodes` (a kubelet
    that never confirms, as on a sick node).
    """

    def __init__(self, kube: RealKube) -> None:
        self.kube = kube
        self.hung_nodes: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(70)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.kube.get("/api/v1/pods")
                for pod in listing.get("items") or []:
                    self._handle(pod)
                rv = listing["metadata"]["resourceVersion"]
                query = urllib.parse.urlencode({"watch": "1", "resourceVersion": rv, "timeoutSeconds": "5"})
                for event in self.kube.stream(f"/api/v1/pods?{query}"):
                    if self._stop.is_set():
                        return
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._handle(event["object"])
            except (OSError, ValueError, KubeHTTPError) as e:
                if not self._stop.is_set():
                    self.errors.append(f"{type(e).__name__}: {e}")
                    self._stop.wait(0.2)

    def _node_for(self, pod: JSON) -> str | None:
        nodes = sorted(self.kube.get("/api/v1/nodes").get("items") or [], key=lambda n: n["metadata"]["name"])
        wanted = pod["spec"].get("nodeSelector") or {}
        for node in nodes:
            spec = node.get("spec") or {}
            if spec.get("unschedulable"):
                continue
            if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or []):
                continue
            labels = node["metadata"].get("labels") or {}
            if any(labels.get(key) != value for key, value in wanted.items()):
                continue
            return str(node["metadata"]["name"])
        return None

    def _handle(self, pod: JSON) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        try:
            if meta.get("deletionTimestamp"):
                if spec.get("nodeName") not in self.hung_nodes:
                    self.kube.delete(path, {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
                return
            if not spec.get("nodeName"):
                node = self._node_for(pod)
                if node is not None:
                    binding = {
                        "apiVersion": "v1",
                        "kind": "Binding",
                        "metadata": {"name": name, "namespace": ns, "uid": uid},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                    }
                    self.kube.post(f"{path}/binding", binding)
                return
            if status.get("phase") != "Running":
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                conditions = [
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ]
                self.kube.merge_patch(
                    f"{path}/status",
                    {"status": {"phase": "Running", "startTime": now, "conditions": conditions,
                                "podIP": "10.244.0.10", "hostIP": "10.0.0.1"}},
                )  # fmt: skip
        except KubeHTTPError as e:
            if e.status not in (404, 409):  # gone, or already replaced: the next event says what is there
                self.errors.append(f"{ns}/{name}: {e}")


@dataclass
class RealCluster:
    """What a real_apiserver test gets: the control plane, an admin client and the pod player."""

    plane: ControlPlane
    kube: RealKube
    kubelet: Kubelet

    def __post_init__(self) -> None:
        self._names = 0

    def unique(self, prefix: str) -> str:
        """A name not used before in this session (tests share one control plane)."""
        self._names += 1
        return f"{prefix}-{self._names}"


def env_missing_reason() -> str | None:
    """Why the control plane cannot run here (None when it can)."""
    try:
        neighbour_binary("etcd")
        neighbour_binary("kubernetes", "kube-apiserver")
        neighbour_binary("kubernetes", "kube-controller-manager")
    except MissingNeighbourError as e:
        return str(e)
    if os.system("command -v openssl >/dev/null 2>&1") != 0:
        return "openssl is missing (ServiceAccount signing keys and the serving certificate)"
    return None


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """One control plane for the session; each test works in namespaces and nodes of its own."""
    reason = env_missing_reason()
    if reason is not None:  # scripts/setup builds them: a missing binary is a failure, not a skip
        pytest.fail(reason)
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        plane.start()
    except BaseException as e:
        logs = plane.logs()
        plane.stop()
        raise ControlPlaneError(f"the control plane did not start: {e}\n{logs}") from None
    kube = plane.client()
    kubelet = Kubelet(kube)
    kubelet.start()
    try:
        yield RealCluster(plane, kube, kubelet)
    finally:
        kubelet.stop()
        plane.stop()


# --- CustomResourceDefinitions of other projects (tests/fixtures/crds), for the gang-restart tests

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"


def apply_crd(kube: RealKube, path: Path, within_seconds: float = 60.0) -> JSON:
    """Create the CRD in the YAML file `path` (409 when a module did already) and wait until the
    server serves it (condition Established)."""
    import yaml  # a test dependency; realapi itself reads only JSON

    doc = yaml.safe_load(path.read_text())
    name = str(doc["metadata"]["name"])
    with contextlib.suppress(KubeHTTPError):
        kube.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
    where = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"

    def established() -> bool:
        conditions = (kube.get(where).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    wait_for(established, within_seconds, f"the CRD {name} to be established")
    return kube.get(where)


def pods_in(kube: RealKube, namespace: str, selector: str = "") -> list[JSON]:
    """The namespace's pods (matching a label selector), being deleted or not."""
    query = f"?{urllib.parse.urlencode({'labelSelector': selector})}" if selector else ""
    return list(kube.get(f"/api/v1/namespaces/{namespace}/pods{query}").get("items") or [])


def is_ready(pod: JSON) -> bool:
    """Ready and not being deleted."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def controller_ref(obj: Mapping[str, Any]) -> JSON:
    """A controller ownerReference to `obj` as its controller writes it (blocking a foreground delete)."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
