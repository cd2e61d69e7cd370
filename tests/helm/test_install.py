"""`helm install` of the real chart with the real Helm library into an in-process API server.

Each ci/ values file is installed into its own fake cluster (tests/fakes/helm_api.py); the tests
assert on the objects Helm actually POSTed, i.e. the rendered manifests after Helm's own schema
validation, ordering and release bookkeeping — more than lint, less than a real cluster.
"""

from __future__ import annotations

import base64
import functools
import gzip
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.helm_api import RELEASE_SECRET_TYPE, FakeHelmAPI
from tests.helm.installs import CHART, JSON, RELEASE, ROOT, Installed, install, watches_pods

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("helm_sdkpy") is None, reason="helm-sdkpy is not installed"
)


def _container(workload: JSON) -> JSON:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: JSON = containers[0]
    return container


@functools.cache
def _help_flags(*command: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", *command, "--help"], capture_output=True, text=True, check=True, timeout=60
    )
    return set(re.findall(r"--[a-z][\w.-]*", out.stdout))


def _flag_names(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args}


# --- the release as a whole


def test_install_creates_every_manifest_object_and_records_the_release(inst: Installed) -> None:
    assert inst.result["info"]["status"] == "deployed"
    manifest = [d for d in yaml.safe_load_all(inst.result["manifest"]) if d]
    want = sorted((d["kind"], d["metadata"]["name"]) for d in manifest)
    have = sorted((o["kind"], o["metadata"]["name"]) for o in inst.objects)
    assert have == want
    # Helm's release record: a Secret labelled owner=helm, updated to deployed after the objects
    (record,) = inst.api.release_records()
    assert record["type"] == RELEASE_SECRET_TYPE
    assert record["metadata"]["labels"]["owner"] == "helm"
    assert record["metadata"]["labels"]["status"] == "deployed"
    release = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(record["data"]["release"]))))
    assert release["name"] == RELEASE and release["info"]["status"] == "deployed"


def _extra_manifests(inst: Installed) -> set[str]:
    """Names of the user's extraManifests objects (theirs, not labelled by the chart)."""
    names = set()
    for entry in inst.values["extraManifests"]:
        text = entry if isinstance(entry, str) else yaml.safe_dump(entry)
        names |= set(re.findall(r"^  name: (\S+)", text.replace("{{ .Release.Name }}", RELEASE), re.M))
    return names


def test_every_object_carries_the_identity_labels(inst: Installed) -> None:
    extra = _extra_manifests(inst)
    for obj in (o for o in inst.objects if o["metadata"]["name"] not in extra):
        labels = obj["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/name") == "gpupulse", obj["metadata"]["name"]
        assert labels.get("app.kubernetes.io/instance") == RELEASE, obj["metadata"]["name"]


def _selectors(node: Any) -> Iterator[JSON]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("selector", "podSelector", "matchLabels") and isinstance(value, dict):
                yield value
            yield from _selectors(value)
    elif isinstance(node, list):
        for item in node:
            yield from _selectors(item)


def test_no_selector_uses_the_chart_version_label(inst: Installed) -> None:
    # helm.sh/chart changes with every chart version; in an immutable selector it breaks upgrades
    found = [s for o in inst.objects for s in _selectors(o)]
    assert found, "no selectors found at all"
    assert not [s for s in found if "helm.sh/chart" in json.dumps(s)]


def test_services_select_their_workloads_pods(inst: Installed) -> None:
    for service in inst.of_kind("Service"):
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        workload = inst.one("DaemonSet") if component == "exporter" else _controller(inst)
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        port_names = {p["name"] for p in _container(workload)["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


def test_references_resolve_to_created_objects(inst: Installed) -> None:
    """ServiceAccounts, PVCs, Secrets and RBAC names a pod or binding uses are in the release
    (except Secrets the values say exist already)."""
    external = {
        inst.values["controller"]["auth"]["existingSecret"],
        inst.values["controller"]["pager"]["existingSecret"],
    }
    names = {(o["kind"], o["metadata"]["name"]) for o in inst.objects}
    for kind in ("DaemonSet", "Deployment", "StatefulSet"):
        for workload in inst.of_kind(kind):
            spec = workload["spec"]["template"]["spec"]
            assert ("ServiceAccount", spec["serviceAccountName"]) in names
            for volume in spec["volumes"]:
                if "persistentVolumeClaim" in volume:
                    assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
                if "secret" in volume and volume["secret"]["secretName"] not in external:
                    assert ("Secret", volume["secret"]["secretName"]) in names
    for binding in inst.of_kind("ClusterRoleBinding") + inst.of_kind("RoleBinding"):
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in names
        for subject in binding["subjects"]:
            assert ("ServiceAccount", subject["name"]) in names
            assert subject["namespace"] == inst.result["namespace"]


# --- the exporter DaemonSet


def _exporter(inst: Installed) -> JSON:
    if not inst.values["exporter"]["enabled"]:
        assert inst.of_kind("DaemonSet") == []
        pytest.skip("exporter disabled in this values file")
    return inst.one("DaemonSet")


def test_exporter_args_are_accepted_by_the_exporter(inst: Installed) -> None:
    args = _container(_exporter(inst))["args"]
    unknown = _flag_names(args) - _help_flags("exporter.cli")
    assert unknown == set()
    # and the real parser takes them, values included (durations, choices)
    from exporter import cli, registry
    from gpupulse.durations import parse_flag_duration

    off = cli.switched_off(args, {})
    parser = cli.build_parser(
        registry.available_plugins(skip=off), cli._otlp_module(), also_collectors=sorted(off)
    )
    settings = cli.settings_from_args(parser.parse_args(args))
    assert settings.listen_port == inst.values["exporter"]["port"]
    sampling_interval = parse_flag_duration(inst.values["exporter"]["samplingInterval"])
    assert settings.sampling_interval_seconds == sampling_interval
    if "--engines.discover-pods" in args:  # the exporter finds its node's pods by $NODE_NAME
        assert _pod_environment(inst, _container(_exporter(inst)))["NODE_NAME"] == "gpu-1"
    for name in inst.values["exporter"]["disabledCollectors"]:
        assert f"--no-collector.{name}" in args


def test_the_privilege_table_names_everything_the_exporter_pod_is_given(inst: Installed) -> None:
    """The chart README's privilege table lists every mount, capability, host namespace and API
    resource the DaemonSet is given (extra volumes of the values file are the user's own)."""
    readme = (CHART / "README.md").read_text()
    table = readme[readme.index("Privileges the exporter asks for") : readme.index("## Upgrading")]
    ds = _exporter(inst)
    pod, container = ds["spec"]["template"]["spec"], _container(ds)
    extra = {m["name"] for m in inst.values["exporter"].get("extraVolumeMounts") or []}
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in extra:
            assert f"`{mount['mountPath']}`" in table, mount
    for capability in container.get("securityContext", {}).get("capabilities", {}).get("add", []):
        assert f"`{capability}`" in table, capability
    if pod.get("hostPID"):
        assert "`hostPID: true`" in table
    if pod.get("securityContext", {}).get("runAsUser") == 0:
        assert "`runAsUser: 0`" in table
    for role in inst.of_kind("ClusterRole"):
        if role["metadata"]["name"].endswith("-exporter"):
            for rule in role["rules"]:
                for resource in rule["resources"]:
                    assert f"| `{resource}` `{'`, `'.join(rule['verbs'])}`" in table, rule
    if pod.get("automountServiceAccountToken"):
        assert "ServiceAccount token" in table
    # pod LIST/WATCH asks for this node's pods only, and the table says what RBAC cannot limit
    assert "fieldSelector=spec.nodeName=<node>" in table and "RBAC alone cannot" in table


def test_exporter_pod_is_placed_and_confined(inst: Installed) -> None:
    ds = _exporter(inst)
    pod = ds["spec"]["template"]["spec"]
    values = inst.values["exporter"]
    assert pod["hostPID"] is values["hostPID"]
    assert pod.get("runtimeClassName", "") == values["runtimeClassName"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in terms[0][
        "matchExpressions"
    ]
    container = _container(ds)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert sorted(security["capabilities"]["add"]) == ["DAC_READ_SEARCH", "SYS_PTRACE"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]


def test_pod_resources_socket_is_mounted_read_only(inst: Installed) -> None:
    ds = _exporter(inst)
    container = _container(ds)
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    socket_flags = [a for a in container["args"] if a.startswith("--attribution.kubelet-socket=")]
    if not inst.values["exporter"]["podResources"]["enabled"]:
        assert "pod-resources" not in volumes and socket_flags == []
        return
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    mount = mounts["pod-resources"]
    assert mount["readOnly"] is True
    (flag,) = socket_flags
    assert flag.split("=", 1)[1].startswith(mount["mountPath"] + "/")
    # every host path is mounted read-only; only the emptyDir /tmp is writable
    for name, volume in volumes.items():
        if "hostPath" in volume:
            assert mounts[name]["readOnly"] is True, name


# --- the remediation controller


def _controller(inst: Installed) -> JSON:
    if not inst.values["controller"]["enabled"]:
        assert inst.of_kind("Deployment") == []
        pytest.skip("controller disabled in this values file")
    return inst.one("StatefulSet" if inst.values["controller"]["cluster"]["enabled"] else "Deployment")


POD_NAME = "pulse-gpupulse-controller-7d9f8-abcde"


def _pod_environment(inst: Installed, container: JSON) -> dict[str, str]:
    """The container's environment as the kubelet would set it (Downward API fields filled in)."""
    fields = {
        "metadata.namespace": inst.result["namespace"],
        "metadata.name": POD_NAME,
        "spec.nodeName": "gpu-1",
    }
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var["valueFrom"]:
            env[var["name"]] = "from-secret"
        else:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def _mount_secrets(inst: Installed, workload: JSON, root: Path) -> list[str]:
    """Write the Secret volumes under `root` as the kubelet would mount them; return args rewritten to
    those paths. Secrets the values say exist already get placeholder contents."""
    pod = workload["spec"]["template"]["spec"]
    container = _container(workload)
    volumes = {v["name"]: v for v in pod["volumes"]}
    args: list[str] = list(container["args"])
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "secret" not in volume:
            continue
        assert mount["readOnly"] is True
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        created = inst.named("Secret", volume["secret"]["secretName"])
        if created is not None:
            files = {k: base64.b64decode(v).decode() for k, v in created["data"].items()}
        else:
            files = {"token": "existing-token", "routingKey": "existing-routing-key"}
        for key, value in files.items():
            (target / key).write_text(value)
        args = [a.replace(f"={mount['mountPath']}/", f"={target}/") for a in args]
    return args


def test_controller_starts_with_the_rendered_args_env_and_secrets(inst: Installed, tmp_path: Path) -> None:
    """The real flag parser and settings validation accept the pod as rendered: flags, values,
    Downward-API environment, and the files its Secret volumes provide."""
    deployment = _controller(inst)
    container = _container(deployment)
    assert container["command"] == ["gpupulse-remediation", "serve"]
    unknown = _flag_names(container["args"]) - _help_flags("remediation", "serve")
    assert unknown == set()
    from gpupulse.durations import parse_flag_duration
    from remediation import cli

    args = _mount_secrets(inst, deployment, tmp_path)
    settings = cli.settings_from_flags(
        cli.build_parser().parse_args(["serve", *args]), _pod_environment(inst, container)
    )
    values = inst.values["controller"]
    assert settings.listen_port == values["port"]
    assert settings.engine.backend == values["backend"]
    assert settings.engine.dry_run is values["dryRun"]
    assert settings.engine.pager.kind == values["pager"]["kind"]
    assert settings.kube.leader_election is (values["replicas"] > 1)
    # the hardening settings reach the controller from values (durations in the values' grammar)
    engine = settings.engine
    assert engine.scope.node_selector == values["scope"]["nodeSelector"]
    assert engine.scope.off_scope == values["scope"]["offScope"]
    # node alerts stamped with the release namespace for routing stay in scope (docs/helm.md)
    stamped = inst.values["prometheusRule"]["namespaceNodeAlerts"]
    assert engine.scope.routing_namespaces == ((inst.result["namespace"],) if stamped else ())
    assert engine.budgets.max_pages_per_window == values["safety"]["maxPagesPerWindow"]
    assert engine.budgets.page_window_seconds == parse_flag_duration(values["safety"]["pageWindow"])
    assert engine.external_url == values["externalUrl"]
    # the Prometheus it verifies against and diagnoses from (docs/design/diagnosis.md)
    assert engine.prometheus_url == values["prometheus"]["url"]
    assert engine.diagnosis.enabled is values["diagnosis"]["enabled"]
    assert engine.diagnosis.wait_seconds == parse_flag_duration(values["diagnosis"]["wait"])
    assert engine.diagnosis.deadline_seconds == parse_flag_duration(values["diagnosis"]["deadline"])
    assert engine.diagnosis.lookback_seconds == parse_flag_duration(values["diagnosis"]["lookback"])
    assert engine.diagnosis.step_seconds == parse_flag_duration(values["diagnosis"]["step"])
    assert engine.diagnosis.dashboard_url == values["diagnosis"]["dashboardUrl"]
    assert engine.max_event_age_seconds == parse_flag_duration(values["maxEventAge"])
    assert settings.web_read_header_timeout_seconds == parse_flag_duration(values["readHeaderTimeout"])
    assert settings.web_read_body_timeout_seconds == parse_flag_duration(values["readBodyTimeout"])
    assert settings.storage_on_corrupt == values["persistence"]["onCorrupt"]
    if values["backend"] == "kubernetes":
        assert (settings.kube.namespace, settings.kube.identity) == (inst.result["namespace"], POD_NAME)
    token_secret = inst.named("Secret", f"{RELEASE}-gpupulse-controller-token")
    if token_secret is not None:
        assert settings.auth_token == base64.b64decode(token_secret["data"]["token"]).decode()
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(settings.storage_path) in mounts


def test_leader_election_exactly_when_replicated(inst: Installed) -> None:
    deployment = _controller(inst)
    replicas = inst.values["controller"]["replicas"]
    assert deployment["spec"]["replicas"] == replicas
    assert ("--kube.leader-election" in _container(deployment)["args"]) is (replicas > 1)


def test_replicas_sharing_one_ledger_are_placed_on_one_node(inst: Installed) -> None:
    deployment = _controller(inst)
    affinity = deployment["spec"]["template"]["spec"].get("affinity", {})
    cluster = inst.values["controller"]["cluster"][
        "enabled"
    ]  # no shared ledger: tests/helm/test_cluster_mode.py
    if (
        inst.values["controller"]["replicas"] > 1
        and not inst.values["controller"]["affinity"]
        and not cluster
    ):
        (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    else:
        assert "podAffinity" not in affinity


def test_token_secret_holds_a_token(inst: Installed) -> None:
    deployment = _controller(inst)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    secret_name = volumes["token"]["secret"]["secretName"]
    existing = inst.values["controller"]["auth"]["existingSecret"]
    if existing:
        assert secret_name == existing
        assert inst.named("Secret", existing) is None, "an existing Secret must not be created"
        return
    secret = inst.named("Secret", secret_name)
    assert secret is not None
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 32 and token.isalnum()
    # the lookup that keeps a generated token across upgrades asked the API server first
    assert any(r.method == "GET" and r.path.endswith(f"/secrets/{secret_name}") for r in inst.api.requests)


def test_network_policy_only_when_enabled(inst: Installed) -> None:
    policies = inst.of_kind("NetworkPolicy")
    if not (inst.values["controller"]["enabled"] and inst.values["controller"]["networkPolicy"]["enabled"]):
        assert policies == []
        return
    (policy,) = policies
    pod_labels = _controller(inst)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": inst.values["controller"]["port"], "protocol": "TCP"}]


def _rbac_doc_objects() -> dict[str, JSON]:
    """docs/rbac.md's controller YAML, by kind and name."""
    text = (ROOT / "docs" / "rbac.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(blocks[0]) if d}


def controller_rbac_from_docs(values: JSON) -> tuple[list[JSON], list[JSON], list[JSON]]:
    """(ClusterRole rules, workload rules, lease Role rules) docs/rbac.md says these values render."""
    doc = _rbac_doc_objects()
    cluster = doc["ClusterRole/gpupulse-remediation"]["rules"]
    workloads = doc["Role/gpupulse-remediation-workloads"]["rules"]
    if not values["controller"]["rbac"]["rolloutRestart"]:
        workloads = [r for r in workloads if r["resources"] != ["deployments"]]
    leases = doc["Role/gpupulse-remediation-leases"]["rules"]
    if not values["controller"]["cluster"]["enabled"]:
        leases = [r for r in leases if r["apiGroups"] != ["remediation.gpupulse.io"]]
    if not values["controller"]["scope"]["nodes"]:
        # no migrate: no eviction and no node patch (docs/rbac.md); the node selector still reads Nodes
        cluster = [r for r in cluster if r["resources"] != ["pods/eviction"]]
        cluster = [{**r, "verbs": ["get"]} if r["resources"] == ["nodes"] else r for r in cluster]
        cluster = [r for r in cluster if r["apiGroups"] != ["resource.k8s.io"]]  # no device quarantine
    if values["controller"]["scope"]["namespaces"] == ["*"]:
        cluster = cluster + workloads
    return cluster, workloads, leases


def test_controller_rbac_equals_docs_rbac(inst: Installed) -> None:
    backend_rbac = (
        inst.values["controller"]["enabled"] and inst.values["controller"]["backend"] == "kubernetes"
    )
    role = next(
        (o for o in inst.of_kind("ClusterRole") if o["metadata"]["name"].endswith("-controller")), None
    )
    if not backend_rbac:
        assert role is None
        return
    assert role is not None
    cluster, workloads, leases = controller_rbac_from_docs(inst.values)
    assert role["rules"] == cluster
    own = inst.result["namespace"]
    (lease_role,) = [r for r in inst.of_kind("Role") if r["metadata"]["name"].endswith("-controller")]
    assert lease_role["metadata"]["namespace"] == own
    assert lease_role["rules"] == leases
    scope = inst.values["controller"]["scope"]["namespaces"]
    workload_roles = {
        r["metadata"]["namespace"]: r["rules"]
        for r in inst.of_kind("Role")
        if r["metadata"]["name"].endswith("-controller-workloads")
    }
    want = {} if scope == ["*"] else dict.fromkeys(scope, workloads)
    assert workload_roles == want


def test_exporter_rbac_equals_docs_rbac(inst: Installed) -> None:
    text = (ROOT / "docs" / "rbac.md").read_text()
    (block,) = re.findall(r"```yaml exporter\n(.*?)```", text, flags=re.DOTALL)
    pods, slices = yaml.safe_load(block)["rules"]
    exporter = inst.values["exporter"]
    want = [
        r
        for r, on in (
            (pods, watches_pods(exporter)),
            (slices, exporter["dra"]["enabled"]),
        )
        if on
    ]
    roles = [o for o in inst.of_kind("ClusterRole") if o["metadata"]["name"].endswith("-exporter")]
    if not exporter["enabled"] or not want:
        assert roles == []
        return
    (role,) = roles
    assert role["rules"] == want


# --- rules and dashboards


def test_dashboard_configmaps_equal_dashboards(inst: Installed) -> None:
    maps = [o for o in inst.of_kind("ConfigMap") if "-dashboard-" in o["metadata"]["name"]]
    if not inst.values["dashboards"]["enabled"]:
        assert maps == []
        return
    sources = {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards" / "json").glob("*.json")}
    assert len(maps) == len(sources)
    seen = set()
    board = inst.values["dashboards"]
    for cm in maps:
        # the Grafana sidecar's label (kube-prometheus-stack: grafana_dashboard "1", any namespace)
        assert cm["metadata"]["labels"][board["label"]] == board["labelValue"]
        folder = (cm["metadata"].get("annotations") or {}).get(board["folderAnnotation"])
        assert folder == (board["folder"] or None)
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == sources[key], key
        seen.add(key)
    assert seen == set(sources)


# --- Helm refuses bad values before touching the cluster


def _only_crds_written(api: FakeHelmAPI) -> bool:
    """Helm installs crds/ before it renders (and so validates) the values: nothing else is written."""
    writes = [r for r in api.requests if r.method != "GET"]
    return (
        bool(writes)
        and all("/apis/apiextensions.k8s.io/" in r.path for r in writes)
        and api.chart_objects() == []
        and len(api.crds()) == 2
    )


async def test_invalid_values_fail_the_schema_before_anything_is_created(tmp_path: Path) -> None:
    import helm_sdkpy

    api = FakeHelmAPI(namespaces={"bad"})
    with pytest.raises(helm_sdkpy.InstallError) as failure:
        await install(api, tmp_path, "bad", {"controller": {"replicas": 7}})
    assert _only_crds_written(api)
    assert "/controller/replicas" in str(failure.value)


async def test_template_guard_fails_before_anything_is_created(tmp_path: Path) -> None:
    import helm_sdkpy

    api = FakeHelmAPI(namespaces={"bad"})
    with pytest.raises(helm_sdkpy.InstallError) as failure:
        await install(api, tmp_path, "bad", {"controller": {"replicas": 2, "backend": "local"}})
    assert _only_crds_written(api)
    assert "leader election uses a Lease" in str(failure.value)


async def test_replicas_on_a_shared_filesystem_are_refused(tmp_path: Path) -> None:
    import helm_sdkpy

    api = FakeHelmAPI(namespaces={"bad"})
    values = {"controller": {"replicas": 2, "persistence": {"accessModes": ["ReadWriteMany"]}}}
    with pytest.raises(helm_sdkpy.InstallError) as failure:
        await install(api, tmp_path, "bad", values)
    assert _only_crds_written(api)
    assert "needs a local filesystem" in str(failure.value)


# --- an upgrade keeps the generated token (the `lookup` in controller-secret.yaml)


async def test_upgrade_keeps_the_generated_token_and_applies_changes(tmp_path: Path) -> None:
    import helm_sdkpy

    namespace = "upgrade"
    api = FakeHelmAPI(namespaces={namespace})
    await api.start(tmp_path)
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", namespace)
        config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=str(kubeconfig))
        await helm_sdkpy.Install(config).run(RELEASE, str(CHART), wait=False, timeout=30)
        secret_name = f"{RELEASE}-gpupulse-controller-token"
        before = api.stored("v1", "secrets", namespace, secret_name)
        assert before is not None
        result = await helm_sdkpy.Upgrade(config).run(
            RELEASE, str(CHART), values={"controller": {"dryRun": False}}, wait=False, timeout=30,
            server_side_apply=False,
        )  # fmt: skip
    finally:
        await api.stop()
    assert result["version"] == 2 and result["info"]["status"] == "deployed"
    after = api.stored("v1", "secrets", namespace, secret_name)
    assert after is not None and after["data"]["token"] == before["data"]["token"]
    patched = {path.rsplit("/", 1)[1] for path, _ in api.patches}
    assert patched == {f"{RELEASE}-gpupulse-controller"}, "only the Deployment changed"
    deployment = api.stored("apps/v1", "deployments", namespace, f"{RELEASE}-gpupulse-controller")
    assert deployment is not None
    assert "--dry-run" not in _container(deployment)["args"]
    statuses = sorted(r["metadata"]["labels"]["status"] for r in api.release_records())
    assert statuses == ["deployed", "superseded"]
