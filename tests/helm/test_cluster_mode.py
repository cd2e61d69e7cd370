"""Cluster mode in the chart: incidents as custom resources, replicas apart, no volume, minimal RBAC."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from tests.fakes.alertmanager_process import running_alertmanager
from tests.fakes.prom_operator import alertmanager_config
from tests.helm.installs import ROOT, Installed, install_values

RELEASE_NS = "gpupulse"

CRDS = Path(__file__).resolve().parents[2] / "helm" / "gpupulse" / "crds" / "remediation.gpupulse.io.yaml"


def _cluster(installs: dict[str, Installed]) -> Installed:
    return installs["cluster-values.yaml"]


def test_cluster_mode_spreads_replicas_and_keeps_no_volume(installs: dict[str, Installed]) -> None:
    inst = _cluster(installs)
    deploy = inst.one("StatefulSet")
    pod = deploy["spec"]["template"]["spec"]
    assert "podAntiAffinity" in pod["affinity"] and "podAffinity" not in pod["affinity"]
    assert inst.of_kind("PersistentVolumeClaim") == []
    storage = next(v for v in pod["volumes"] if v["name"] == "storage")
    assert "emptyDir" in storage
    args = pod["containers"][0]["args"]
    assert "--kube.ledger=kubernetes" in args and "--kube.leader-election" in args
    assert inst.of_kind("PodDisruptionBudget")


def test_cluster_mode_rbac_grants_only_what_the_store_uses(installs: dict[str, Installed]) -> None:
    (role,) = [
        r for r in _cluster(installs).of_kind("Role") if any("leases" in x["resources"] for x in r["rules"])
    ]
    rules = {
        tuple(r["resources"]): r["verbs"]
        for r in role["rules"]
        if r["apiGroups"] == ["remediation.gpupulse.io"]
    }
    assert rules == {
        ("gpuincidents", "gpuremediationstates"): ["get", "list", "create", "delete"],
        ("gpuincidents/status", "gpuremediationstates/status"): ["update"],
    }
    default = installs["ha-values.yaml"]
    assert not any(
        r["apiGroups"] == ["remediation.gpupulse.io"]
        for role in default.of_kind("Role")
        for r in role["rules"]
    )


def test_helm_installs_the_crds_before_the_chart(installs: dict[str, Installed]) -> None:
    for inst in installs.values():  # crds/ is installed whatever the values (helm install --skip-crds not)
        names = sorted(c["metadata"]["name"] for c in inst.api.crds())
        assert names == [
            "gpuincidents.remediation.gpupulse.io",
            "gpuremediationstates.remediation.gpupulse.io",
        ]
    docs = [d for d in yaml.safe_load_all(CRDS.read_text()) if d]
    installed = {c["metadata"]["name"]: c["spec"] for c in _cluster(installs).api.crds()}
    assert installed == {d["metadata"]["name"]: d["spec"] for d in docs}


def test_crd_prints_state_target_signature_rung_age_and_serves_status() -> None:
    docs = [d for d in yaml.safe_load_all(CRDS.read_text()) if d]
    incident = next(d for d in docs if d["spec"]["names"]["kind"] == "GpuIncident")
    (version,) = incident["spec"]["versions"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "State",
        "Target",
        "Signature",
        "Rung",
        "Age",
    ]
    assert version["subresources"] == {"status": {}}
    assert "schemaVersion" in version["schema"]["openAPIV3Schema"]["properties"]["spec"]["required"]


def _cluster_with_alertmanager(tmp_path: Path) -> Installed:
    values = yaml.safe_load((ROOT / "helm" / "gpupulse" / "ci" / "cluster-values.yaml").read_text())
    values["controller"]["alertmanagerConfig"] = {"enabled": True, "groupWait": "0s", "groupInterval": "1s"}
    return install_values(tmp_path, RELEASE_NS, values)


def test_alertmanager_gets_one_webhook_per_replica_naming_its_pod(tmp_path: Path) -> None:
    inst = _cluster_with_alertmanager(tmp_path)
    sts = inst.one("StatefulSet")
    service = next(s for s in inst.of_kind("Service") if s["metadata"]["name"] == sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (amc,) = inst.of_kind("AlertmanagerConfig")
    (receiver,) = amc["spec"]["receivers"]
    name, svc = sts["metadata"]["name"], service["metadata"]["name"]
    assert [h["url"] for h in receiver["webhookConfigs"]] == [
        f"http://{name}-{i}.{svc}.{RELEASE_NS}.svc:9836/api/v1/alerts" for i in range(2)
    ]


async def test_real_alertmanager_sends_every_alert_to_every_replica(tmp_path: Path) -> None:
    inst = await asyncio.to_thread(_cluster_with_alertmanager, tmp_path)
    received: dict[str, list[str]] = {"0": [], "1": []}
    arrived = asyncio.Event()

    async def sink(request: web.Request) -> web.Response:
        body = await request.json()
        received[request.match_info["replica"]].extend(a["labels"]["alertname"] for a in body["alerts"])
        if all(received.values()):
            arrived.set()
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/{replica}/api/v1/alerts", sink)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        configs = copy.deepcopy(inst.of_kind("AlertmanagerConfig"))
        for hook in configs[0]["spec"]["receivers"][0]["webhookConfigs"]:  # each pod's DNS name, locally
            replica = hook["url"].split(".", 1)[0].rsplit("-", 1)[1]
            hook["url"] = f"http://127.0.0.1:{port}/{replica}/api/v1/alerts"
        secrets = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in inst.of_kind("Secret")}
        base = yaml.safe_load(
            (ROOT / "tests" / "fixtures" / "kube-prometheus-stack" / "alertmanager-base.yaml").read_text()
        )
        async with running_alertmanager(alertmanager_config(base, configs, secrets)) as am:
            labels = {"alertname": "GPUFellOffBus", "fault_class": "gpu_lost", "severity": "critical",
                      "namespace": RELEASE_NS, "node": "gpu-1"}  # fmt: skip
            async with aiohttp.ClientSession() as session:
                resp = await session.post(f"{am.url}/api/v2/alerts", json=[{"labels": labels}])
                assert resp.status == 200
            await asyncio.wait_for(arrived.wait(), 30)
    finally:
        await runner.cleanup()
    assert received == {"0": ["GPUFellOffBus"], "1": ["GPUFellOffBus"]}


def test_cluster_mode_puts_only_the_controllers_lease_requests_on_the_leader_election_level(
    installs: dict[str, Installed],
) -> None:
    """Issue 36: APF throttling of the ServiceAccount must not delay a Lease renewal past the renew
    deadline, so its Lease requests (and nothing else) go where kube-controller-manager's do."""
    inst = _cluster(installs)
    (fs,) = inst.of_kind("FlowSchema")
    ns = inst.result["namespace"]
    assert fs["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    assert "namespace" not in fs["metadata"] and ns in fs["metadata"]["name"]
    spec = fs["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": "leader-election"}
    # before the suggested schemas a ServiceAccount would otherwise match
    assert 1 < spec["matchingPrecedence"] < 900
    (rule,) = spec["rules"]
    (sa,) = [o for o in inst.of_kind("ServiceAccount") if "controller" in o["metadata"]["name"]]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": sa["metadata"]["name"], "namespace": ns}}
    ]
    assert rule["resourceRules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
            "namespaces": [ns],
        }
    ]
    assert "nonResourceRules" not in rule and "clusterScope" not in rule["resourceRules"][0]
    # the verbs are exactly what the Role grants on Leases: nothing else the controller sends is lifted
    (role,) = [r for r in inst.of_kind("Role") if any("leases" in x["resources"] for x in r["rules"])]
    (leases,) = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert leases["verbs"] == rule["resourceRules"][0]["verbs"]
    # outside cluster mode (a volume ledger, bare metal) there is none
    for name in ("ha-values.yaml", "default-values.yaml", "bare-metal-values.yaml"):
        assert installs[name].of_kind("FlowSchema") == [], name


def test_the_flowschema_can_be_left_out_where_the_install_may_not_create_one(tmp_path: Path) -> None:
    values = yaml.safe_load((ROOT / "helm" / "gpupulse" / "ci" / "cluster-values.yaml").read_text())
    values = copy.deepcopy(values)
    values["controller"]["cluster"]["leaderElectionFlowSchema"] = {"enabled": False}
    inst = install_values(tmp_path, RELEASE_NS, values)
    assert inst.of_kind("FlowSchema") == [] and inst.of_kind("StatefulSet")
