"""The edges of a gang restart (remediation/kube/jobs.py) against the in-process API server: only what our
controller UID owns is deleted, whichever way a stranger's UID sorts; a Job is restarted as its JobSet
only when a JobSet controls it; a Job read without the fields the API server defaults is held to their
defaults; the backoff budget at its exact edges; the summary and the refusal an operator reads; the
Volcano Command is the controller reference vcctl creates, named and worded within its limits for a
long job name and reason."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import PermanentError
from remediation.model import Target
from tests.fakes.kube_api import JSON, FakeKubeAPI
from tests.kube.test_job_backoff import TARGET, indexed

Make = Callable[..., KubernetesBackend]

# ours sorts between the two strangers', so a UID check that is an order, not an equality, lets one in
OURS = "55555555-0000-4000-8000-000000000000"
BELOW = "11111111-0000-4000-8000-000000000000"
ABOVE = "99999999-0000-4000-8000-000000000000"


def _target(kind: str, name: str = "llama") -> Target:
    return Target(kind="job", namespace="train", training_job_kind=kind, training_job=name)


def _owner(api_version: str, kind: str, name: str, uid: str) -> JSON:
    """An owner as add_pod/add_object read it (only its reference is needed)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "uid": uid}}


def _with_uid(obj: JSON, uid: str) -> JSON:
    obj["metadata"]["uid"] = uid  # the fake keeps this dict, so GET answers with it
    return obj


async def test_a_jobset_restart_deletes_only_the_child_jobs_its_uid_controls(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    js = _with_uid(kube_api.add_object("jobset.x-k8s.io/v1alpha2", "jobsets", "train", "llama"), OURS)
    label = {"jobset.sigs.k8s.io/jobset-name": "llama"}
    kube_api.add_object("batch/v1", "jobs", "train", "llama-workers-0", labels=label, controller=js)
    # an earlier JobSet of the same name left Jobs with the label; a Job with the label and no controller
    for i, uid in enumerate((BELOW, ABOVE)):
        old = _owner("jobset.x-k8s.io/v1alpha2", "JobSet", "llama", uid)
        kube_api.add_object("batch/v1", "jobs", "train", f"old-{i}", labels=label, controller=old)
    kube_api.add_object("batch/v1", "jobs", "train", "orphan", labels=label)
    result = await make_backend().restart(_target("JobSet.jobset.x-k8s.io"), "hang")
    assert result.details["deleted"] == ["train/llama-workers-0"]
    left = sorted(j["metadata"]["name"] for j in kube_api.objects_of("batch/v1", "jobs"))
    assert left == ["old-0", "old-1", "orphan"]


@pytest.mark.parametrize("kind", ["PyTorchJob.kubeflow.org", "Job.batch"])
async def test_a_pod_restart_deletes_only_the_pods_its_uid_controls(
    kube_api: FakeKubeAPI, make_backend: Make, kind: str
) -> None:
    if kind == "Job.batch":
        job = kube_api.add_object("batch/v1", "jobs", "train", "llama", spec={"completionMode": "Indexed"})
        labels = {"batch.kubernetes.io/controller-uid": OURS}
    else:
        job = kube_api.add_object("kubeflow.org/v1", "pytorchjobs", "train", "llama")
        labels = {"training.kubeflow.org/job-name": "llama"}
    _with_uid(job, OURS)
    kube_api.add_pod("train", "llama-0", "gpu-a", labels=labels, controller=job)
    # pods that carry the selector's label (anyone may set it) but another controller, or none
    for i, uid in enumerate((BELOW, ABOVE)):
        other = _owner(job["apiVersion"], job["kind"], "llama", uid)
        kube_api.add_pod("train", f"stranger-{i}", "gpu-a", labels=labels, controller=other)
    kube_api.add_pod("train", "unowned", "gpu-a", labels=labels)
    result = await make_backend().restart(_target(kind), "hang")
    assert result.details["deleted"] == ["train/llama-0"]
    assert sorted(name for _, name in kube_api.pods) == ["stranger-0", "stranger-1", "unowned"]


@pytest.mark.parametrize("parent", ["CronJob", "MPIJob"])  # sorting before and after "JobSet"
async def test_a_job_another_kind_controls_is_restarted_as_itself_not_as_a_jobset(
    kube_api: FakeKubeAPI, make_backend: Make, parent: str
) -> None:
    owner = _owner("example.io/v1", parent, "nightly", BELOW)
    job = kube_api.add_object(
        "batch/v1", "jobs", "train", "ddp", spec={"completionMode": "Indexed"}, controller=owner
    )
    uid = job["metadata"]["uid"]
    for rank in range(2):
        kube_api.add_pod(
            "train",
            f"ddp-{rank}",
            "gpu-a",
            labels={"batch.kubernetes.io/controller-uid": uid},
            controller=job,
        )
    result = await make_backend().restart(_target("Job.batch", "ddp"), "hang")
    assert result.details["owner"] == "Job.batch/ddp" and result.details["method"] == "delete_pods"
    assert sorted(result.details["deleted"]) == ["train/ddp-0", "train/ddp-1"]
    assert not kube_api.calls("GET", "/apis/jobset.x-k8s.io/")


async def test_the_summary_says_what_each_method_deleted(kube_api: FakeKubeAPI, make_backend: Make) -> None:
    js = kube_api.add_object("jobset.x-k8s.io/v1alpha2", "jobsets", "train", "llama")
    for i in range(2):
        kube_api.add_object(
            "batch/v1", "jobs", "train", f"llama-w-{i}", labels={"jobset.sigs.k8s.io/jobset-name": "llama"},
            controller=js,
        )  # fmt: skip
    result = await make_backend().restart(_target("JobSet.jobset.x-k8s.io"), "hang")
    assert result.summary == "restarted JobSet.jobset.x-k8s.io llama as a gang: deleted 2 child Job(s)"

    job = kube_api.add_object("kubeflow.org/v1", "pytorchjobs", "train", "gpt")
    for rank in range(3):
        labels = {"training.kubeflow.org/job-name": "gpt"}
        kube_api.add_pod("train", f"gpt-worker-{rank}", "gpu-a", labels=labels, controller=job)
    kube_api.fail("DELETE", "/pods/gpt-worker-1$", 404, "NotFound")
    result = await make_backend().restart(_target("PyTorchJob.kubeflow.org", "gpt"), "hang")
    assert (
        result.summary == "restarted PyTorchJob.kubeflow.org gpt as a gang: deleted 2 pod(s), 1 already gone"
    )

    kube_api.add_object("batch.volcano.sh/v1alpha1", "jobs", "train", "vc")
    result = await make_backend().restart(_target("Job.batch.volcano.sh", "vc"), "hang")
    (command,) = kube_api.objects_of("bus.volcano.sh/v1alpha1", "commands")
    assert result.summary == (
        f"restarted Job.batch.volcano.sh vc as a gang (Volcano Command {command['metadata']['name']}, "
        "action RestartJob)"
    )


async def test_the_volcano_command_is_controlled_by_the_job_as_vcctl_makes_it(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    """vcctl's commands carry metav1.NewControllerRef(job): the Job is the Command's controller."""
    job = kube_api.add_object("batch.volcano.sh/v1alpha1", "jobs", "train", "llama")
    await make_backend().restart(_target("Job.batch.volcano.sh"), "hang")
    (command,) = kube_api.objects_of("bus.volcano.sh/v1alpha1", "commands")
    ref = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "llama",
           "uid": job["metadata"]["uid"], "controller": True}  # fmt: skip
    assert command["target"] == ref and command["metadata"]["ownerReferences"] == [ref]


async def test_a_long_volcano_job_name_and_reason_are_cut_to_the_commands_limits(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    """The name keeps its first 40 characters and then the action (the API server cuts a generateName
    past 58 characters, which would cut "-restartjob-" off); the message the reason's first 1024."""
    name = "a" * 40 + "b" * 213  # 253, the longest name a custom resource may have
    reason = "".join(f"{i:04d}" for i in range(1500))  # 6000 characters, each cut point distinct
    kube_api.add_object("batch.volcano.sh/v1alpha1", "jobs", "train", name)
    await make_backend().restart(_target("Job.batch.volcano.sh", name), reason)
    (command,) = kube_api.objects_of("bus.volcano.sh/v1alpha1", "commands")
    assert command["metadata"]["generateName"] == "a" * 40 + "-restartjob-"
    assert command["message"] == reason[:1024]
    assert command["target"]["name"] == name


async def test_a_job_read_without_a_completion_mode_is_not_indexed(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    """The API server defaults completionMode to NonIndexed; a Job without it (an older server, a proxy
    that drops defaults) is refused the same way, never read as Indexed or failing on the comparison."""
    job = kube_api.add_object("batch/v1", "jobs", "train", "batch")
    del job["spec"]["completionMode"]
    with pytest.raises(PermanentError, match="not Indexed"):
        await make_backend().restart(_target("Job.batch", "batch"), "hang")
    assert not kube_api.deleted


@pytest.mark.parametrize(("ranks", "refused"), [(6, False), (7, True)])
async def test_a_job_read_without_a_backoff_limit_is_held_to_kubernetes_default_of_6(
    kube_api: FakeKubeAPI, make_backend: Make, ranks: int, refused: bool
) -> None:
    job = indexed(kube_api, ranks=ranks)
    del job["spec"]["backoffLimit"]
    if refused:
        with pytest.raises(PermanentError, match=rf"{ranks} pod\(s\) .*backoffLimit 6 \(0 failed so far\)"):
            await make_backend().restart(TARGET, "hang")
        assert not kube_api.deleted
    else:
        assert (await make_backend().restart(TARGET, "hang")).done and len(kube_api.deleted) == ranks


@pytest.mark.parametrize(
    ("limit", "earlier", "refused"),
    [(0, 0, True), (3, 2, False), (3, 3, True)],  # an index fails once its failures pass its limit
)
async def test_the_per_index_budget_counts_this_restart_as_one_more_failure_of_each_index(
    kube_api: FakeKubeAPI, make_backend: Make, limit: int, earlier: int, refused: bool
) -> None:
    indexed(kube_api, ranks=1, failures={0: earlier}, backoffLimitPerIndex=limit)
    if refused:
        with pytest.raises(
            PermanentError, match=rf"would fail its index\(es\) 0: .*backoffLimitPerIndex {limit}"
        ):
            await make_backend().restart(TARGET, "hang")
        assert not kube_api.deleted
    else:
        assert (await make_backend().restart(TARGET, "hang")).done and len(kube_api.deleted) == 1


async def test_an_unknown_kind_is_named_in_the_refusal_with_the_kinds_that_are_supported(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    with pytest.raises(PermanentError) as refused:
        await make_backend().restart(_target("LeaderWorkerSet.leaderworkerset.x-k8s.io"), "hang")
    assert str(refused.value).startswith(
        "training job kind LeaderWorkerSet.leaderworkerset.x-k8s.io has no gang restart gpupulse can ask for "
        "(supported: JobSet.jobset.x-k8s.io, PyTorchJob.kubeflow.org, Job.batch.volcano.sh, Job.batch)"
    )


@pytest.mark.parametrize(("limit", "refused"), [(5, True), (6, False)])
async def test_failures_so_far_and_the_ranks_restarted_add_up_against_the_backoff_limit(
    kube_api: FakeKubeAPI, make_backend: Make, limit: int, refused: bool
) -> None:
    indexed(kube_api, ranks=3, failed=3, backoffLimit=limit)  # 3 + 3 = 6 failures once restarted
    if refused:
        with pytest.raises(PermanentError, match=rf"backoffLimit {limit} \(3 failed so far\)"):
            await make_backend().restart(TARGET, "hang")
        assert not kube_api.deleted
    else:
        assert (await make_backend().restart(TARGET, "hang")).done and len(kube_api.deleted) == 3


@pytest.mark.parametrize("limit", [0, 1])
async def test_a_failure_count_that_is_not_a_number_counts_as_none(
    kube_api: FakeKubeAPI, make_backend: Make, limit: int
) -> None:
    """Anyone who may patch a pod may write its annotations: a count that does not parse is no count,
    never an exception out of the restart (nor a negative one); so is a status count of another shape."""
    indexed(kube_api, ranks=2, backoffLimitPerIndex=limit)
    for name in ("ddp-0-x", "ddp-1-x"):
        notes = kube_api.pods[("train", name)]["metadata"]["annotations"]
        notes["batch.kubernetes.io/job-index-failure-count"] = "many"
    if limit == 0:  # this restart is each index's first failure, past a limit of 0
        with pytest.raises(PermanentError, match=r"would fail its index\(es\) 0, 1"):
            await make_backend().restart(TARGET, "hang")
        return
    assert (await make_backend().restart(TARGET, "hang")).done and len(kube_api.deleted) == 2

    job = kube_api.add_object("batch/v1", "jobs", "train", "ddp2", spec={"completionMode": "Indexed"})
    job["status"] = {"failed": {"count": 9}}
    uid = job["metadata"]["uid"]
    for rank in range(6):  # 6 against the default backoffLimit 6: room, with no failures so far
        labels = {"batch.kubernetes.io/controller-uid": uid}
        kube_api.add_pod("train", f"ddp2-{rank}", "gpu-a", labels=labels, controller=job)
    target = Target(kind="job", namespace="train", training_job_kind="Job.batch", training_job="ddp2")
    assert (await make_backend().restart(target, "hang")).done and len(kube_api.deleted) == 8
