"""A training job restarted as a gang through its controller, against the in-process API server: JobSet,
PyTorchJob, Volcano Job and indexed Job each through their own API path, never one pod of the gang;
a suspect node cordoned before the restart; unknown owners and hostile answers refused cleanly."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import PermanentError, TemporaryError
from remediation.model import Target
from tests.fakes.kube_api import JSON, FakeKubeAPI

Make = Callable[..., KubernetesBackend]
NODES = ("gpu-a", "gpu-b")


def _job_target(kind: str, name: str, node: str = "", uuid: str = "") -> Target:
    return Target(
        kind="job", namespace="train", training_job_kind=kind, training_job=name, node=node, uuid=uuid
    )


def pytorchjob(api: FakeKubeAPI, name: str = "llama") -> tuple[JSON, list[JSON]]:
    """A PyTorchJob of 2 nodes x 8 ranks (one pod per node, as torchrun runs it)... plus one pod per
    rank to make the gang visible: 16 worker pods, labelled as training-operator labels them."""
    job = api.add_object("kubeflow.org/v1", "pytorchjobs", "train", name)
    pods = [
        api.add_pod(
            "train",
            f"{name}-worker-{rank}",
            NODES[rank // 8],
            labels={"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-index": str(rank)},
            gpus=1,
            controller=job,
        )
        for rank in range(16)
    ]
    return job, pods


def jobset(api: FakeKubeAPI, name: str = "llama") -> tuple[JSON, list[JSON], list[JSON]]:
    """A JobSet with one replicatedJob of 2 child Jobs (one per node), 8 pods each."""
    js = api.add_object("jobset.x-k8s.io/v1alpha2", "jobsets", "train", name)
    children, pods = [], []
    for i, node in enumerate(NODES):
        child = api.add_object(
            "batch/v1",
            "jobs",
            "train",
            f"{name}-workers-{i}",
            spec={"completionMode": "Indexed"},
            labels={"jobset.sigs.k8s.io/jobset-name": name},
            controller=js,
        )
        children.append(child)
        pods += [
            api.add_pod("train", f"{name}-workers-{i}-{r}-x", node, gpus=1, controller=child)
            for r in range(8)
        ]
    return js, children, pods


async def test_pytorchjob_restart_deletes_every_rank_at_once_with_uid_preconditions(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    job, pods = pytorchjob(kube_api)
    # a pod of another PyTorchJob that reused the name: its owner UID differs, so it is not ours
    other = kube_api.add_object("kubeflow.org/v1", "pytorchjobs", "train", "old-llama")
    stranger = kube_api.add_pod(
        "train", "stranger", "gpu-a", labels={"training.kubeflow.org/job-name": "llama"}, controller=other
    )
    result = await make_backend().restart(_job_target("PyTorchJob.kubeflow.org", "llama"), "hang")
    assert result.done and result.details["method"] == "delete_pods"
    assert sorted(d[0] for d in kube_api.deleted) == sorted(f"train/{p['metadata']['name']}" for p in pods)
    deletes = kube_api.calls("DELETE", "/api/v1/namespaces/train/pods/")
    assert len(deletes) == 16
    assert {d.body["preconditions"]["uid"] for d in deletes} == {p["metadata"]["uid"] for p in pods}
    assert ("train", "stranger") in kube_api.pods and stranger
    (listing,) = kube_api.calls("GET", "/api/v1/namespaces/train/pods$")
    assert listing.query["labelSelector"] == "training.kubeflow.org/job-name=llama"
    assert result.details["owner_uid"] == job["metadata"]["uid"]
    assert "16 pod(s)" in result.summary


async def test_jobset_restart_deletes_its_child_jobs_foreground_so_the_jobset_recreates_them(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    js, children, pods = jobset(kube_api)
    result = await make_backend().restart(_job_target("JobSet.jobset.x-k8s.io", "llama"), "hang")
    deletes = kube_api.calls("DELETE", "/apis/batch/v1/namespaces/train/jobs/")
    assert sorted(d.path.rsplit("/", 1)[1] for d in deletes) == ["llama-workers-0", "llama-workers-1"]
    assert all(d.body["propagationPolicy"] == "Foreground" for d in deletes)
    assert {d.body["preconditions"]["uid"] for d in deletes} == {c["metadata"]["uid"] for c in children}
    assert not kube_api.pods, "the garbage collector took every rank's pod with its Job"
    assert kube_api.objects_of("jobset.x-k8s.io/v1alpha2", "jobsets") == [js], "the JobSet itself stays"
    assert not kube_api.calls("DELETE", "/pods/"), "no pod of the gang is deleted on its own"
    assert result.details["deleted"] == ["train/llama-workers-0", "train/llama-workers-1"]
    assert len(pods) == 16


async def test_a_job_a_jobset_controls_is_restarted_as_its_jobset(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    jobset(kube_api)
    result = await make_backend().restart(_job_target("Job.batch", "llama-workers-1"), "straggler")
    assert result.details["owner"] == "JobSet.jobset.x-k8s.io/llama"
    assert len(kube_api.calls("DELETE", "/apis/batch/v1/namespaces/train/jobs/")) == 2


async def test_volcano_job_restart_is_a_restartjob_command(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    job = kube_api.add_object("batch.volcano.sh/v1alpha1", "jobs", "train", "llama")
    for rank in range(16):
        kube_api.add_pod("train", f"llama-worker-{rank}", NODES[rank // 8], gpus=1, controller=job)
    result = await make_backend().restart(_job_target("Job.batch.volcano.sh", "llama"), "collective hang")
    (command,) = kube_api.objects_of("bus.volcano.sh/v1alpha1", "commands")
    assert command["action"] == "RestartJob"
    assert command["target"]["uid"] == job["metadata"]["uid"]
    assert command["target"]["kind"] == "Job" and command["target"]["name"] == "llama"
    assert command["metadata"]["name"].startswith("llama-restartjob-")
    assert command["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert len(kube_api.pods) == 16, "Volcano's job controller restarts the pods, not us"
    assert result.details["command"] == command["metadata"]["name"]


async def test_indexed_job_restart_deletes_the_pods_of_its_controller_uid(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    job = kube_api.add_object("batch/v1", "jobs", "train", "ddp", spec={"completionMode": "Indexed"})
    uid = job["metadata"]["uid"]
    for rank in range(4):
        kube_api.add_pod(
            "train",
            f"ddp-{rank}-x",
            "gpu-a",
            labels={"batch.kubernetes.io/controller-uid": uid},
            controller=job,
        )
    await make_backend().restart(_job_target("Job.batch", "ddp"), "hang")
    (listing,) = kube_api.calls("GET", "/api/v1/namespaces/train/pods$")
    assert listing.query["labelSelector"] == f"batch.kubernetes.io/controller-uid={uid}"
    assert len(kube_api.deleted) == 4 and not kube_api.pods


async def test_a_non_indexed_job_is_not_a_gang_gpupulse_restarts(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_object("batch/v1", "jobs", "train", "batch", spec={"completionMode": "NonIndexed"})
    with pytest.raises(PermanentError, match="not Indexed"):
        await make_backend().restart(_job_target("Job.batch", "batch"), "hang")
    assert not kube_api.calls("DELETE", "")


@pytest.mark.parametrize(
    "kind", ["LeaderWorkerSet.leaderworkerset.x-k8s.io", "StatefulSet.apps", "", "Foo.bar"]
)
async def test_unknown_owner_kinds_are_refused_permanently_so_the_ladder_pages(
    kube_api: FakeKubeAPI, make_backend: Make, kind: str
) -> None:
    with pytest.raises(PermanentError, match=r"no gang restart|namespace, kind and name"):
        await make_backend().restart(_job_target(kind, "llama"), "hang")
    assert not [r for r in kube_api.requests if r.method in ("DELETE", "POST", "PATCH")]


async def test_a_job_that_is_gone_or_whose_crd_is_not_installed_is_permanent(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    with pytest.raises(PermanentError, match="no longer exists"):
        await make_backend().restart(_job_target("PyTorchJob.kubeflow.org", "llama"), "hang")
    kube_api.fail(
        "GET",
        "/apis/jobset.x-k8s.io/",
        404,
        "NotFound",
        message="the server could not find the requested resource",
    )
    with pytest.raises(PermanentError):
        await make_backend().restart(_job_target("JobSet.jobset.x-k8s.io", "llama"), "hang")


async def test_a_rank_replaced_meanwhile_is_left_alone_and_the_rest_restart(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    pytorchjob(kube_api)
    kube_api.fail("DELETE", "/pods/llama-worker-3$", 409, "Conflict")
    result = await make_backend().restart(_job_target("PyTorchJob.kubeflow.org", "llama"), "hang")
    assert result.details["already_gone"] == ["train/llama-worker-3"]
    assert len(result.details["deleted"]) == 15


async def test_api_unavailable_is_temporary_and_a_follower_never_writes(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    pytorchjob(kube_api)
    kube_api.fail("GET", "/api/v1/namespaces/train/pods$", 503, "ServiceUnavailable")
    with pytest.raises(TemporaryError):
        await make_backend().restart(_job_target("PyTorchJob.kubeflow.org", "llama"), "hang")
    follower = make_backend()
    follower._may_act = lambda: False
    with pytest.raises(TemporaryError, match="not the leader"):
        await follower.restart(_job_target("PyTorchJob.kubeflow.org", "llama"), "hang")
    assert not kube_api.deleted


async def test_job_migrate_cordons_the_suspect_node_then_restarts_the_whole_job(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    for node in NODES:
        kube_api.add_node(node)
    pytorchjob(kube_api)
    target = _job_target("PyTorchJob.kubeflow.org", "llama", node="gpu-b", uuid="GPU-b3")
    result = await make_backend().migrate(target, "rank 11 straggles")
    node = kube_api.nodes["gpu-b"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"][0]["key"] == "gpupulse.io/remediation"
    assert "unschedulable" not in kube_api.nodes["gpu-a"]["spec"]
    assert not kube_api.calls("POST", "/eviction"), "a gang is restarted, never evicted pod by pod"
    assert len(kube_api.deleted) == 16
    # the cordon came before the first rank was deleted, so the job cannot come back on gpu-b
    paths = [(r.method, r.path) for r in kube_api.requests if r.method in ("PATCH", "DELETE")]
    assert paths[0] == ("PATCH", "/api/v1/nodes/gpu-b")
    assert result.summary.startswith("cordoned gpu-b, then restarted PyTorchJob.kubeflow.org llama")
    assert result.details["cordoned"] == "gpu-b"


async def test_job_migrate_without_a_suspect_node_is_permanent(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    pytorchjob(kube_api)
    with pytest.raises(PermanentError, match="suspect rank's node"):
        await make_backend().migrate(_job_target("PyTorchJob.kubeflow.org", "llama"), "x")
    assert not kube_api.deleted


async def test_a_gang_restart_throttled_before_any_delete_changed_nothing_and_says_so(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    pytorchjob(kube_api)
    kube_api.throttle("DELETE", "/pods/llama-worker-", retry_after="45")  # APF: header only
    with pytest.raises(TemporaryError) as err:
        await make_backend().restart(_job_target("PyTorchJob.kubeflow.org", "llama"), "hang")
    assert err.value.nothing_changed  # a refusal, not an action for loops and budgets
    assert err.value.delay_seconds == 45.0  # tried again no sooner than the server asked
    assert kube_api.deleted == [] and len(kube_api.pods) == 16


async def test_a_jobset_restart_throttled_on_its_first_child_job_changed_nothing(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    jobset(kube_api)
    kube_api.throttle("DELETE", "/jobs/llama-workers-0$", retry_after="3", times=100)
    with pytest.raises(TemporaryError) as err:
        await make_backend().restart(_job_target("JobSet.jobset.x-k8s.io", "llama"), "hang")
    assert err.value.nothing_changed
    assert len(kube_api.pods) == 16


async def test_a_volcano_restart_whose_command_is_throttled_changed_nothing(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    kube_api.add_object("batch.volcano.sh/v1alpha1", "jobs", "train", "llama")
    kube_api.throttle("POST", "/commands$", retry_after="2")
    with pytest.raises(TemporaryError) as err:
        await make_backend().restart(_job_target("Job.batch.volcano.sh", "llama"), "collective hang")
    assert err.value.nothing_changed
    assert kube_api.objects_of("bus.volcano.sh/v1alpha1", "commands") == []


async def test_a_gang_restart_throttled_after_its_first_delete_is_an_action(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    pytorchjob(kube_api)
    kube_api.throttle("DELETE", "/pods/llama-worker-1$", retry_after="2", times=100)
    with pytest.raises(TemporaryError) as err:
        await make_backend().restart(_job_target("PyTorchJob.kubeflow.org", "llama"), "hang")
    assert [d[0] for d in kube_api.deleted] == ["train/llama-worker-0"]
    assert not err.value.nothing_changed  # rank 0 is gone: the gang restart has begun


async def test_a_job_migrate_whose_restart_is_throttled_after_the_cordon_is_an_action(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    pytorchjob(kube_api)
    for node in NODES:
        kube_api.add_node(node)
    kube_api.throttle("DELETE", "/pods/llama-worker-", retry_after="2", times=100)
    with pytest.raises(TemporaryError) as err:
        await make_backend().migrate(_job_target("PyTorchJob.kubeflow.org", "llama", node="gpu-a"), "x")
    assert kube_api.nodes["gpu-a"]["spec"]["unschedulable"] is True
    assert not err.value.nothing_changed  # the node was cordoned: a change, and the page says so
    assert "left cordoned" in err.value.left
