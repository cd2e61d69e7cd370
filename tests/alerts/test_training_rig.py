"""The training rig's own bookkeeping: which controller incidents belong to a replayed case."""

from __future__ import annotations

from typing import Any

from tests.alerts.training_rig import CASES, NAMESPACE, incident_of


def _incident(**target: str) -> dict[str, Any]:
    return {"id": 1, "signature": "training-job-hung", "target": {"kind": "job", **target}}


def test_incidents_are_matched_to_a_case_by_the_exact_job_not_a_substring() -> None:
    hang = CASES["hang"]
    job = {"namespace": NAMESPACE, "training_job_kind": "PyTorchJob.kubeflow.org"}
    assert incident_of(hang, _incident(training_job=hang.job, **job))
    # a job whose name only begins with the case's job, and one that mentions it elsewhere
    assert not incident_of(hang, _incident(training_job=f"{hang.job}2", **job))
    assert not incident_of(hang, _incident(training_job="other", pod=f"x-{hang.job}", **job))
    assert not incident_of(hang, {"id": 2, "reason": f"about {hang.job}", "target": {"kind": "job"}})
    # the same job name in another namespace is another job
    assert not incident_of(hang, _incident(training_job=hang.job, namespace="elsewhere"))
    # its pods and nodes are its own; malformed items are nobody's
    assert incident_of(
        hang, {"target": {"kind": "pod", "namespace": NAMESPACE, "pod": f"{hang.job}-worker-3"}}
    )
    assert incident_of(hang, {"target": {"kind": "node", "node": hang.nodes[1]}})
    assert not incident_of(hang, {"target": f"job:{NAMESPACE}/{hang.job}"})
    assert not incident_of(hang, {})
