"""The chart's exporter behind --web.config.file (TLS, basic auth) and a NetworkPolicy: what the pod
is given, what the probes speak, and that the defaults render what they rendered before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helm.installs import install_values


def _objects(tmp_path: Path, exporter: dict[str, Any]) -> list[dict[str, Any]]:
    return install_values(tmp_path, "gpupulse", {"exporter": exporter}).objects


def _container(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    [ds] = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return pod, container


def test_by_default_plain_http_and_no_policy(tmp_path: Path) -> None:
    objects = _objects(tmp_path, {})
    pod, container = _container(objects)
    assert not any(a.startswith("--web.config.file") for a in container["args"])
    assert "scheme" not in container["livenessProbe"]["httpGet"]
    assert "web-config" not in {v["name"] for v in pod["volumes"]}
    assert not [o for o in objects if o["kind"] == "NetworkPolicy" and "exporter" in o["metadata"]["name"]]


@pytest.mark.parametrize("tls", [True, False])
def test_a_web_config_secret_is_mounted_passed_and_probed_over_https(tmp_path: Path, tls: bool) -> None:
    web = {"webConfig": {"existingSecret": "exporter-web", "tls": tls}}
    pod, container = _container(_objects(tmp_path, web))
    assert "--web.config.file=/etc/gpupulse/web/web-config.yml" in container["args"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "web-config"]
    assert mount == {"name": "web-config", "mountPath": "/etc/gpupulse/web", "readOnly": True}
    [volume] = [v for v in pod["volumes"] if v["name"] == "web-config"]
    assert volume["secret"]["secretName"] == "exporter-web"
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        assert probe["httpGet"].get("scheme") == ("HTTPS" if tls else None)


def test_the_network_policy_lets_only_prometheus_reach_the_metrics_port(tmp_path: Path) -> None:
    objects = _objects(tmp_path, {"networkPolicy": {"enabled": True}, "port": 19842})
    [policy] = [o for o in objects if o["kind"] == "NetworkPolicy" and "exporter" in o["metadata"]["name"]]
    [ds] = [o for o in objects if o["kind"] == "DaemonSet"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 19842, "protocol": "TCP"}]
    assert rule["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
