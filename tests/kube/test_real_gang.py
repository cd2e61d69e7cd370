"""Gang restarts of distributed training jobs against a real kube-apiserver and kube-controller-manager
(tests/kube/realapi.py), with the CRDs of JobSet, Kubeflow's training operator and Volcano as their
projects publish them (tests/fixtures/crds): the real `gpupulse-remediation` process, acting with the
chart's controller ServiceAccount, gets a TrainingJobHung alert and restarts the whole job through its
owner. The real garbage collector and Job controller do their part; the projects' own controllers do
not run here, so each test plays (or checks for) the step that controller would take next."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.proofs.harness import TOKEN, Serve, alert, notification, post
from gpupulse.clock import SystemClock
from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import PermanentError
from remediation.kube.client import KubeClient
from remediation.model import Target
from tests.kube.conftest import backend_settings
from tests.kube.realapi import (
    CRDS,
    JSON,
    ControlPlaneError,
    KubeHTTPError,
    RealCluster,
    add_node,
    apply_crd,
    controller_ref,
    ensure_namespace,
    is_ready,
    pods_in,
    real_cluster,
    wait_for,
)
from tests.kube.test_real_apiserver import (
    CONTROLLER_NS,
    chart,
    controller_client,
    controller_token,
    kubeconfig,
    refused_actions,
    serve_args,
)

pytestmark = [pytest.mark.real_apiserver, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]
# session and module fixtures, imported so that pytest finds them here
__all__ = ["chart", "controller_client", "controller_token", "kubeconfig", "real_cluster"]

# the CRDs our gang restart reads or writes (remediation/kube/jobs.py OWNER_KINDS), vendored verbatim
CRD_FILES = (
    "jobset-v0.12.0/jobset.x-k8s.io_jobsets.yaml",
    "kubeflow-training-operator-v1.8.1/kubeflow.org_pytorchjobs.yaml",
    "volcano-v1.15.1/batch.volcano.sh_jobs.yaml",
    "volcano-v1.15.1/bus.volcano.sh_commands.yaml",
)
IMAGE = "registry.example/train:1"


@pytest.fixture(scope="module")
def training_crds(real_cluster: RealCluster) -> dict[str, JSON]:
    """The training projects' CRDs, established on the real server."""
    out = {}
    for name in CRD_FILES:
        crd = apply_crd(real_cluster.kube, CRDS / name)
        out[crd["spec"]["names"]["kind"] + "." + crd["spec"]["group"]] = crd
    return out


@contextlib.contextmanager
def training_namespace(real_cluster: RealCluster, nodes: int = 1) -> Iterator[tuple[str, list[str]]]:
    """A namespace and GPU nodes of this test's own (deleted afterwards)."""
    kube = real_cluster.kube
    ns = real_cluster.unique("train")
    names = [real_cluster.unique("gpu") for _ in range(nodes)]
    for name in names:
        add_node(kube, name)
    ensure_namespace(kube, ns)
    try:
        yield ns, names
    finally:
        for name in names:
            real_cluster.kubelet.hung_nodes.discard(name)
        kube.delete(f"/api/v1/namespaces/{ns}")
        for name in names:
            with contextlib.suppress(KubeHTTPError):
                kube.delete(f"/api/v1/nodes/{name}")


def container_spec(node: str) -> JSON:
    """A pod spec pinned to `node` (the stand-in scheduler honours the hostname selector)."""
    return {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "pytorch", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }


def rank_pod(namespace: str, name: str, node: str, owner: JSON, labels: dict[str, str]) -> JSON:
    """A rank's pod as its operator creates it (controller ownerReference, the operator's labels)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [controller_ref(owner)],
        },
        "spec": container_spec(node),
    }


def hang_alert(fingerprint: str, kind: str, namespace: str, job: str) -> dict[str, Any]:
    return alert(
        fingerprint,
        {
            "alertname": "TrainingJobHung",
            "layer": "training",
            "fault_class": "training_hang",
            "target_kind": "job",
            "namespace": namespace,
            "training_job": job,
            "training_job_kind": kind,
        },
    )


def send_hang(serve: Serve, fingerprint: str, kind: str, namespace: str, job: str) -> None:
    """Alertmanager's webhook with one TrainingJobHung alert, accepted."""
    assert post(serve.url, notification([hang_alert(fingerprint, kind, namespace, job)])) == 200


def _get(serve: Serve, path: str) -> Any:
    req = urllib.request.Request(serve.url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def restart_actions(serve: Serve) -> list[JSON]:
    """The restart actions in the ledger history of every incident the controller holds."""
    out = []
    for incident in _get(serve, "/api/v1/incidents")["incidents"]:
        full = _get(serve, f"/api/v1/incidents/{incident['id']}")
        out += [e for e in full["history"] if e.get("kind") == "action" and e.get("rung") == "restart"]
    return out


@contextlib.contextmanager
def controller(kubeconfig: Path, tmp_path: Path) -> Iterator[Serve]:
    """The real controller process with the chart's ServiceAccount token; no 403 in its log at the end."""
    serve = Serve(tmp_path, serve_args(tmp_path / "state", kubeconfig))
    try:
        serve.start()
        yield serve
        assert refused_actions(serve.log_path) == [], serve.log_tail()
        assert serve.stop() == 0
    finally:
        serve.kill()


def restarted(serve: Serve) -> JSON:
    """Wait for the ledger to record the gang restart as done; its entry."""

    def done() -> bool:
        return any(e.get("status") == "success" for e in restart_actions(serve))

    try:
        wait_for(done, 60, "the gang restart to be recorded as done")
    except ControlPlaneError as e:
        held = [
            _get(serve, f"/api/v1/incidents/{i['id']}") for i in _get(serve, "/api/v1/incidents")["incidents"]
        ]
        raise AssertionError(f"{e}\nincidents: {json.dumps(held)[:3000]}\n{serve.log_tail(40)}") from None
    (entry,) = [e for e in restart_actions(serve) if e.get("status") == "success"]
    return entry


def child_job(namespace: str, jobset: JSON, index: int, node: str, label: str = "") -> JSON:
    """A child Job as the JobSet controller builds it: `<jobset>-<replicatedJob>-<index>`, Indexed,
    labelled (with another JobSet's name as `label`, when given) and controlled by the JobSet."""
    name = jobset["metadata"]["name"]
    labels = {
        "jobset.sigs.k8s.io/jobset-name": label or name,
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": str(index),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{name}-workers-{index}",
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [controller_ref(jobset)],
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": labels}, "spec": container_spec(node)},
        },
    }


def test_jobset_restart_removes_every_child_job_only_after_all_of_its_ranks_have_stopped(
    real_cluster: RealCluster, training_crds: dict[str, JSON], kubeconfig: Path, tmp_path: Path
) -> None:
    """The child Jobs are deleted in the foreground: the real garbage collector deletes each Job's
    pods first and the Job only once they are gone, so the JobSet controller, which recreates a child
    Job that does not exist, cannot start the new gang while a rank of the old one still runs."""
    kube = real_cluster.kube
    with training_namespace(real_cluster, nodes=2) as (ns, (node_a, node_b)):
        base = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
        template = {"spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2,
                             "template": {"spec": container_spec(node_a)}}}  # fmt: skip
        jobset = kube.post(
            base,
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
             "metadata": {"name": "llama", "namespace": ns},
             "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": template}]}},
        )  # fmt: skip
        jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
        children = [kube.post(jobs, child_job(ns, jobset, i, n)) for i, n in enumerate((node_a, node_b))]
        wait_for(lambda: sum(map(is_ready, pods_in(kube, ns))) == 4, 60, "4 ranks running")
        ranks = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods_in(kube, ns)}
        real_cluster.kubelet.hung_nodes.add(node_b)  # its kubelet does not confirm the deletes
        with controller(kubeconfig, tmp_path) as serve:
            send_hang(serve, "6a9600000000a1", "JobSet.jobset.x-k8s.io", ns, "llama")
            entry = restarted(serve)
            assert entry["details"]["method"] == "delete_child_jobs"
            assert sorted(entry["details"]["deleted"]) == [f"{ns}/llama-workers-0", f"{ns}/llama-workers-1"]
            # the Job on the healthy node goes with its pods; the other stays while its ranks terminate
            wait_for(lambda: not kube.exists(f"{jobs}/llama-workers-0"), 60, "llama-workers-0 to be gone")
            stuck = kube.get(f"{jobs}/llama-workers-1")
            assert stuck["metadata"]["deletionTimestamp"]
            assert "foregroundDeletion" in stuck["metadata"].get("finalizers", [])
            assert stuck["metadata"]["uid"] == children[1]["metadata"]["uid"]
            left = pods_in(kube, ns)
            assert left and {p["spec"]["nodeName"] for p in left} == {node_b}
            assert all(p["metadata"]["deletionTimestamp"] for p in left)
            # what the JobSet controller does next: recreate every child Job that is missing. The one
            # whose ranks still run is not missing, so its name is taken until they stop
            kube.post(jobs, child_job(ns, jobset, 0, node_a))
            with pytest.raises(KubeHTTPError) as taken:
                kube.post(jobs, child_job(ns, jobset, 1, node_b))
            assert taken.value.status == 409
            real_cluster.kubelet.hung_nodes.discard(node_b)
            wait_for(lambda: not kube.exists(f"{jobs}/llama-workers-1"), 60, "llama-workers-1 to be gone")
            kube.post(jobs, child_job(ns, jobset, 1, node_b))
            wait_for(lambda: sum(map(is_ready, pods_in(kube, ns))) == 4, 60, "the new gang running")
        assert not set(ranks) & {p["metadata"]["uid"] for p in pods_in(kube, ns)}, "an old rank survived"
        after = kube.get(f"{base}/llama")
        assert after["metadata"]["uid"] == jobset["metadata"]["uid"], "the JobSet itself stays"
        assert not after["metadata"].get("deletionTimestamp")


def pytorchjob(namespace: str, name: str, workers: int) -> JSON:
    """A PyTorchJob of one master and `workers` workers, as users write it for training-operator v1."""

    def replicas(count: int) -> JSON:
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [{"name": "pytorch", "image": IMAGE}]}}}  # fmt: skip

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(workers)},
        },
    }


def test_pytorchjob_restart_deletes_every_rank_it_controls_and_no_other_pod(
    real_cluster: RealCluster, training_crds: dict[str, JSON], kubeconfig: Path, tmp_path: Path
) -> None:
    """Every pod the PyTorchJob controls goes (the operator recreates each missing replica); a pod with
    the job's name label that another PyTorchJob of the same name once created stays."""
    kube = real_cluster.kube
    with training_namespace(real_cluster) as (ns, (node,)):
        base = f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"
        job = kube.post(base, pytorchjob(ns, "llama", 3))
        old = kube.post(base, pytorchjob(ns, "llama-before", 1))
        pods = f"/api/v1/namespaces/{ns}/pods"
        label = "training.kubeflow.org/job-name"
        for i, kind in enumerate(("master", "worker", "worker", "worker")):
            index = str(0 if kind == "master" else i - 1)
            labels = {label: "llama", "training.kubeflow.org/replica-type": kind,
                      "training.kubeflow.org/replica-index": index}  # fmt: skip
            kube.post(pods, rank_pod(ns, f"llama-{kind}-{index}", node, job, labels))
        kube.post(pods, rank_pod(ns, "stranger", node, old, {label: "llama"}))
        wait_for(lambda: sum(map(is_ready, pods_in(kube, ns))) == 5, 60, "the ranks running")
        ranks = {p["metadata"]["uid"] for p in pods_in(kube, ns) if p["metadata"]["name"] != "stranger"}
        with controller(kubeconfig, tmp_path) as serve:
            send_hang(serve, "6a9600000000b1", "PyTorchJob.kubeflow.org", ns, "llama")
            entry = restarted(serve)
            assert entry["details"]["method"] == "delete_pods" and len(entry["details"]["deleted"]) == 4
            wait_for(
                lambda: not ranks & {p["metadata"]["uid"] for p in pods_in(kube, ns)}, 60, "every rank gone"
            )
        (left,) = pods_in(kube, ns)
        assert left["metadata"]["name"] == "stranger" and is_ready(left)
        assert kube.get(f"{base}/llama")["metadata"]["uid"] == job["metadata"]["uid"]


def test_volcano_restart_is_a_command_the_real_schema_keeps_whole_and_the_job_owns(
    real_cluster: RealCluster, training_crds: dict[str, JSON], kubeconfig: Path, tmp_path: Path
) -> None:
    """The bus.volcano.sh Command we create passes Volcano's structural schema with every field we set
    (pruning would drop an unknown one silently, and Volcano's controller would ignore the Command);
    its ownerReference resolves, so the real garbage collector removes it with the Job."""
    kube = real_cluster.kube
    with training_namespace(real_cluster) as (ns, (node,)):
        base = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs"
        job = kube.post(
            base,
            {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
             "metadata": {"name": "llama", "namespace": ns},
             "spec": {"minAvailable": 2, "schedulerName": "volcano",
                      "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
                      "tasks": [{"name": "worker", "replicas": 2,
                                 "template": {"spec": {"containers": [{"name": "w", "image": IMAGE}]}}}]}},
        )  # fmt: skip
        pods = f"/api/v1/namespaces/{ns}/pods"
        for i in range(2):
            labels = {"volcano.sh/job-name": "llama", "volcano.sh/task-spec": "worker"}
            kube.post(pods, rank_pod(ns, f"llama-worker-{i}", node, job, labels))
        wait_for(lambda: sum(map(is_ready, pods_in(kube, ns))) == 2, 60, "the ranks running")
        uids = {p["metadata"]["uid"] for p in pods_in(kube, ns)}
        with controller(kubeconfig, tmp_path) as serve:
            send_hang(serve, "6a9600000000c1", "Job.batch.volcano.sh", ns, "llama")
            entry = restarted(serve)
        commands = f"/apis/bus.volcano.sh/v1alpha1/namespaces/{ns}/commands"
        (command,) = kube.get(commands)["items"]
        assert command["metadata"]["name"] == entry["details"]["command"]
        assert command["metadata"]["name"].startswith("llama-restartjob-")
        assert command["action"] == "RestartJob"
        assert command["reason"] == "GpupulseRemediation" and command["message"]
        target = command["target"]
        assert target == {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "llama",
                          "uid": job["metadata"]["uid"], "controller": True}  # fmt: skip
        assert command["metadata"]["ownerReferences"] == [target]
        # Volcano's job controller kills and recreates the pods, not us
        assert {p["metadata"]["uid"] for p in pods_in(kube, ns)} == uids
        kube.delete(f"{base}/llama")
        wait_for(lambda: not kube.get(commands)["items"], 60, "the garbage collector to remove the Command")


def test_indexed_job_restart_has_the_real_job_controller_bring_back_every_index(
    real_cluster: RealCluster, kubeconfig: Path, tmp_path: Path
) -> None:
    """The pods of an Indexed Job are deleted by its controller-uid label; the real Job controller
    recreates a pod for each index, and the Job itself is untouched. Each deleted rank counts as a
    failed pod against backoffLimit, and the controller waits its failure backoff (10 s, doubling)
    before the new pods: about 40 s here after three."""
    kube = real_cluster.kube
    with training_namespace(real_cluster) as (ns, (node,)):
        jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
        job = kube.post(
            jobs,
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ddp", "namespace": ns},
             "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 3, "backoffLimit": 6,
                      "template": {"spec": container_spec(node)}}},
        )  # fmt: skip

        def indices() -> dict[str, str]:
            return {
                p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p["metadata"]["uid"]
                for p in pods_in(kube, ns)
                if is_ready(p)
            }

        wait_for(lambda: len(indices()) == 3, 60, "3 indices running")
        before = indices()
        with controller(kubeconfig, tmp_path) as serve:
            send_hang(serve, "6a9600000000d1", "Job.batch", ns, "ddp")
            entry = restarted(serve)
            assert entry["details"]["method"] == "delete_pods" and len(entry["details"]["deleted"]) == 3

            def replaced() -> bool:
                now = indices()
                return sorted(now) == ["0", "1", "2"] and not set(now.values()) & set(before.values())

            wait_for(replaced, 60, "the Job controller to recreate every index")
        after = kube.get(f"{jobs}/ddp")
        assert after["metadata"]["uid"] == job["metadata"]["uid"]
        assert not after["metadata"].get("deletionTimestamp")
        assert after["status"].get("failed") == 3, "every restarted rank counted against backoffLimit"


def indexed_job(namespace: str, name: str, ranks: int, node: str, backoff_limit: int) -> JSON:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"completionMode": "Indexed", "completions": ranks, "parallelism": ranks,
                 "backoffLimit": backoff_limit, "template": {"spec": container_spec(node)}},
    }  # fmt: skip


def job_failed(job: JSON) -> str:
    """The reason of the Job's Failed condition ("" while it has none)."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return str(c.get("reason", ""))
    return ""


def test_deleting_more_ranks_of_an_indexed_job_than_its_backoff_limit_fails_the_job(
    real_cluster: RealCluster,
) -> None:
    """Why the gang restart of an Indexed Job counts its backoff budget first: the real Job controller
    takes every deleted running pod as a failure, and past backoffLimit it fails the whole Job. A
    plain delete marks no DisruptionTarget condition (an eviction does), so a podFailurePolicy rule
    that ignores disruptions does not spare the restarted ranks."""
    kube = real_cluster.kube
    with training_namespace(real_cluster) as (ns, (node,)):
        jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
        kube.post(jobs, indexed_job(ns, "ddp", 4, node, backoff_limit=2))
        wait_for(lambda: sum(map(is_ready, pods_in(kube, ns))) == 4, 60, "4 ranks running")
        real_cluster.kubelet.hung_nodes.add(node)  # the deleted pods stay Terminating to be read
        first, second, *rest = pods_in(kube, ns)
        path = f"/api/v1/namespaces/{ns}/pods"
        kube.delete(f"{path}/{first['metadata']['name']}")
        kube.post(f"{path}/{second['metadata']['name']}/eviction",
                  {"apiVersion": "policy/v1", "kind": "Eviction",
                   "metadata": {"name": second["metadata"]["name"], "namespace": ns}})  # fmt: skip

        def disrupted(pod: JSON) -> bool:
            now = kube.get(f"{path}/{pod['metadata']['name']}")
            return any(c.get("type") == "DisruptionTarget" for c in now["status"].get("conditions") or [])

        assert kube.get(f"{path}/{first['metadata']['name']}")["metadata"]["deletionTimestamp"]
        assert not disrupted(first) and disrupted(second)
        real_cluster.kubelet.hung_nodes.discard(node)
        for pod in rest:
            kube.delete(f"{path}/{pod['metadata']['name']}")
        wait_for(lambda: bool(job_failed(kube.get(f"{jobs}/ddp"))), 60, "the Job controller to fail the Job")
        assert job_failed(kube.get(f"{jobs}/ddp")) == "BackoffLimitExceeded"


async def test_an_indexed_job_restart_that_would_exceed_its_backoff_limit_is_refused_on_the_real_job(
    real_cluster: RealCluster, controller_client: KubeClient
) -> None:
    """The budget is read from the Job as the real server holds it (backoffLimit 2, 4 ranks): the
    restart is refused before any pod is deleted and the Job keeps running."""
    kube = real_cluster.kube
    with training_namespace(real_cluster) as (ns, (node,)):
        kube.post(f"/apis/batch/v1/namespaces/{ns}/jobs", indexed_job(ns, "ddp", 4, node, backoff_limit=2))
        wait_for(lambda: sum(map(is_ready, pods_in(kube, ns))) == 4, 60, "4 ranks running")
        uids = {p["metadata"]["uid"] for p in pods_in(kube, ns)}
        backend = KubernetesBackend(
            controller_client, backend_settings(namespace=CONTROLLER_NS, identity="ctl-0"), SystemClock()
        )
        target = Target(kind="job", namespace=ns, training_job_kind="Job.batch", training_job="ddp")
        with pytest.raises(PermanentError, match=r"4 pod\(s\) of Job .*/ddp would fail it.*backoffLimit 2"):
            await backend.restart(target, "hang")
        assert {p["metadata"]["uid"] for p in pods_in(kube, ns) if is_ready(p)} == uids
        assert not job_failed(kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/ddp"))


async def test_a_long_volcano_job_name_and_reason_give_a_command_the_real_server_accepts_naming_its_action(
    real_cluster: RealCluster, training_crds: dict[str, JSON], controller_client: KubeClient
) -> None:
    """A custom resource's name may have 253 characters, and so may a generateName: the whole job name
    as the prefix (as vcctl builds it) is refused for a long name, and the API server cuts a valid one to
    58 characters before it adds 5 random ones, which would drop "-restartjob-". Ours keeps the name's
    first 40 characters, then the action; Volcano's schema keeps the reason's first 1024 characters as
    the message and the Command's controller ownerReference."""
    kube = real_cluster.kube
    with training_namespace(real_cluster) as (ns, _):
        name = "a" * 40 + "b" * 213
        job = kube.post(
            f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs",
            {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
             "metadata": {"name": name, "namespace": ns},
             "spec": {"minAvailable": 1, "schedulerName": "volcano",
                      "tasks": [{"name": "worker", "replicas": 1,
                                 "template": {"spec": {"containers": [{"name": "w", "image": IMAGE}]}}}]}},
        )  # fmt: skip
        backend = KubernetesBackend(
            controller_client, backend_settings(namespace=CONTROLLER_NS, identity="ctl-0"), SystemClock()
        )
        reason = "".join(f"{i:04d}" for i in range(1500))  # 6000 characters, each cut point distinct
        target = Target(kind="job", namespace=ns, training_job_kind="Job.batch.volcano.sh", training_job=name)
        result = await backend.restart(target, reason)
        commands = f"/apis/bus.volcano.sh/v1alpha1/namespaces/{ns}/commands"
        (command,) = kube.get(commands)["items"]
        assert command["metadata"]["name"] == result.details["command"]
        assert re.fullmatch("a" * 40 + r"-restartjob-[a-z0-9]{5}", command["metadata"]["name"])
        assert command["message"] == reason[:1024]
        ref = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": name,
               "uid": job["metadata"]["uid"], "controller": True}  # fmt: skip
        assert command["target"] == ref and command["metadata"]["ownerReferences"] == [ref]

        def vcctl_style(prefix: str) -> JSON:
            return kube.post(
                commands,
                {"apiVersion": "bus.volcano.sh/v1alpha1", "kind": "Command", "action": "RestartJob",
                 "target": ref, "metadata": {"generateName": f"{prefix}-restartjob-", "namespace": ns}},
            )  # fmt: skip

        with pytest.raises(KubeHTTPError, match=r"generateName.*no more than 253 characters") as refused:
            vcctl_style(name)
        assert refused.value.status == 422
        cut_by_the_server = vcctl_style(name[:60])["metadata"]["name"]
        assert len(cut_by_the_server) == 63 and "restartjob" not in cut_by_the_server
