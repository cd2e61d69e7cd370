"""API Priority and Fairness on a real kube-apiserver squeezing the controller, with the server's own
audit log as the witness (not the controller's account): a FlowSchema puts the controller's user and a
noisy neighbour on a PriorityLevelConfiguration of one seat that rejects instead of queuing, so the
server answers the controller 429 with the wait only in the Retry-After header. The controller (serve,
with leader election, restarted when it exits as a kubelet would) must ask for the same object again no
sooner than that Retry-After, count no refused delete as an action, and leave no node locked."""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from bench.proofs.harness import TOKEN, Serve, notification, post
from tests.kube.realapi import (
    JSON,
    ControlPlane,
    ControlPlaneError,
    KubeHTTPError,
    Kubelet,
    RealKube,
    add_node,
    ensure_namespace,
    env_missing_reason,
    service_account_token,
    wait_for,
    write_kubeconfig,
)
from tests.kube.test_real_apiserver import POOL_LABEL, deployment, leak_alert, running, serve_args

pytestmark = [pytest.mark.real_apiserver, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

CONTROLLER_USER, CONTROLLER_TOKEN = "gpupulse-controller", "gpupulse-apf-controller-token"
NOISE_USER, NOISE_TOKEN = "gpupulse-noise", "gpupulse-apf-noise-token"
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
SQUEEZE = "gpupulse-squeeze"
# the chart (ci/cluster-values.yaml) rendered as release FS_RELEASE in FS_NS, for its FlowSchema
FS_NS, FS_RELEASE = "apf-chart", "pulse"
# the controller's requests only, metadata only, one event per request
AUDIT_POLICY: JSON = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [CONTROLLER_USER]}, {"level": "None"}],
}
NODES = ("apf-a", "apf-b", "apf-c", "apf-d")  # the last one's alert comes in the second storm
# APF doubles Retry-After (1, 2, 4, ...) each time drops go on for as long as the current value: a burst
# this short keeps it at 4 s or less, under the leader's renew deadline
NOISE_SECONDS = 5.0


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own (its audit log records only what this test sent)."""
    reason = env_missing_reason()
    if reason is not None:
        pytest.fail(reason)
    users = {CONTROLLER_TOKEN: CONTROLLER_USER, NOISE_TOKEN: NOISE_USER}
    started = ControlPlane(tmp_path_factory.mktemp("apf-plane"), audit_policy=AUDIT_POLICY, users=users)
    try:
        started.start()
    except BaseException as e:
        logs = started.logs()
        started.stop()
        raise ControlPlaneError(f"the control plane did not start: {e}\n{logs}") from None
    kubelet = Kubelet(started.client())
    kubelet.start()
    try:
        yield started
    finally:
        kubelet.stop()
        started.stop()


EVERYTHING: JSON = {
    "verbs": ["*"],
    "apiGroups": ["*"],
    "resources": ["*"],
    "namespaces": ["*"],
    "clusterScope": True,
}
POD_DELETES: JSON = {"verbs": ["delete"], "apiGroups": [""], "resources": ["pods"], "namespaces": ["*"]}


def squeeze(kube: RealKube, rule: JSON) -> None:
    """One seat (nominalConcurrencyShares 1 of ~246, no borrowing) for the controller's and the noise's
    requests that `rule` matches, rejecting what does not fit; matchingPrecedence 50 comes before every
    suggested FlowSchema but exempt."""
    if kube.exists(f"{FLOWCONTROL}/prioritylevelconfigurations/{SQUEEZE}"):
        kube.delete(f"{FLOWCONTROL}/flowschemas/{SQUEEZE}")
        wait_for(lambda: not kube.exists(f"{FLOWCONTROL}/flowschemas/{SQUEEZE}"), 30, "the old FlowSchema")
        _flowschema(kube, rule)
        return
    kube.post(
        f"{FLOWCONTROL}/prioritylevelconfigurations",
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration",
            "metadata": {"name": SQUEEZE},
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": 1,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {"type": "Reject"},
                },
            },
        },
    )
    _flowschema(kube, rule)


def _flowschema(kube: RealKube, rule: JSON) -> None:
    users = [{"kind": "User", "user": {"name": name}} for name in (CONTROLLER_USER, NOISE_USER)]
    kube.post(
        f"{FLOWCONTROL}/flowschemas",
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": SQUEEZE},
            "spec": {
                "priorityLevelConfiguration": {"name": SQUEEZE},
                "matchingPrecedence": 50,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{"subjects": users, "resourceRules": [rule]}],
            },
        },
    )

    def in_force() -> bool:
        status = kube.get(f"{FLOWCONTROL}/flowschemas/{SQUEEZE}").get("status") or {}
        return any(
            c.get("type") == "Dangling" and c.get("status") == "False" for c in status.get("conditions") or []
        )

    wait_for(in_force, 30, "the FlowSchema to find its priority level")


def unsqueeze(kube: RealKube) -> None:
    for kind in ("flowschemas", "prioritylevelconfigurations"):
        with contextlib.suppress(KubeHTTPError):
            kube.delete(f"{FLOWCONTROL}/{kind}/{SQUEEZE}")


class Noise:
    """A neighbour in the same priority level listing pods from many threads, so the level's one seat
    is taken most of the time; it keeps the Retry-After of every 429 it gets (the header is not in the
    audit log, and APF sends the same value to every request it rejects on a level in one second)."""

    def __init__(
        self, plane: ControlPlane, method: str = "GET", path: str = "/api/v1/pods", threads: int = 12
    ) -> None:
        self._kube = RealKube(plane.url, plane.ca_file, NOISE_TOKEN)
        self._method, self._path = method, path
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        self.retry_after: list[tuple[float, int]] = []  # (when received, Retry-After seconds)
        self.answers: collections.Counter[int] = collections.Counter()

    def __enter__(self) -> Noise:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {NOISE_TOKEN}"}
        while not self._stop.is_set():
            req = urllib.request.Request(self._kube.url + self._path, headers=headers, method=self._method)
            try:
                with self._kube._opener.open(req, timeout=10) as r:
                    r.read()
                    self.answers[int(r.status)] += 1
            except urllib.error.HTTPError as e:
                e.read()
                self.answers[e.code] += 1
                if e.code == 429:
                    self.retry_after.append((time.time(), int(e.headers.get("Retry-After") or 0)))
            except OSError:
                self.answers[0] += 1


def sent_at(retry_after: list[tuple[float, int]], when: float) -> int:
    """The least Retry-After the server sent on the level within half a second of `when` (1, the
    server's least value, when the noise saw no 429 then)."""
    near = [seconds for t, seconds in retry_after if abs(t - when) <= 0.5]
    return min(near) if near else 1


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _object(event: JSON) -> str | None:
    """Which object a request was about, or None for a create of an unnamed object (a new Event: the
    next create is another object); a list or watch is about its URI."""
    ref = event.get("objectRef") or {}
    if ref.get("name"):
        return "/".join(str(ref.get(k, "")) for k in ("resource", "namespace", "name", "subresource"))
    if event["verb"] == "create":
        return None
    return f"{event['verb']} {event['requestURI']}"


def _ledger(serve: Serve, incident_id: int) -> list[JSON]:
    req = urllib.request.Request(
        f"{serve.url}/api/v1/incidents/{incident_id}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return list(json.loads(r.read())["history"])


def _incidents(serve: Serve) -> list[JSON]:
    req = urllib.request.Request(
        serve.url + "/api/v1/incidents", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return list(json.loads(r.read())["incidents"])


def test_a_throttled_controller_waits_the_retry_after_counts_no_refusal_and_leaves_no_lock(
    plane: ControlPlane, tmp_path: Path
) -> None:
    kube = plane.client()
    kube.post(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpupulse-apf-test"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}
                for name in (CONTROLLER_USER, NOISE_USER)
            ],
        },
    )
    ensure_namespace(kube, "gpupulse")
    ensure_namespace(kube, "llm")
    for node in NODES:  # one single-replica Deployment per node: a restart and a node lock each
        add_node(kube, node, labels={POOL_LABEL: node})
        kube.apply(deployment("llm", f"vllm-{node}", 1, pool=node))
    wait_for(lambda: all(running(kube, "llm", f"vllm-{n}") for n in NODES), 60, "a pod on every node")
    before = {n: running(kube, "llm", f"vllm-{n}")[0] for n in NODES}
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", plane.url, plane.ca_file, CONTROLLER_TOKEN)
    serve = Serve(tmp_path, serve_args(tmp_path / "state", kubeconfig, "--kube.leader-election"))
    alerts = [
        leak_alert(f"a9f{i:013x}", "llm", pod["metadata"]["name"], node)
        for i, (node, pod) in enumerate(before.items())
    ]
    exits = 0

    def keep_up() -> None:
        nonlocal exits
        if serve.proc is not None and serve.proc.poll() is not None:
            exits += 1  # leadership lost under throttling: restarted as a kubelet would
            serve.start()

    def replaced() -> bool:
        uids = {n: {p["metadata"]["uid"] for p in running(kube, "llm", f"vllm-{n}")} for n in NODES}
        return all(uids[n] and before[n]["metadata"]["uid"] not in uids[n] for n in NODES)

    def refused_deletes() -> int:
        return sum(
            e["verb"] == "delete"
            and e["responseStatus"]["code"] == 429
            and e["user"]["username"] == CONTROLLER_USER
            for e in plane.audit_events()
        )

    retry_after: list[tuple[float, int]] = []
    answers: collections.Counter[int] = collections.Counter()
    try:
        serve.start()
        # 1. everything the controller sends is squeezed: reads, Leases (the leader's too), deletes
        squeeze(kube, EVERYTHING)
        with Noise(plane) as noise:
            assert post(serve.url, notification(alerts[:-1])) == 200
            time.sleep(NOISE_SECONDS)  # the storm itself: its length is the scenario, not a wait
        retry_after += noise.retry_after
        answers += noise.answers
        # 2. only pod deletes are squeezed (the noise deletes a pod that does not exist), until the
        # server has refused one of the controller's: a restart refused at its one write
        squeeze(kube, POD_DELETES)
        keep_up()
        with Noise(plane, "DELETE", "/api/v1/namespaces/llm/pods/no-such-pod") as noise:
            assert post(serve.url, notification(alerts)) == 200
            # whether APF rejects one of the controller's few deletes is the server's draw (in about one
            # run in three it seats them all): wait for one, and where none came, the checks below hold
            # over what did happen (the fake API server's tests refuse deletes on purpose)
            with contextlib.suppress(ControlPlaneError):
                wait_for(lambda: refused_deletes() > 0, 40, "a pod delete of the controller refused")
        retry_after += noise.retry_after
        answers += noise.answers
        unsqueeze(kube)
        deadline = time.monotonic() + 150
        while not replaced():
            assert time.monotonic() < deadline, f"pods not all restarted: {serve.log_tail()}"
            keep_up()
            time.sleep(0.2)
        ledgers = {int(i["id"]): _ledger(serve, int(i["id"])) for i in _incidents(serve)}
        assert serve.stop() == 0
    finally:
        unsqueeze(kube)
        serve.kill()

    events = [
        e
        for e in plane.audit_events()
        if e["user"]["username"] == CONTROLLER_USER and e["stage"] == "ResponseComplete"
    ]
    throttled = [e for e in events if e["responseStatus"]["code"] == 429]
    by_what = collections.Counter(
        f"{e['verb']} {(e.get('objectRef') or {}).get('resource', '')}" for e in throttled
    )
    sent = collections.Counter(seconds for _, seconds in retry_after)
    print(
        f"\naudit: {len(events)} controller requests, {len(throttled)} answered 429 {dict(by_what)}; "
        f"noise {dict(answers)}, Retry-After sent {dict(sent)}; serve exits {exits}"
    )
    assert throttled, f"the server never throttled the controller (noise: {dict(answers)})"

    # 1. after each 429, the same object is asked for again no sooner than the server's Retry-After
    gaps = []
    for e in throttled:
        what = _object(e)
        if what is None:
            continue
        refused_at = _at(e["stageTimestamp"])
        later = [x for x in events if _object(x) == what and _at(x["requestReceivedTimestamp"]) > refused_at]
        if not later:
            continue
        gap = _at(later[0]["requestReceivedTimestamp"]) - refused_at
        wanted = sent_at(retry_after, refused_at)
        gaps.append((what, round(gap, 2), wanted))
        assert gap >= wanted - 0.01, f"{what} asked again {gap:.2f} s after a 429 with Retry-After {wanted}"
    print(f"gaps after a 429 (object, seconds, Retry-After): {gaps}")

    # 2. a refused pod delete is no action: each pod deleted once (200), each 429 a "refused" entry
    deletes = [e for e in events if e["verb"] == "delete" and e["objectRef"]["resource"] == "pods"]
    for node, pod in before.items():
        name = pod["metadata"]["name"]
        mine = [e for e in deletes if e["objectRef"]["name"] == name]
        assert [e["responseStatus"]["code"] for e in mine if e["responseStatus"]["code"] != 429] == [200]
        (history,) = [h for h in ledgers.values() if any(name in str(e.get("summary", "")) for e in h)]
        restarts = [e["status"] for e in history if e.get("kind") == "action" and e.get("rung") == "restart"]
        assert restarts.count("success") == 1, restarts
        assert restarts.count("refused") >= sum(e["responseStatus"]["code"] == 429 for e in mine), restarts
        assert not [e for e in history if e.get("rung") == "migrate"], f"{node}: escalated to a migrate"
    assert not [e for e in events if e["verb"] == "patch" and e["objectRef"]["resource"] == "nodes"]
    assert not [e for e in events if (e.get("objectRef") or {}).get("subresource") == "eviction"]

    # 3. every node lock released in the end
    for node in NODES:
        lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/gpupulse/leases/gpupulse-node-{node}")
        assert not lease["spec"].get("holderIdentity"), lease["spec"]


def _classified_as(kube: RealKube, method: str, path: str, body: JSON | None = None) -> tuple[str, str]:
    """The (FlowSchema UID, PriorityLevelConfiguration UID) APF put one request in: the server sends
    both on every response it classified (X-Kubernetes-PF-*-UID), allowed or not."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {kube.token}", "Content-Type": "application/json"}
    req = urllib.request.Request(kube.url + path, data=data, method=method, headers=headers)
    try:
        with kube._opener.open(req, timeout=30) as r:
            r.read()
            got = r.headers
    except urllib.error.HTTPError as e:
        e.read()
        got = e.headers
    return got.get("X-Kubernetes-PF-FlowSchema-UID", ""), got.get("X-Kubernetes-PF-PriorityLevel-UID", "")


def test_the_charts_flowschema_puts_the_controllers_lease_requests_on_leader_election(
    plane: ControlPlane,
) -> None:
    """Issue 36: the chart's FlowSchema (cluster mode) as the real server applies it. As the chart's
    ServiceAccount, the Lease requests a leader sends (get, create, update in the release namespace)
    are put by that FlowSchema on the built-in `leader-election` priority level; a Lease delete, a pod
    list and a Lease in another namespace are not (the server's own X-Kubernetes-PF-* answer headers:
    its audit events carry no APF annotation)."""
    import yaml

    from tests.helm.installs import CHART
    from tests.helm.render import render

    pytest.importorskip("helm_sdkpy")
    values = yaml.safe_load((CHART / "ci" / "cluster-values.yaml").read_text())
    docs = [d for d in yaml.safe_load_all(render(values, FS_NS, FS_RELEASE)) if d]
    kube = plane.client()
    ensure_namespace(kube, FS_NS)
    ensure_namespace(kube, "apf-elsewhere")
    (flowschema,) = [d for d in docs if d["kind"] == "FlowSchema"]
    sa = next(d for d in docs if d["kind"] == "ServiceAccount" and "controller" in d["metadata"]["name"])
    for obj in [sa, *(d for d in docs if d["kind"] in ("Role", "RoleBinding"))]:
        kube.apply(obj)
    created = kube.post(f"{FLOWCONTROL}/flowschemas", flowschema)
    name, fs_uid = created["metadata"]["name"], created["metadata"]["uid"]
    pl_uid = kube.get(f"{FLOWCONTROL}/prioritylevelconfigurations/leader-election")["metadata"]["uid"]

    def in_force() -> bool:
        status = kube.get(f"{FLOWCONTROL}/flowschemas/{name}").get("status") or {}
        return any(
            c.get("type") == "Dangling" and c.get("status") == "False" for c in status.get("conditions") or []
        )

    as_sa = RealKube(plane.url, plane.ca_file, service_account_token(kube, FS_NS, sa["metadata"]["name"]))
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{FS_NS}/leases"
    tries = iter(range(1000))
    seen: dict[str, tuple[str, str]] = {}

    def leader_requests() -> bool:
        """A leader's create, get and update of its Lease; true once all three are lifted (the server's
        classifier may take a moment to see the new schema)."""
        lease = f"fs-probe-{next(tries)}"
        body: JSON = {
            "metadata": {"name": lease},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        }
        seen["create"] = _classified_as(
            as_sa, "POST", leases, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **body}
        )
        seen["get"] = _classified_as(as_sa, "GET", f"{leases}/{lease}")
        got = as_sa.get(f"{leases}/{lease}")
        update = {**got, "spec": {**got["spec"], "holderIdentity": "b"}}
        seen["update"] = _classified_as(as_sa, "PUT", f"{leases}/{lease}", update)
        return all(seen[v] == (fs_uid, pl_uid) for v in ("create", "get", "update"))

    try:
        wait_for(in_force, 30, "the chart's FlowSchema to find the leader-election level")
        wait_for(leader_requests, 30, "a leader's Lease requests on leader-election")
        others = {
            "delete lease": _classified_as(as_sa, "DELETE", f"{leases}/fs-probe-0"),
            "list leases": _classified_as(as_sa, "GET", leases),
            "list pods": _classified_as(as_sa, "GET", f"/api/v1/namespaces/{FS_NS}/pods"),
            "lease elsewhere": _classified_as(
                as_sa, "GET", "/apis/coordination.k8s.io/v1/namespaces/apf-elsewhere/leases/x"
            ),
        }
        # each classified (a schema and a level named), none by the chart's schema or onto its level
        assert all(v == (fs_uid, pl_uid) for v in seen.values()), seen
        assert all(fs and pl and fs != fs_uid and pl != pl_uid for fs, pl in others.values()), others
    finally:
        with contextlib.suppress(KubeHTTPError):
            kube.delete(f"{FLOWCONTROL}/flowschemas/{name}")
