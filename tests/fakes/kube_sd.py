"""The targets Prometheus' Kubernetes service discovery (role endpoints) makes of an Endpoints object,
its Service and the pods its addresses point at, as file_sd target groups.

Debian's Prometheus 2.42 is built without Kubernetes discovery, so the tests feed a real Prometheus
these targets through file_sd and let it run the operator's relabelings on them. The meta labels are
those of Prometheus' discovery/kubernetes (endpoints.go buildEndpoints, pod.go podLabels,
service.go serviceLabels): group labels, then each address's, then its pod's and container port's.
Not modelled: the extra targets Prometheus makes for a pod's container ports that no endpoint port
covers (the chart's pods have one port), node metadata (attach_metadata), EndpointSlices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

JSON = dict[str, Any]
META = "__meta_kubernetes_"


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _object_labels(prefix: str, meta: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in (meta.get("labels") or {}).items():
        out[f"{META}{prefix}_label_{_sanitize(key)}"] = str(value)
        out[f"{META}{prefix}_labelpresent_{_sanitize(key)}"] = "true"
    for key, value in (meta.get("annotations") or {}).items():
        out[f"{META}{prefix}_annotation_{_sanitize(key)}"] = str(value)
        out[f"{META}{prefix}_annotationpresent_{_sanitize(key)}"] = "true"
    return out


def _pod_ready(pod: Mapping[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("status", "unknown")).lower()
    return "unknown"


def _pod_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    meta, status = pod["metadata"], pod.get("status") or {}
    out = {
        f"{META}pod_name": meta["name"],
        f"{META}pod_ip": status.get("podIP", ""),
        f"{META}pod_ready": _pod_ready(pod),
        f"{META}pod_phase": status.get("phase", ""),
        f"{META}pod_node_name": pod["spec"].get("nodeName", ""),
        f"{META}pod_host_ip": status.get("hostIP", ""),
        f"{META}pod_uid": meta.get("uid", ""),
    }
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner is not None:
        out[f"{META}pod_controller_kind"] = owner["kind"]
        out[f"{META}pod_controller_name"] = owner["name"]
    out.update(_object_labels("pod", meta))
    return out


def endpoints_targets(
    endpoints: Mapping[str, Any], service: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> list[JSON]:
    """file_sd target groups (one per target, labels merged) for one Endpoints object."""
    meta = endpoints["metadata"]
    group = {f"{META}namespace": meta["namespace"], f"{META}endpoints_name": meta["name"]}
    if service is not None:
        group[f"{META}service_name"] = service["metadata"]["name"]
        group.update(_object_labels("service", service["metadata"]))
    for key, value in (meta.get("labels") or {}).items():
        group[f"{META}endpoints_label_{_sanitize(key)}"] = str(value)
        group[f"{META}endpoints_labelpresent_{_sanitize(key)}"] = "true"
    by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    targets: list[JSON] = []
    for subset in endpoints.get("subsets") or []:
        for port in subset.get("ports") or []:
            for ready, addresses in (
                ("true", subset.get("addresses")),
                ("false", subset.get("notReadyAddresses")),
            ):
                for address in addresses or []:
                    labels = {
                        "__address__": f"{address['ip']}:{port['port']}",
                        f"{META}endpoint_port_name": port.get("name", ""),
                        f"{META}endpoint_port_protocol": port.get("protocol", ""),
                        f"{META}endpoint_ready": ready,
                    }
                    ref = address.get("targetRef")
                    if ref is not None:
                        labels[f"{META}endpoint_address_target_kind"] = ref["kind"]
                        labels[f"{META}endpoint_address_target_name"] = ref["name"]
                    if address.get("nodeName"):
                        labels[f"{META}endpoint_node_name"] = address["nodeName"]
                    pod = (
                        by_name.get((ref.get("namespace", ""), ref["name"]))
                        if ref and ref["kind"] == "Pod"
                        else None
                    )
                    if pod is not None:
                        labels.update(_pod_labels(pod))
                        for container in pod["spec"].get("containers") or []:
                            match = next(
                                (
                                    c
                                    for c in container.get("ports") or []
                                    if c.get("containerPort") == port["port"]
                                ),
                                None,
                            )
                            if match is not None:
                                labels[f"{META}pod_container_name"] = container["name"]
                                labels[f"{META}pod_container_port_name"] = match.get("name", "")
                                labels[f"{META}pod_container_port_number"] = str(port["port"])
                                labels[f"{META}pod_container_port_protocol"] = port.get("protocol", "")
                                break
                    targets.append({"targets": [labels.pop("__address__")], "labels": {**group, **labels}})
    return targets
