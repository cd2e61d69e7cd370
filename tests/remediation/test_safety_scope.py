"""in_scope, rule by rule: the reason each kind of target is out of scope, asked directly.

test_scope.py drives the same rules through the engine, with node labels from a fake source.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from remediation.model import Target
from remediation.safety import in_scope
from remediation.settings import ScopeSettings

_PROD = ScopeSettings(namespaces=("prod",))
_NONE = ScopeSettings()
_ALL = ScopeSettings(namespaces=("*",))
_EMPTY = (
    "the namespace scope is empty, which allows no workload (--scope.namespaces='*' allows every namespace)"
)
_NODES_OFF = "node actions are off (--scope.nodes=false): nothing cordons a node or evicts its pods"
_POOL = ScopeSettings(node_selector="nodepool=inference")
_INFERENCE = {"nodepool": "inference"}
_GPU = Target("gpu", "n", uuid="G")


@pytest.mark.parametrize(
    ("scope", "target", "labels", "node_labels", "why"),
    [
        # the namespace comes from the target, else from the alert's labels (a GPU alert may name one)
        (_PROD, _GPU, {"namespace": "dev"}, None, "namespace 'dev' is not in the allowlist ['prod']"),
        (_PROD, Target("pod", "n", "prod", "p"), {"namespace": "dev"}, None, ""),
        (_PROD, _GPU, {}, None, ""),
        (
            _PROD,
            Target("pod", "n", "", "p"),
            {},
            None,
            "pod target without a namespace while a namespace allowlist is configured",
        ),
        # an empty scope allows no workload; "*" allows every one, even one that names no namespace
        (_NONE, Target("pod", "n", "prod-payments", "p"), {}, None, f"namespace 'prod-payments': {_EMPTY}"),
        (_NONE, Target("job", "n", "train"), {}, None, f"namespace 'train': {_EMPTY}"),
        (_NONE, Target("pod", "n", "", "p"), {}, None, f"pod target: {_EMPTY}"),
        (_NONE, _GPU, {}, None, ""),
        (_NONE, Target("node", "n"), {}, None, ""),
        (_NONE, _GPU, {"namespace": "dev"}, None, f"namespace 'dev': {_EMPTY}"),
        (ScopeSettings(routing_namespaces=("gpupulse",)), _GPU, {"namespace": "gpupulse"}, None, ""),
        (
            ScopeSettings(routing_namespaces=("gpupulse",)),
            Target("pod", "n", "gpupulse", "p"),
            {},
            None,
            f"namespace 'gpupulse': {_EMPTY}",
        ),
        (_ALL, Target("pod", "n", "prod-payments", "p"), {}, None, ""),
        (_ALL, Target("pod", "n", "", "p"), {}, None, ""),
        (_ALL, _GPU, {"namespace": "dev"}, None, ""),
        # a node selector needs the node, and the node's labels, of GPU and node targets
        (
            _POOL,
            Target("gpu", "", uuid="G"),
            {},
            _INFERENCE,
            "gpu target without a node while a node selector is configured",
        ),
        (
            _POOL,
            Target("node", "n"),
            {},
            None,
            "node 'n' is unknown: node selector 'nodepool=inference' cannot hold",
        ),
        (
            _POOL,
            Target("node", "n"),
            {},
            {"nodepool": "cpu"},
            "node 'n' does not match the node selector 'nodepool=inference'",
        ),
        (_POOL, _GPU, {}, _INFERENCE, ""),
        (replace(_POOL, namespaces=("ns",)), Target("pod", "", "ns", "p"), {}, None, ""),
        (_POOL, Target("exporter", ""), {}, None, ""),
        # node actions off: no GPU or node target acts, whatever else allows it; workloads still may
        (ScopeSettings(nodes=False, namespaces=("*",)), _GPU, {}, None, f"gpu target: {_NODES_OFF}"),
        (ScopeSettings(nodes=False), Target("node", "n"), {}, None, f"node target: {_NODES_OFF}"),
        (ScopeSettings(nodes=False, namespaces=("prod",)), Target("pod", "n", "prod", "p"), {}, None, ""),
    ],
)
def test_in_scope_names_the_rule_a_target_breaks(
    scope: ScopeSettings,
    target: Target,
    labels: dict[str, str],
    node_labels: dict[str, str] | None,
    why: str,
) -> None:
    assert in_scope(scope, target, labels, {}, node_labels) == why


@pytest.mark.parametrize(
    ("labels", "annotations", "opted_in"),
    [
        ({"remediate": "true"}, {}, True),
        ({"remediate": "True"}, {}, True),
        ({}, {"remediate": "TRUE"}, True),  # a pod annotation surfaced on the alert counts too
        ({"remediate": "false"}, {"remediate": "true"}, False),  # the label wins over the annotation
        ({"remediate": "yes"}, {}, False),
        ({"remediate": "1"}, {}, False),
        ({"remediate": "truex"}, {}, False),
        ({}, {}, False),
    ],
)
def test_only_true_opts_a_target_in(
    labels: dict[str, str], annotations: dict[str, str], opted_in: bool
) -> None:
    why = in_scope(
        ScopeSettings(namespaces=("ns",), opt_in_label="remediate"),
        Target("pod", "n", "ns", "p"),
        labels,
        annotations,
    )
    assert why == ("" if opted_in else 'target has not opted in (remediate="true" missing)')


def test_star_stands_alone_in_a_namespace_scope() -> None:
    with pytest.raises(ValueError, match="stands alone"):
        ScopeSettings(namespaces=("*", "prod")).validate()
    ScopeSettings(namespaces=("*",)).validate()
    ScopeSettings().validate()
