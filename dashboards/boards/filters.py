"""Filter variables and the label matchers that use them."""

from __future__ import annotations

import dataclasses
import re

from alerts.rules.promql import with_matcher
from dashboards.grafana import Dashboard, Row, Target, Variable

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


_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def for_clusters(d: Dashboard, label: str) -> Dashboard:
    """The dashboard with a cluster variable first and every query and filter limited to it.

    Where series carry no cluster label (one cluster) the variable offers only All, which matches
    the empty label, so queries return what they did without it.
    """
    matcher = f'{label}=~"$cluster"'

    def query(expr: str) -> str:
        return with_matcher(expr, matcher, label)

    def variable(v: Variable) -> Variable:
        m = _LABEL_VALUES.match(v.query)
        if m is None:
            raise ValueError(f"{d.uid}: variable {v.name} is not label_values(selector, label)")
        return dataclasses.replace(v, query=f"label_values({query(m['selector'])}, {m['label']})")

    rows = tuple(
        Row(
            r.title,
            tuple(
                dataclasses.replace(
                    p, targets=tuple(Target(query(t.expr), t.legend, t.instant) for t in p.targets)
                )
                for p in r.panels
            ),
        )
        for r in d.rows
    )
    cluster = Variable("cluster", "Cluster", f"label_values(up, {label})")
    annotations = tuple(dataclasses.replace(a, expr=query(a.expr)) for a in d.annotations)
    return dataclasses.replace(
        d, rows=rows, variables=(cluster, *(variable(v) for v in d.variables)), annotations=annotations
    )
