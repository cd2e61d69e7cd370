"""The namespace scope as the chart renders it: `[]` acts on no workload and grants no workload verb,
a list grants them by a Role in each listed namespace, `["*"]` in the ClusterRole; the controller's
flag and the AlertmanagerConfigs follow the same value (docs/rbac.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.fakes.helm_api import FakeHelmAPI
from tests.helm.installs import JSON, Installed, install, install_values
from tests.helm.test_install import controller_rbac_from_docs

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("helm_sdkpy") is None, reason="helm-sdkpy is not installed"
)

NAMESPACE = "gpupulse"
SCOPES = {"none": [], "listed": ["inference", "training"], "every": ["*"]}
# migrate's grants: what lets a GPU or node alert cordon a node and evict every pod on it
NODE_ACTIONS = {("", "pods/eviction", "create"), ("", "nodes", "patch")}
# what may change a workload: a restart's delete, a gang restart's Job delete or Volcano Command,
# a rollout restart's patch
MUTATING = {
    ("", "pods", "delete"),
    ("batch", "jobs", "delete"),
    ("bus.volcano.sh", "commands", "create"),
    ("apps", "deployments", "patch"),
}


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Installed]:
    """The chart installed once per scope, routing on and rollout restarts granted."""
    out = {}
    for name, namespaces in SCOPES.items():
        values: JSON = {
            "controller": {
                "scope": {"namespaces": namespaces},
                "rbac": {"rolloutRestart": True},
                "alertmanagerConfig": {"enabled": True},
            }
        }
        out[name] = install_values(tmp_path_factory.mktemp(name), NAMESPACE, values)
    nowhere: JSON = {"controller": {"scope": {"namespaces": [], "nodes": False}}}
    out["nowhere"] = install_values(tmp_path_factory.mktemp("nowhere"), NAMESPACE, nowhere)
    return out


def _grants(rules: list[JSON]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _cluster_role(inst: Installed) -> JSON:
    (role,) = [r for r in inst.of_kind("ClusterRole") if r["metadata"]["name"].endswith("-controller")]
    return role


def _workload_roles(inst: Installed) -> dict[str, JSON]:
    return {
        r["metadata"]["namespace"]: r
        for r in inst.of_kind("Role")
        if r["metadata"]["name"].endswith("-controller-workloads")
    }


def _scope_args(inst: Installed) -> list[str]:
    (deployment,) = inst.of_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [a for a in container["args"] if a.startswith(("--scope.namespaces", "--scope.nodes"))]


def test_an_empty_scope_grants_no_workload_verb_and_passes_no_flag(scoped: dict[str, Installed]) -> None:
    inst = scoped["none"]
    cluster = _grants(_cluster_role(inst)["rules"])
    assert cluster & MUTATING == set()
    assert _workload_roles(inst) == {}
    # migrate (cordon, then evict every pod on the node) stays cluster-wide: node targets still act
    assert NODE_ACTIONS | {("", "pods", "list")} <= cluster
    assert _scope_args(inst) == []  # the binary's own default, empty, is "no namespace"


def test_no_node_actions_and_no_namespace_grant_nothing_that_changes_anything(
    scoped: dict[str, Installed],
) -> None:
    inst = scoped["nowhere"]
    cluster = _grants(_cluster_role(inst)["rules"])
    assert cluster & (MUTATING | NODE_ACTIONS) == set()
    assert {v for g, r, v in cluster} == {"get", "list", "create"}
    # what is still created is an Event: it changes nothing else
    assert {(g, r) for g, r, v in cluster if v == "create"} == {("events.k8s.io", "events")}
    assert ("", "nodes", "get") in cluster  # the node selector reads Nodes
    assert _workload_roles(inst) == {}
    assert _scope_args(inst) == ["--scope.nodes=false"]


def test_a_namespace_list_with_node_actions_off_keeps_its_workload_roles(tmp_path: Path) -> None:
    values: JSON = {"controller": {"scope": {"namespaces": ["inference"], "nodes": False}}}
    inst = install_values(tmp_path, NAMESPACE, values)
    assert _grants(_cluster_role(inst)["rules"]) & NODE_ACTIONS == set()
    assert sorted(_workload_roles(inst)) == ["inference"]
    assert _scope_args(inst) == ["--scope.namespaces=inference", "--scope.nodes=false"]


def test_a_listed_scope_grants_workload_verbs_only_in_its_namespaces(scoped: dict[str, Installed]) -> None:
    inst = scoped["listed"]
    assert _grants(_cluster_role(inst)["rules"]) & MUTATING == set()
    roles = _workload_roles(inst)
    assert sorted(roles) == ["inference", "training"]
    _, workloads, _ = controller_rbac_from_docs(inst.values)
    for namespace, role in roles.items():
        assert _grants(role["rules"]) == MUTATING
        assert role["rules"] == workloads
        binding = inst.named("RoleBinding", role["metadata"]["name"], namespace)
        assert binding is not None
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        (subject,) = binding["subjects"]
        assert (subject["kind"], subject["namespace"]) == ("ServiceAccount", NAMESPACE)
    assert _scope_args(inst) == ["--scope.namespaces=inference,training"]
    # pod alerts of the listed namespaces are routed there (OnNamespace)
    amc = sorted(c["metadata"]["namespace"] for c in inst.of_kind("AlertmanagerConfig"))
    assert amc == sorted([NAMESPACE, "inference", "training"])


def test_a_star_scope_grants_workload_verbs_cluster_wide(scoped: dict[str, Installed]) -> None:
    inst = scoped["every"]
    assert MUTATING <= _grants(_cluster_role(inst)["rules"])
    assert _workload_roles(inst) == {}
    assert _scope_args(inst) == ["--scope.namespaces=*"]
    # "*" names no namespace an AlertmanagerConfig (or its Secret copy) could be created in
    assert [c["metadata"]["namespace"] for c in inst.of_kind("AlertmanagerConfig")] == [NAMESPACE]
    assert not [o for o in inst.objects if o["metadata"].get("namespace") == "*"]


@pytest.mark.parametrize("namespaces", [["*", "inference"], ["Not_A_Namespace"], ["a", "a"]])
async def test_a_scope_that_cannot_mean_one_thing_fails_the_schema(
    tmp_path: Path, namespaces: list[str]
) -> None:
    import helm_sdkpy

    api = FakeHelmAPI(namespaces={"bad"})
    with pytest.raises(helm_sdkpy.InstallError) as failure:
        await install(api, tmp_path, "bad", {"controller": {"scope": {"namespaces": namespaces}}})
    assert "scope/namespaces" in str(failure.value)
    assert api.chart_objects() == []


@pytest.mark.parametrize(
    ("scope", "says"),
    [
        ("none", "It may restart no pod or job (controller.scope.namespaces is empty)"),
        ("listed", "It may restart pods and jobs in inference, training only."),
        ("every", "It may restart pods and jobs in every namespace."),
        ("none", "GPU and node alerts migrate: cordon and taint the node and evict every pod on it, of any "
         "namespace (an empty namespace scope does not stop that); controller.scope.nodes=false stops it."),
        ("listed", "GPU and node alerts migrate: cordon and taint the node and evict every pod on it, of any "
         "namespace; controller.scope.nodes=false stops it."),
        ("nowhere", "It acts on no node (controller.scope.nodes is false): nothing cordons a node or evicts "
         "its pods, so it acts nowhere: it records and pages."),
    ],
)  # fmt: skip
def test_the_notes_say_where_the_controller_may_restart(
    scoped: dict[str, Installed], scope: str, says: str
) -> None:
    assert says in scoped[scope].result["info"]["notes"]


def test_the_notes_show_the_kill_switch_with_the_pods_token_and_port(scoped: dict[str, Installed]) -> None:
    notes = scoped["none"].result["info"]["notes"]
    (line,) = [ln.strip() for ln in notes.splitlines() if "gpupulse-remediation pause" in ln]
    assert line.startswith(f"kubectl -n {NAMESPACE} exec deploy/pulse-gpupulse-controller -- ")
    assert "--url http://127.0.0.1:9836 --auth.token-file=/etc/gpupulse/token/token" in line
    (deployment,) = scoped["none"].of_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--auth.token-file=/etc/gpupulse/token/token" in container["args"]  # the same file
    assert "status | resume | breaker reset" in notes


def test_device_quarantine_is_granted_whatever_the_scope_and_only_its_verbs(
    scoped: dict[str, Installed],
) -> None:
    # a GPU target is quarantined whatever the namespace scope, like a node is cordoned: the same grants,
    # and gone with them when node actions are off
    wanted = {
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceclaims", "list"),
        *{("resource.k8s.io", "devicetaintrules", v) for v in ("create", "get", "patch", "delete")},
    }
    for name, inst in scoped.items():
        granted = {g for g in _grants(_cluster_role(inst)["rules"]) if g[0] == "resource.k8s.io"}
        # controller.scope.nodes false: no migrate, so no device quarantine either
        assert granted == (set() if name == "nowhere" else wanted)
        for role in _workload_roles(inst).values():
            assert not [r for r in role["rules"] if "resource.k8s.io" in r["apiGroups"]]
