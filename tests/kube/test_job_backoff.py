"""An Indexed Job's gang restart spends its failure budget: every deleted running pod is a failure
against backoffLimit (or its index's backoffLimitPerIndex), and past it the Job controller fails the
whole Job (tests/kube/test_real_gang.py shows that on the real one). A restart that would go past it
is refused before any pod is deleted, so the ladder pages instead of killing the job."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.errors import PermanentError
from remediation.model import Target
from tests.fakes.kube_api import JSON, FakeKubeAPI

Make = Callable[..., KubernetesBackend]
TARGET = Target(kind="job", namespace="train", training_job_kind="Job.batch", training_job="ddp")


def indexed(api: FakeKubeAPI, ranks: int, failed: int = 0, failures: dict[int, int] | None = None,
            **spec: object) -> JSON:  # fmt: skip
    job = api.add_object("batch/v1", "jobs", "train", "ddp", spec={"completionMode": "Indexed", **spec})
    job["status"] = {"failed": failed}
    uid = job["metadata"]["uid"]
    for rank in range(ranks):
        notes = {"batch.kubernetes.io/job-completion-index": str(rank)}
        if failures and rank in failures:
            notes["batch.kubernetes.io/job-index-failure-count"] = str(failures[rank])
        api.add_pod("train", f"ddp-{rank}-x", "gpu-a", labels={"batch.kubernetes.io/controller-uid": uid},
                    annotations=notes, controller=job)  # fmt: skip
    return job


async def test_more_ranks_than_the_backoff_limit_is_refused_before_any_delete(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    indexed(kube_api, ranks=8)  # backoffLimit defaults to 6
    with pytest.raises(PermanentError, match=r"8 pod\(s\) of Job train/ddp would fail it.*backoffLimit 6"):
        await make_backend().restart(TARGET, "hang")
    assert not kube_api.deleted and len(kube_api.pods) == 8


async def test_failures_so_far_count_and_a_restart_that_fits_goes_ahead(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    indexed(kube_api, ranks=2, failed=5, backoffLimit=6)
    with pytest.raises(PermanentError, match="5 failed so far"):
        await make_backend().restart(TARGET, "hang")
    kube_api.objects[("batch/v1", "jobs", "train", "ddp")]["status"]["failed"] = 4
    result = await make_backend().restart(TARGET, "hang")
    assert result.done and len(kube_api.deleted) == 2


async def test_per_index_limits_name_the_index_that_would_fail(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    indexed(kube_api, ranks=3, failures={1: 1}, backoffLimitPerIndex=1)
    with pytest.raises(PermanentError, match=r"would fail its index\(es\) 1: .*backoffLimitPerIndex 1"):
        await make_backend().restart(TARGET, "hang")
    assert not kube_api.deleted


async def test_per_index_limits_with_room_restart_every_rank(
    kube_api: FakeKubeAPI, make_backend: Make
) -> None:
    indexed(kube_api, ranks=12, failures={1: 1}, backoffLimitPerIndex=2)
    result = await make_backend().restart(TARGET, "hang")
    assert result.done and len(kube_api.deleted) == 12
