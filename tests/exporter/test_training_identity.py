"""Job identity of a GPU process: the pod's controller (owner reference, or the label a JobSet or
LeaderWorkerSet stamps), its rank from the launcher environment or the pod's index label, and bounded
label values whatever the environment holds."""

from __future__ import annotations

from pathlib import Path

from exporter.collectors.training import (
    ENVIRON_LIMIT_BYTES,
    RankIdentity,
    job_of_pod,
    parse_environ,
    rank_identity,
    read_environ,
)


def _ref(api_version: str, kind: str, name: str) -> dict[str, object]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": "u", "controller": True}


TORCHRUN = {
    "RANK": "11",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "16",
    "MASTER_ADDR": "llama-master-0",
    "MASTER_PORT": "29500",
}


def test_each_supported_controller_names_the_job() -> None:
    assert job_of_pod({}, [_ref("kubeflow.org/v1", "PyTorchJob", "llama")]) == (
        "PyTorchJob.kubeflow.org",
        "llama",
    )
    assert job_of_pod({}, [_ref("batch.volcano.sh/v1alpha1", "Job", "vc")]) == ("Job.batch.volcano.sh", "vc")
    indexed = {"batch.kubernetes.io/job-completion-index": "2"}
    assert job_of_pod(indexed, [_ref("batch/v1", "Job", "ddp")]) == ("Job.batch", "ddp")
    assert job_of_pod({}, [_ref("apps/v1", "StatefulSet", "trainer")]) == ("StatefulSet.apps", "trainer")


def test_a_jobset_pod_belongs_to_the_jobset_not_to_its_child_job() -> None:
    labels = {"jobset.sigs.k8s.io/jobset-name": "llama", "batch.kubernetes.io/job-completion-index": "0"}
    assert job_of_pod(labels, [_ref("batch/v1", "Job", "llama-workers-1")]) == (
        "JobSet.jobset.x-k8s.io",
        "llama",
    )


def test_workloads_that_are_not_gangs_have_no_job() -> None:
    assert job_of_pod({}, [_ref("apps/v1", "ReplicaSet", "vllm-7d9f")]) is None
    assert job_of_pod({}, [_ref("apps/v1", "DaemonSet", "agent")]) is None
    assert job_of_pod({}, [_ref("batch/v1", "Job", "etl")]) is None, "a non-indexed Job has no ranks"
    assert job_of_pod({}, []) is None


def test_the_rank_comes_from_the_environment_else_from_the_pod_index() -> None:
    owner = [_ref("kubeflow.org/v1", "PyTorchJob", "llama")]
    assert rank_identity({}, owner, TORCHRUN) == RankIdentity(
        "PyTorchJob.kubeflow.org", "llama", "11", "3", "16"
    )
    by_label = rank_identity({"training.kubeflow.org/replica-index": "4"}, owner, {})
    assert by_label == RankIdentity("PyTorchJob.kubeflow.org", "llama", "4")


def test_a_torchrun_job_without_a_pod_is_named_by_its_rendezvous() -> None:
    ident = rank_identity({}, [], TORCHRUN)
    assert ident == RankIdentity("torchrun", "llama-master-0:29500", "11", "3", "16")
    assert rank_identity({}, [], {"RANK": "1"}) is None, "no rendezvous: nothing names the job"
    assert rank_identity({}, [], {**TORCHRUN, "MASTER_ADDR": "a b;$(x)"}) is None


def test_hostile_environment_values_never_become_label_values() -> None:
    owner = [_ref("kubeflow.org/v1", "PyTorchJob", "llama")]
    env = {"RANK": "-1", "LOCAL_RANK": "99999999999", "WORLD_SIZE": "sixteen"}
    assert rank_identity({}, owner, env) == RankIdentity("PyTorchJob.kubeflow.org", "llama")


def test_environ_parsing_keeps_only_launcher_keys_and_is_bounded(tmp_path: Path) -> None:
    blob = b"PATH=/bin\0RANK=3\0SECRET_TOKEN=hunter2\0RANK=9\0WORLD_SIZE=8\0garbage\0\xff\xfe=1\0"
    assert parse_environ(blob) == {"RANK": "3", "WORLD_SIZE": "8"}
    huge = b"X=" + b"y" * ENVIRON_LIMIT_BYTES + b"\0RANK=5\0"
    assert parse_environ(huge) == {}, "what lies past the limit is not read"
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "environ").write_bytes(b"RANK=1\0LOCAL_RANK=1\0")
    assert read_environ(tmp_path, 42) == {"RANK": "1", "LOCAL_RANK": "1"}
    assert read_environ(tmp_path, 43) == {}, "a process that is gone, or not ours to read"
