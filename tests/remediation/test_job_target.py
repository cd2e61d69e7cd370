"""A job target from the alert labels, its identity across restarts, and its ledger columns (an old
ledger gains them on open)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from remediation.decide.pages import job_evidence
from remediation.ladder import incident_identity, loop_identity, target_from_labels, target_problem
from remediation.ledger import Ledger, connect
from remediation.model import Target

JOB = {
    "alertname": "TrainingRankStraggler",
    "target_kind": "job",
    "namespace": "train",
    "training_job": "llama",
    "training_job_kind": "JobSet.jobset.x-k8s.io",
    "node": "gpu-b",
    "uuid": "GPU-b3",
    "gpu": "3",
    "pod": "llama-workers-1-3-x",
    "rank": "11",
    "signal": "sm_clock",
}


def test_a_job_target_carries_the_job_and_its_suspect_rank() -> None:
    target, known = target_from_labels(JOB)
    assert known and target.kind == "job"
    assert (target.namespace, target.training_job_kind, target.training_job) == (
        "train",
        "JobSet.jobset.x-k8s.io",
        "llama",
    )
    assert (target.node, target.uuid, target.pod) == ("gpu-b", "GPU-b3", "llama-workers-1-3-x")
    assert target_problem(target, known) == ""


def test_one_incident_per_job_whichever_rank_is_suspect_and_the_same_identity_after_a_restart() -> None:
    a, _ = target_from_labels(JOB)
    b, _ = target_from_labels({**JOB, "node": "gpu-a", "uuid": "GPU-a0", "pod": "llama-workers-0-0-y"})
    assert incident_identity(a) == incident_identity(b) == "job:train/JobSet.jobset.x-k8s.io/llama"
    assert loop_identity(a) == loop_identity(b) == incident_identity(a)


def test_a_job_target_without_its_kind_or_name_is_not_identified() -> None:
    target, known = target_from_labels({k: v for k, v in JOB.items() if k != "training_job_kind"})
    assert "training_job_kind" in target_problem(target, known)
    # the job label alone (no target_kind) is still a job: never one of its pods
    guessed, known = target_from_labels({k: v for k, v in JOB.items() if k != "target_kind"})
    assert guessed.kind == "job" and not known


def test_the_evidence_names_rank_pod_gpu_node_and_signal() -> None:
    target, _ = target_from_labels(JOB)
    text = job_evidence(target, JOB)
    assert text == (
        " (suspect: rank 11, pod train/llama-workers-1-3-x, GPU 3 (GPU-b3), node gpu-b, signal sm_clock)"
    )
    assert job_evidence(Target(kind="job", namespace="train"), {}) == " (no single rank is suspect)"
    assert job_evidence(Target(kind="pod"), JOB) == ""


def test_an_old_ledger_gains_the_job_columns_and_a_job_target_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    connect(path).close()
    old = sqlite3.connect(path)  # a ledger of the release before job targets
    for column in ("target_training_job_kind", "target_training_job"):
        old.execute(f"ALTER TABLE rem_incidents DROP COLUMN {column}")
    old.execute(
        "INSERT INTO rem_incidents (key, signature, fault_class, alertname, target_kind, target_node, "
        "target_namespace, target_pod, target_uuid, loop_key, state, labels, annotations, opened_at, "
        "updated_at) VALUES ('k', 's', 'thermal', 'A', 'gpu', 'n', '', '', 'u', 'gpu:n/u', 'open', '{}', "
        "'{}', 1, 1)"
    )
    old.commit()
    old.close()
    conn = connect(path)
    cols = {str(r[1]) for r in conn.execute("PRAGMA table_info(rem_incidents)")}
    assert {"target_training_job_kind", "target_training_job"} <= cols
    ledger = Ledger(conn)
    before = ledger.incident(1)
    assert before is not None and before.target.training_job == ""
    target, _ = target_from_labels(JOB)
    with ledger.transaction():
        new_id = ledger.insert_incident(
            {
                "key": "training-rank-straggler|job:train/JobSet.jobset.x-k8s.io/llama",
                "signature": "training-rank-straggler",
                "fault_class": "training_straggler",
                "alertname": "TrainingRankStraggler",
                "target": target,
                "loop_key": loop_identity(target),
                "state": "open",
                "labels": JOB,
                "annotations": {},
                "opened_at": 2.0,
                "updated_at": 2.0,
            }
        )
    back = ledger.incident(new_id)
    assert back is not None and back.target == target
    conn.close()
