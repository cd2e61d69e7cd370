"""Cluster mode in the chart: incidents as custom resources, replicas apart, no volume, minimal RBAC."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helm.installs import Installed

CRDS = (
    Path(__file__).resolve().parents[2]
    / "helm"
    / "gpupulse"
    / "files"
    / "crds"
    / "remediation.gpupulse.io.yaml"
)


def _cluster(installs: dict[str, Installed]) -> Installed:
    return installs["cluster-values.yaml"]


def test_cluster_mode_spreads_replicas_and_keeps_no_volume(installs: dict[str, Installed]) -> None:
    inst = _cluster(installs)
    deploy = (
        inst.one("Deployment")
        if len(inst.of_kind("Deployment")) == 1
        else next(d for d in inst.of_kind("Deployment") if "controller" in d["metadata"]["name"])
    )
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
