"""Filter variables and the label matchers that use them."""

from __future__ import annotations

from dashboards.grafana import Variable

NODE = 'node=~"$node"'
NAMESPACE = 'namespace=~"$namespace"'
POD = 'pod=~"$pod"'
WORKLOAD = f"{NAMESPACE}, {POD}"

UIDS = {
    "fleet": "gpupulse-fleet",
    "node": "gpupulse-node",
    "serving": "gpupulse-serving",
    "remediation": "gpupulse-remediation",
}


def gpu_filters() -> tuple[Variable, ...]:
    """node, namespace and pod, from the series every GPU node has."""
    return (
        Variable("node", "Node", "label_values(gpu_info, node)"),
        Variable("namespace", "Namespace", "label_values(gpu_allocation_info, namespace)"),
        Variable("pod", "Pod", 'label_values(gpu_allocation_info{namespace=~"$namespace"}, pod)'),
    )


def serving_filters() -> tuple[Variable, ...]:
    """node, namespace, pod and model, from the inference engines."""
    return (
        Variable("node", "Node", "label_values(inference_engine_up, node)"),
        Variable("namespace", "Namespace", "label_values(inference_engine_up, namespace)"),
        Variable("pod", "Pod", 'label_values(inference_engine_up{namespace=~"$namespace"}, pod)'),
        Variable("model", "Model", 'label_values(inference_engine_up{namespace=~"$namespace"}, model)'),
    )
