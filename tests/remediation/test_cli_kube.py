"""`serve --backend kubernetes`: kube.* flags and their Downward-API defaults, and a real process that
restarts a ReplicaSet pod through the fake API server (standalone, as its own process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from bench.proofs.harness import TOKEN, FakeKube, Serve, alert, notification, post, wait_until
from remediation.cli import build_parser, settings_from_flags
from remediation.errors import ConfigError, LeadershipLost
from remediation.kube.serve import serve_kubernetes
from remediation.settings import Settings
from tests.fakes.kube_api import FakeKubeAPI

NO_AUTH = ["--insecure-no-auth", "--backend=kubernetes"]


def _settings(argv: list[str], env: dict[str, str]) -> Settings:
    return settings_from_flags(build_parser().parse_args(["serve", *argv]), env)


def test_kube_flags_default_to_the_pod_environment(tmp_path: Path) -> None:
    in_pod = _settings(
        NO_AUTH,
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAMESPACE": "gpupulse", "POD_NAME": "ctl-7f9c-x2"},
    )
    # in a pod: no kubeconfig path means the service account
    assert (in_pod.kube.kubeconfig_path, in_pod.kube.namespace, in_pod.kube.identity) == (
        "",
        "gpupulse",
        "ctl-7f9c-x2",
    )
    assert in_pod.kube.leader_election is False
    outside = _settings([*NO_AUTH, "--kube.namespace=ops"], {"KUBECONFIG": f"{tmp_path}/a:{tmp_path}/b"})
    assert outside.kube.kubeconfig_path == f"{tmp_path}/a"
    assert outside.kube.identity == socket.gethostname()
    flags = _settings(
        [
            *NO_AUTH,
            "--kube.namespace=ops",
            "--kube.identity=r1",
            "--kube.leader-election",
            "--kube.lease-duration=30s",
            "--kube.renew-deadline=20s",
            "--kube.retry-period=4s",
        ],
        {"POD_NAMESPACE": "ignored"},
    )
    assert flags.kube.namespace == "ops" and flags.kube.identity == "r1"
    assert (flags.kube.lease_duration_seconds, flags.kube.renew_deadline_seconds) == (30, 20.0)
    assert flags.kube.leader_election is True


def test_kube_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"kube\.namespace"):
        _settings(NO_AUTH, {})
    with pytest.raises(ConfigError, match="renew-deadline"):
        _settings([*NO_AUTH, "--kube.namespace=g", "--kube.leader-election", "--kube.renew-deadline=20s"], {})
    with pytest.raises(ConfigError, match="whole seconds"):
        _settings([*NO_AUTH, "--kube.namespace=g", "--kube.lease-duration=2500ms"], {})
    # the local backend does not need any of it
    assert _settings(["--insecure-no-auth"], {}).kube.namespace == ""


@pytest.mark.integration
def test_serve_with_the_kubernetes_backend_restarts_a_replicaset_pod(tmp_path: Path) -> None:
    seed = {
        "nodes": [{"name": "gpu-1"}],
        "deployments": [{"namespace": "serving", "name": "llm"}],
        "replicasets": [{"namespace": "serving", "name": "llm-7d9f", "deployment": "llm"}],
        "pods": [
            {
                "namespace": "serving",
                "name": "llm-7d9f-abcde",
                "node": "gpu-1",
                "owner": ["ReplicaSet", "llm-7d9f"],
                "gpus": 1,
            }
        ],
    }
    api = FakeKube(tmp_path, seed)
    api.start()
    serve = Serve(
        tmp_path,
        [
            f"--storage.path={tmp_path / 'state'}",
            "--backend=kubernetes",
            f"--kube.kubeconfig={api.kubeconfig}",
            "--kube.namespace=gpupulse",
            "--kube.identity=ctl-0",
            "--engine.tick-interval=100ms",
            "--scope.namespaces=serving",
        ],
    )
    try:
        uid = api.state()["pods"]["serving/llm-7d9f-abcde"]["metadata"]["uid"]
        serve.start()
        leak = alert(
            "1eak000000000001",
            {
                "alertname": "GPUProcessMemoryAboveHardLimit",
                "fault_class": "memory_leak",
                "target_kind": "pod",
                "namespace": "serving",
                "pod": "llm-7d9f-abcde",
                "node": "gpu-1",
            },
        )
        assert post(serve.url, notification([leak])) == 200
        wait_until(lambda: "serving/llm-7d9f-abcde" not in api.state()["pods"], 20, "the pod to be deleted")
        assert serve.stop() == 0
        deletes = [r for r in api.requests() if r["method"] == "DELETE"]
        assert [(r["path"], r["body"]) for r in deletes] == [
            ("/api/v1/namespaces/serving/pods/llm-7d9f-abcde", {"preconditions": {"uid": uid}})
        ]
        # restart never touches nodes, evictions or the Deployment
        assert not [r for r in api.requests() if r["method"] == "PATCH" or r["path"].endswith("/eviction")]
        assert json.loads(json.dumps(api.state()["deleted"])) == [["serving/llm-7d9f-abcde", uid, "delete"]]
    finally:
        serve.kill()
        api.stop()


def _leader_gauge(serve: Serve) -> float:
    with urllib.request.urlopen(serve.url + "/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return float(next(line.split()[1] for line in lines if line.startswith("gpupulse_remediation_leader ")))


def _stats(serve: Serve) -> dict[str, object]:
    req = urllib.request.Request(serve.url + "/api/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return dict(json.loads(r.read()))


@pytest.mark.integration
def test_with_leader_election_only_the_leader_acts_on_what_the_follower_accepted(tmp_path: Path) -> None:
    seed = {
        "nodes": [{"name": "gpu-1"}],
        "pods": [
            {
                "namespace": "ml",
                "name": "worker-0",
                "node": "gpu-1",
                "owner": ["StatefulSet", "worker"],
                "gpus": 1,
            }
        ],
    }
    api = FakeKube(tmp_path, seed)
    api.start()
    common = [
        f"--storage.path={tmp_path / 'state'}",
        "--backend=kubernetes",
        f"--kube.kubeconfig={api.kubeconfig}",
        "--kube.namespace=gpupulse",
        "--kube.leader-election",
        "--kube.lease-duration=3s",
        "--kube.renew-deadline=2s",
        "--kube.retry-period=500ms",
        "--engine.tick-interval=100ms",
        "--scope.namespaces=ml",
    ]
    leader = Serve(tmp_path, [*common, "--kube.identity=a"], name="a")
    follower = Serve(tmp_path, [*common, "--kube.identity=b"], name="b")
    try:
        leader.start()
        follower.start(wait_ready=False)
        assert not follower.ready()  # a Service sends webhooks to the leader only
        leak = alert(
            "1eak0000000000f1",
            {
                "alertname": "GPUProcessMemoryAboveHardLimit",
                "fault_class": "memory_leak",
                "target_kind": "pod",
                "namespace": "ml",
                "pod": "worker-0",
                "node": "gpu-1",
            },
        )
        # reached directly, the follower still accepts durably into the shared inbox; the leader acts
        assert post(follower.url, notification([leak])) == 200
        wait_until(lambda: "ml/worker-0" not in api.state()["pods"], 20, "the leader to restart the pod")
        assert len([r for r in api.requests() if r["method"] == "DELETE"]) == 1
        lease = api.state()["leases"]["gpupulse/gpupulse-remediation-leader"]["spec"]
        assert lease["holderIdentity"] == "a"
        assert (_stats(leader)["leader"], _stats(follower)["leader"]) == (True, False)
        assert _stats(leader)["replica"] == "a"
        assert (_leader_gauge(leader), _leader_gauge(follower)) == (1.0, 0.0)
        # a clean stop releases the Lease, so the follower takes over on its next try, not a lease later
        assert leader.stop() == 0
        wait_until(follower.ready, 3, "the follower to lead after the release")
        assert follower.stop() == 0
    finally:
        leader.kill()
        follower.kill()
        api.stop()


async def test_a_leader_that_cannot_renew_stops_and_exits_to_restart_as_a_follower(tmp_path: Path) -> None:
    api = FakeKubeAPI()
    await api.start()
    renewed = asyncio.Event()
    lease_path = "/leases/gpupulse-remediation-leader"
    api.before.append(
        lambda method, path: renewed.set() if method == "PUT" and path.endswith(lease_path) else None
    )
    settings = _settings(
        [
            *NO_AUTH,
            "--web.listen-address=127.0.0.1:0",
            f"--storage.path={tmp_path / 'state'}",
            f"--kube.kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}",
            "--kube.namespace=gpupulse",
            "--kube.identity=a",
            "--kube.leader-election",
            "--kube.lease-duration=2s",
            "--kube.renew-deadline=1200ms",
            "--kube.retry-period=200ms",
        ],
        {},
    )
    task = asyncio.create_task(serve_kubernetes(settings))
    try:
        await asyncio.wait_for(renewed.wait(), 10)  # leading and renewing
        assert (tmp_path / "state" / "gpupulse.db").exists()  # the leader opened the ledger
        api.fail("PUT", lease_path + "$", 500, "InternalError", times=1000)
        failing_since = time.monotonic()
        with pytest.raises(LeadershipLost, match="lost leadership"):
            await asyncio.wait_for(task, 10)
        # it stepped down at the renew deadline, before a follower could take the Lease (2 s)
        assert 1.0 < time.monotonic() - failing_since < 2.0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeadershipLost):
            await task
        await api.stop()


def test_the_incident_status_interval_is_a_duration_flag_defaulting_to_two_seconds() -> None:
    env = {"POD_NAMESPACE": "gpupulse", "POD_NAME": "ctl-0"}
    assert _settings(NO_AUTH, env).kube.incident_status_interval_seconds == 2.0
    flag = "--kube.incident-status-interval=500ms"
    assert _settings([*NO_AUTH, flag], env).kube.incident_status_interval_seconds == 0.5
