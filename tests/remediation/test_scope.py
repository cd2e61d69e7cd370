"""Scope holds for every target kind: a namespace outside the allowlist never acts whatever the
target, GPU and node targets are scoped by a node selector on their Node's labels, and off-scope
alerts are ignored or paged as configured."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import cast

import pytest

from remediation.engine import RemediationEngine, build_engine
from remediation.errors import SelectorError
from remediation.metrics import RemediationMetrics
from remediation.selector import parse_selector
from remediation.settings import EngineSettings, ScopeSettings
from tests.remediation.test_engine_support import LEAK, SCOPE, XID_RESET, Rig, statuses

NODE_DOWN = {
    "alertname": "NodeGpuDrained",
    "severity": "critical",
    "fault_class": "gpu_hardware",
    "target_kind": "node",
    "node": "node-b",
}


class StaticNodeLabels:
    """NodeLabels from a dict; a node missing from it does not exist."""

    def __init__(self, nodes: Mapping[str, Mapping[str, str]], fail: bool = False) -> None:
        self.nodes = nodes
        self.fail = fail
        self.asked: list[str] = []

    async def labels(self, node: str) -> Mapping[str, str] | None:
        self.asked.append(node)
        if self.fail:
            raise ConnectionError("API server unreachable")
        return self.nodes.get(node)


async def _rig(tmp_path: Path, scope: ScopeSettings, nodes: StaticNodeLabels | None = None) -> Rig:
    rig = Rig(tmp_path, EngineSettings(scope=scope))
    if nodes is None:
        rig.build()
        return rig
    rig.engine = cast(
        RemediationEngine,
        build_engine(
            rig.settings, rig.db_path, rig.metrics, rig.clock, rig.backend, rig.pager, node_labels=nodes
        ),
    )
    return rig


@pytest.mark.parametrize("target", [XID_RESET, NODE_DOWN], ids=["gpu", "node"])
async def test_an_out_of_scope_namespace_never_acts_whatever_the_target(
    tmp_path: Path, target: dict[str, str]
) -> None:
    rig = await _rig(tmp_path, ScopeSettings(namespaces=("prod",)))
    try:
        await rig.fire({**target, "namespace": "research"})
        assert rig.backend.calls == []
        inc = rig.only_incident()
        assert (inc["state"], inc["resolution"]) == ("ignored", "out_of_scope")
        assert "'research' is not in the allowlist" in inc["reason"]
        await rig.fire({**target, "namespace": "prod", "node": "node-c", "uuid": "GPU-cccc"})
        assert rig.backend.rungs == ["migrate"]  # in scope: the same alert acts
    finally:
        await rig.engine.aclose()


async def test_gpu_and_node_targets_without_a_namespace_are_not_limited_by_the_allowlist(
    tmp_path: Path,
) -> None:
    rig = await _rig(tmp_path, ScopeSettings(namespaces=("prod",)))
    try:
        await rig.fire(XID_RESET)
        assert rig.backend.rungs == ["migrate"]
    finally:
        await rig.engine.aclose()


@pytest.mark.parametrize("target", [XID_RESET, NODE_DOWN], ids=["gpu", "node"])
async def test_the_routing_namespace_stamped_on_node_alerts_names_no_workload(
    tmp_path: Path, target: dict[str, str]
) -> None:
    # The chart stamps its own namespace on node, GPU and exporter alerts so that prometheus-operator's
    # OnNamespace matcher routes them to us; that namespace must not put them out of scope.
    scope = ScopeSettings(namespaces=("prod",), routing_namespaces=("gpupulse",))
    rig = await _rig(tmp_path, scope)
    try:
        await rig.fire({**target, "namespace": "gpupulse"})
        assert rig.backend.rungs == ["migrate"]
        # any other namespace on the same kind of alert is still out of scope
        await rig.fire({**target, "namespace": "research", "node": "node-c", "uuid": "GPU-cccc"})
        assert rig.backend.rungs == ["migrate"]
    finally:
        await rig.engine.aclose()


async def test_a_pod_in_the_routing_namespace_is_still_checked_against_the_allowlist(tmp_path: Path) -> None:
    scope = ScopeSettings(namespaces=("prod",), routing_namespaces=("gpupulse",))
    rig = await _rig(tmp_path, scope)
    try:
        await rig.fire({**LEAK, "namespace": "gpupulse"})
        assert rig.backend.calls == []
        assert rig.only_incident()["resolution"] == "out_of_scope"
    finally:
        await rig.engine.aclose()


@pytest.mark.parametrize("target", [XID_RESET, NODE_DOWN], ids=["gpu", "node"])
async def test_with_node_actions_off_gpu_and_node_targets_never_act(
    tmp_path: Path, target: dict[str, str]
) -> None:
    rig = await _rig(tmp_path, ScopeSettings(nodes=False))
    try:
        await rig.fire(target)
        assert rig.backend.calls == []
        inc = rig.only_incident()
        assert (inc["state"], inc["resolution"]) == ("ignored", "out_of_scope")
        assert inc["reason"].endswith("node actions are off (--scope.nodes=false): nothing cordons a "
                                      "node or evicts its pods")  # fmt: skip
    finally:
        await rig.engine.aclose()


async def test_with_node_actions_off_a_pod_ladder_skips_migrate_and_pages(tmp_path: Path) -> None:
    from remediation.errors import PermanentError

    rig = await _rig(tmp_path, ScopeSettings(namespaces=SCOPE.namespaces, nodes=False))
    try:
        rig.backend.errors["restart"] = [PermanentError("pod has no owner")]
        await rig.fire(LEAK)  # restart -> migrate -> page
        assert rig.backend.rungs == ["restart"]  # the restart is tried; the migrate never
        inc = rig.only_incident()
        assert inc["state"] == "paged"
        assert "node actions are off (--scope.nodes=false)" in rig.pager.firing[0].summary
        assert statuses(inc) == [("restart", "failed"), ("migrate", "skipped"), ("page", "success")]
    finally:
        await rig.engine.aclose()


async def test_a_node_selector_scopes_gpu_and_node_targets_by_node_labels(tmp_path: Path) -> None:
    nodes = StaticNodeLabels(
        {
            "node-b": {"nodepool": "training"},
            "node-c": {"nodepool": "inference"},
            "node-d": {"nodepool": "inference", "gpupulse.io/no-remediation": "true"},
        }
    )
    scope = ScopeSettings(
        namespaces=SCOPE.namespaces, node_selector="nodepool=inference,!gpupulse.io/no-remediation"
    )
    rig = await _rig(tmp_path, scope, nodes)
    try:
        await rig.fire(XID_RESET)  # node-b: training pool
        await rig.fire({**NODE_DOWN, "node": "node-d"})  # opted out
        await rig.fire({**XID_RESET, "node": "node-x", "uuid": "GPU-x"})  # no such node
        assert rig.backend.calls == []
        reasons = sorted(i["reason"] for i in rig.incidents())
        assert [r.split(":")[0] for r in reasons] == [
            "node 'node-b' does not match the node selector 'nodepool=inference,!gpupulse.io/no-remediation'",
            "node 'node-d' does not match the node selector 'nodepool=inference,!gpupulse.io/no-remediation'",
            "node 'node-x' is unknown",
        ]
        await rig.fire({**XID_RESET, "node": "node-c", "uuid": "GPU-c"})
        assert [(r, t.node) for r, t in rig.backend.calls] == [("migrate", "node-c")]
        # pod targets are scoped by namespace, not by the node they run on
        await rig.fire(LEAK)
        assert rig.backend.rungs == ["migrate", "restart"]
        assert "node-a" not in nodes.asked
    finally:
        await rig.engine.aclose()


async def test_off_scope_alerts_can_page_instead_of_being_ignored(tmp_path: Path) -> None:
    nodes = StaticNodeLabels({"node-b": {"nodepool": "training"}})
    rig = await _rig(
        tmp_path, ScopeSettings(node_selector="nodepool in (inference)", off_scope="page"), nodes
    )
    try:
        ev = await rig.fire(XID_RESET)
        assert rig.backend.calls == []
        inc = rig.only_incident()
        assert inc["state"] == "paged"
        assert "out of scope, not acted on" in rig.pager.firing[0].summary
        await rig.resolve(ev)
        assert rig.only_incident()["resolution"] == "human"
    finally:
        await rig.engine.aclose()


async def test_unreadable_node_labels_fail_the_alert_so_it_is_retried(tmp_path: Path) -> None:
    nodes = StaticNodeLabels({}, fail=True)
    rig = await _rig(tmp_path, ScopeSettings(node_selector="nodepool=inference"), nodes)
    try:
        with pytest.raises(ConnectionError):
            await rig.fire(XID_RESET)
        assert rig.incidents() == []  # not judged out of scope on a failed read: the worker retries
        nodes.fail = False
        nodes.nodes = {"node-b": {"nodepool": "inference"}}
        await rig.fire(XID_RESET)
        assert rig.backend.rungs == ["migrate"]
    finally:
        await rig.engine.aclose()


def test_a_node_selector_without_a_node_label_source_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only the Kubernetes backend"):
        build_engine(
            EngineSettings(scope=ScopeSettings(node_selector="a=b"), backend="none"),
            tmp_path / "db",
            RemediationMetrics(),
        )


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {}, True),
        ("pool=gpu", {"pool": "gpu"}, True),
        ("pool==gpu", {"pool": "cpu"}, False),
        ("pool!=gpu", {}, True),  # != also matches nodes without the label (Kubernetes semantics)
        ("pool!=gpu", {"pool": "gpu"}, False),
        ("pool", {"pool": ""}, True),
        ("!pool", {"pool": "x"}, False),
        ("!pool", {}, True),
        ("zone in (a, b)", {"zone": "b"}, True),
        ("zone in (a,b)", {}, False),
        ("zone notin (a,b)", {}, True),
        ("zone notin (a,b)", {"zone": "a"}, False),
        ("example.com/pool=gpu, zone in (a)", {"example.com/pool": "gpu", "zone": "a"}, True),
        ("example.com/pool=gpu, zone in (a)", {"example.com/pool": "gpu", "zone": "c"}, False),
        ("pool=", {"pool": ""}, True),
    ],
)
def test_label_selectors_match_like_the_api_server(
    selector: str, labels: dict[str, str], matches: bool
) -> None:
    assert parse_selector(selector).matches(labels) is matches


@pytest.mark.parametrize(
    "bad", ["pool=a=b", "zone in a,b", "zone in (a", "a)", "=x", "pool in ()", "a,,b", "p@ol"]
)
def test_malformed_selectors_are_refused(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(bad)
