"""A distributed training job restarted as a gang, through its top controller, never one pod at a time.

How each supported owner restarts (read from each project's source and docs; docs/design/training.md):

- JobSet (jobset.x-k8s.io/v1alpha2): the JobSet controller creates every child Job of its
  replicatedJobs that does not exist (constructJobsFromTemplate skips the ones it owns), and its own
  restart is "recreate all child Jobs". We delete the child Jobs it controls (label
  jobset.sigs.k8s.io/jobset-name, owner UID checked) with a UID precondition and
  propagationPolicy Foreground: a Job stays until its pods are gone, so the controller recreates it
  only after every old rank has stopped. status.restarts stays the JobSet controller's.
- PyTorchJob (kubeflow.org/v1, training-operator): the operator recreates every replica pod that is
  missing; deleting all of the job's pods (label training.kubeflow.org/job-name) restarts every rank.
- Volcano Job (batch.volcano.sh/v1alpha1): a bus.volcano.sh/v1alpha1 Command with action RestartJob
  targeting the Job (what `vcctl job suspend/resume` create for their actions); the Volcano job
  controller kills every pod, counts a retry and recreates them, as its RestartJob policy does.
- Indexed Job (batch/v1, completionMode Indexed): the Job controller recreates the pod of every index
  that has none; we delete every pod of the Job (label batch.kubernetes.io/controller-uid). Each
  deleted running pod counts as a failure against backoffLimit (or its index's backoffLimitPerIndex;
  a plain delete sets no DisruptionTarget condition for a podFailurePolicy to ignore), and past it the
  Job controller fails the whole Job (tests/kube/test_real_gang.py shows both on the real one): a
  restart that would go past it is refused, so the ladder pages. A Job a JobSet controls is
  restarted as its JobSet.

Anything else (LeaderWorkerSet, StatefulSet, a CRD we do not know) is a PermanentError: the ladder pages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from remediation.errors import KubeConflict, KubeNotFound, PermanentError
from remediation.kube.client import JSON, KubeClient
from remediation.kube.pods import PodRef, controller_owner

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
PYTORCHJOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_INDEX_FAILURES_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
JOB_DEFAULT_BACKOFF_LIMIT = 6  # batch/v1 defaults backoffLimit to 6 when backoffLimitPerIndex is unset

Method = Literal["delete_child_jobs", "delete_pods", "volcano_command"]


@dataclass(frozen=True)
class OwnerKind:
    """A supported training-job controller: where its object lives and how a restart is asked for."""

    kind: str  # the training_job_kind label value (gpupulse/contract.py JOB_KINDS)
    group: str
    version: str
    plural: str
    method: Method


OWNER_KINDS: dict[str, OwnerKind] = {
    o.kind: o
    for o in (
        OwnerKind("JobSet.jobset.x-k8s.io", "jobset.x-k8s.io", "v1alpha2", "jobsets", "delete_child_jobs"),
        OwnerKind("PyTorchJob.kubeflow.org", "kubeflow.org", "v1", "pytorchjobs", "delete_pods"),
        OwnerKind("Job.batch.volcano.sh", "batch.volcano.sh", "v1alpha1", "jobs", "volcano_command"),
        OwnerKind("Job.batch", "batch", "v1", "jobs", "delete_pods"),
    )
}


@dataclass(frozen=True)
class JobRestart:
    """What one gang restart did (it goes into the ledger's details)."""

    kind: str
    name: str
    uid: str
    method: Method
    deleted: tuple[str, ...] = ()  # ns/name of the Jobs or pods deleted
    already_gone: tuple[str, ...] = ()
    command: str = ""

    def summary(self) -> str:
        what = f"{self.kind} {self.name}"
        if self.method == "volcano_command":
            return f"restarted {what} as a gang (Volcano Command {self.command}, action RestartJob)"
        noun = "child Job(s)" if self.method == "delete_child_jobs" else "pod(s)"
        gone = f", {len(self.already_gone)} already gone" if self.already_gone else ""
        return f"restarted {what} as a gang: deleted {len(self.deleted)} {noun}{gone}"

    def details(self) -> dict[str, Any]:
        return {
            "owner": f"{self.kind}/{self.name}",
            "owner_uid": self.uid,
            "method": self.method,
            "deleted": list(self.deleted),
            "already_gone": list(self.already_gone),
            "command": self.command,
        }


def owner_kind(kind: str) -> OwnerKind:
    """The supported controller of this training_job_kind; PermanentError (so a page) otherwise."""
    owner = OWNER_KINDS.get(kind)
    if owner is None:
        supported = ", ".join(OWNER_KINDS)
        raise PermanentError(
            f"training job kind {kind or '(none)'} has no gang restart gpupulse can ask for "
            f"(supported: {supported}); restarting its pods one by one would not restart the gang"
        )
    return owner


async def read_owner(client: KubeClient, owner: OwnerKind, namespace: str, name: str) -> JSON:
    """The job's controller object; PermanentError when it is gone."""
    try:
        if owner.group == "batch":
            return await client.get_job(namespace, name)
        return await client.get_custom_object(owner.group, owner.version, namespace, owner.plural, name)
    except KubeNotFound as exc:
        raise PermanentError(f"{owner.kind} {namespace}/{name} no longer exists") from exc


async def restart_job(
    client: KubeClient,
    kind: str,
    namespace: str,
    name: str,
    reason: str,
    guard: Callable[[], None],
    written: list[str] | None = None,
) -> JobRestart:
    """Restart every rank of the job at once through its controller (guard() before every write).

    `written` gets each object the server accepted a write for, as it happens: when a later call
    fails, the caller can still tell a restart begun from one the server never saw."""
    written = [] if written is None else written
    owner = owner_kind(kind)
    obj = await read_owner(client, owner, namespace, name)
    if owner.kind == "Job.batch":
        parent = controller_owner(obj)
        if parent is not None and parent.get("kind") == "JobSet":
            # the gang is the JobSet: restarting one of its Jobs would leave the others waiting
            return await restart_job(
                client, "JobSet.jobset.x-k8s.io", namespace, str(parent["name"]), reason, guard, written
            )
        if (obj.get("spec") or {}).get("completionMode") != "Indexed":
            raise PermanentError(
                f"Job {namespace}/{name} is not Indexed: its pods have no stable rank to restart as a gang"
            )
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid", ""))
    if meta.get("deletionTimestamp"):
        raise PermanentError(f"{owner.kind} {namespace}/{name} is being deleted")
    if owner.method == "volcano_command":
        command = await _volcano_restart(client, obj, namespace, name, reason, guard)
        written.append(f"{namespace}/{command}")
        return JobRestart(owner.kind, name, uid, owner.method, command=command)
    if owner.method == "delete_child_jobs":
        children = [
            j
            for j in await client.list_jobs(namespace, f"{JOBSET_NAME_LABEL}={name}")
            if (controller_owner(j) or {}).get("uid") == uid
        ]
        deleted, gone = await _delete_all(
            children, lambda ns, n, u: client.delete_job(ns, n, u, "Foreground"), guard, written
        )
        return JobRestart(owner.kind, name, uid, owner.method, deleted, gone)
    selector = (
        f"{JOB_CONTROLLER_UID_LABEL}={uid}"
        if owner.kind == "Job.batch"
        else f"{PYTORCHJOB_NAME_LABEL}={name}"
    )
    pods = [
        p
        for p in await client.list_pods(namespace, selector)
        if (controller_owner(p) or {}).get("uid") == uid
    ]
    if owner.kind == "Job.batch":
        check_backoff_budget(obj, pods)
    deleted, gone = await _delete_all(pods, lambda ns, n, u: client.delete_pod(ns, n, u), guard, written)
    return JobRestart(owner.kind, name, uid, owner.method, deleted, gone)


def check_backoff_budget(job: JSON, pods: list[JSON]) -> None:
    """PermanentError when deleting `pods` would make the Job controller fail the Job: each one is a
    failure against backoffLimit (failed > backoffLimit fails the Job) or, with backoffLimitPerIndex,
    against its index's limit (the pod's job-index-failure-count annotation counts earlier ones)."""
    spec, status, meta = job.get("spec") or {}, job.get("status") or {}, job.get("metadata") or {}
    where = f"Job {meta.get('namespace', '')}/{meta.get('name', '')}"
    per_index = spec.get("backoffLimitPerIndex")
    if per_index is not None:
        over = sorted(
            str(notes.get("batch.kubernetes.io/job-completion-index", "?"))
            for notes in (((p.get("metadata") or {}).get("annotations") or {}) for p in pods)
            if _int(notes.get(JOB_INDEX_FAILURES_ANNOTATION)) + 1 > _int(per_index)
        )
        if over:
            raise PermanentError(
                f"restarting {where} would fail its index(es) {', '.join(over)}: each deleted pod counts "
                f"against backoffLimitPerIndex {per_index}"
            )
        return
    limit = _int(spec.get("backoffLimit", JOB_DEFAULT_BACKOFF_LIMIT))
    failed = _int(status.get("failed"))
    if failed + len(pods) > limit:
        raise PermanentError(
            f"restarting the {len(pods)} pod(s) of {where} would fail it: each deleted pod counts as a "
            f"failure against its backoffLimit {limit} ({failed} failed so far); a larger backoffLimit "
            "or backoffLimitPerIndex lets gpupulse restart it"
        )


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


async def _delete_all(
    objs: list[JSON],
    delete: Callable[[str, str, str], Any],
    guard: Callable[[], None],
    written: list[str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not objs:
        raise PermanentError("the job has nothing to restart (no child Jobs or pods it controls)")
    deleted, gone = [], []
    for obj in objs:
        ref = PodRef.of(obj)
        guard()
        try:
            await delete(ref.namespace, ref.name, ref.uid)
            deleted.append(ref.key)
            written.append(ref.key)
        except (KubeNotFound, KubeConflict):
            gone.append(ref.key)  # gone, or the name belongs to a replacement: never delete that one
    return tuple(deleted), tuple(gone)


async def _volcano_restart(
    client: KubeClient, job: JSON, namespace: str, name: str, reason: str, guard: Callable[[], None]
) -> str:
    meta = job.get("metadata") or {}
    target = {
        "apiVersion": str(job.get("apiVersion") or "batch.volcano.sh/v1alpha1"),
        "kind": "Job",
        "name": name,
        "uid": str(meta.get("uid", "")),
        "controller": True,
    }
    body = {
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {
            "generateName": f"{name[:40]}-restartjob-",
            "namespace": namespace,
            "ownerReferences": [target],
        },
        "action": "RestartJob",
        "target": target,
        "reason": "GpupulseRemediation",
        "message": reason[:1024],
    }
    guard()
    created = await client.create_custom_object("bus.volcano.sh", "v1alpha1", namespace, "commands", body)
    return str((created.get("metadata") or {}).get("name", ""))
