"""The controller started with the arguments the chart renders, as its own process against the fake API
server: with the default (empty) scope a posted pod alert restarts nothing; with `["*"]` the same alert
restarts the pod. Only `controller.dryRun=false` is changed from the chart's defaults (dry-run would
hide the difference)."""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bench.proofs.harness import TOKEN, FakeKube, Serve, alert, notification, post, wait_until
from tests.helm.installs import Installed, install_values

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("helm_sdkpy") is None, reason="helm-sdkpy is not installed"),
]

NAMESPACE = "gpupulse"
POD = "prod-payments/ledger-7d9f-abcde"
SEED = {
    "nodes": [{"name": "gpu-1"}],
    "deployments": [{"namespace": "prod-payments", "name": "ledger"}],
    "replicasets": [{"namespace": "prod-payments", "name": "ledger-7d9f", "deployment": "ledger"}],
    "pods": [
        {
            "namespace": "prod-payments",
            "name": "ledger-7d9f-abcde",
            "node": "gpu-1",
            "owner": ["ReplicaSet", "ledger-7d9f"],
            "gpus": 1,
        }
    ],
}
LEAK = alert(
    "1eak000000000001",
    {
        "alertname": "GPUProcessMemoryAboveHardLimit",
        "severity": "critical",
        "layer": "serving",
        "fault_class": "memory_leak",
        "target_kind": "pod",
        "namespace": "prod-payments",
        "pod": "ledger-7d9f-abcde",
        "node": "gpu-1",
    },
)


def _rendered_args(inst: Installed) -> list[str]:
    (deployment,) = inst.of_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gpupulse-remediation", "serve"]
    return list(container["args"])


def _local(args: list[str], tmp: Path, api: FakeKube) -> list[str]:
    """The rendered args with the pod's paths made local: the token file, the storage volume, and
    what the pod gets from its service account and Downward API (kubeconfig, namespace, name)."""
    token = tmp / "token"
    token.write_text(TOKEN)
    out = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag == "--web.listen-address":
            continue  # Serve listens on a free 127.0.0.1 port
        if flag == "--auth.token-file":
            arg = f"--auth.token-file={token}"
        elif flag == "--storage.path":
            arg = f"--storage.path={tmp / 'state'}"
        out.append(arg)
    return [
        *out,
        f"--kube.kubeconfig={api.kubeconfig}",
        f"--kube.namespace={NAMESPACE}",
        "--kube.identity=ctl-0",
    ]


def _incidents(serve: Serve) -> list[dict[str, Any]]:
    req = urllib.request.Request(
        serve.url + "/api/v1/incidents", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return list(json.loads(r.read())["incidents"])


def _run(tmp: Path, scope: list[str]) -> tuple[list[str], list[dict[str, Any]], FakeKube, Serve]:
    """Install with this scope, start serve with the rendered args, post the leak; wait for its verdict."""
    values = {"controller": {"dryRun": False, "scope": {"namespaces": scope}}}
    args = _rendered_args(install_values(tmp / "helm", NAMESPACE, values))
    api = FakeKube(tmp, SEED)
    api.start()
    serve = Serve(tmp, _local(args, tmp, api))
    serve.start()
    assert post(serve.url, notification([LEAK])) == 200
    wait_until(lambda: any(i["state"] != "open" for i in _incidents(serve)), 30, "the incident's verdict")
    return args, _incidents(serve), api, serve


def test_the_chart_default_scope_restarts_no_pod_from_a_posted_alert(tmp_path: Path) -> None:
    (tmp_path / "helm").mkdir()
    args, incidents, api, serve = _run(tmp_path, [])
    try:
        assert not [a for a in args if a.startswith("--scope.namespaces")]
        (incident,) = incidents
        assert (incident["state"], incident["resolution"]) == ("ignored", "out_of_scope")
        assert "namespace scope is empty" in incident["reason"]
        assert POD in api.state()["pods"]
        assert not [r for r in api.requests() if r["method"] in ("DELETE", "POST", "PATCH")]
    finally:
        serve.kill()
        api.stop()


def test_a_star_scope_restarts_the_pod_from_the_same_alert(tmp_path: Path) -> None:
    (tmp_path / "helm").mkdir()
    args, _, api, serve = _run(tmp_path, ["*"])
    try:
        assert "--scope.namespaces=*" in args
        wait_until(lambda: POD not in api.state()["pods"], 30, "the pod to be deleted")
        deletes = [r["path"] for r in api.requests() if r["method"] == "DELETE"]
        assert deletes == ["/api/v1/namespaces/prod-payments/pods/ledger-7d9f-abcde"]
    finally:
        serve.kill()
        api.stop()
