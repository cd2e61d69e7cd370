"""Which training job and rank a GPU process or a pod belongs to: from its pod (owner reference and
the labels each job controller stamps on its pods) and from the process environment torchrun and the
training operators set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR), read from /proc/<pid>/environ
where readable.

Pure functions over what the plug-ins hold (a pod's metadata, an environ blob), shared by two of
them: attribution names a GPU process's rank, progress picks the rank pods whose step it reads. So it
sits below both (exporter-layers in pyproject.toml), and neither imports the other. The label values
returned are bounded: a rank and a world size are small integers or nothing, a job name is the pod's
controller name (never a free-form environment value).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupulse.contract import job_kind

# the environ of one process is read up to this size: the keys we need come from the launcher, early
ENVIRON_LIMIT_BYTES = 256 * 1024
MAX_RANK = 1_000_000  # larger "ranks" are not ranks: the label stays empty rather than unbounded
_ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_HOST = re.compile(r"^[A-Za-z0-9.:_-]{1,253}$")

# Labels the controllers stamp on their pods (read in each project's source), most specific first: a
# JobSet's pods are also a batch Job's, and the gang is the JobSet.
_LABEL_OWNERS: tuple[tuple[str, str], ...] = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet.jobset.x-k8s.io"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet.leaderworkerset.x-k8s.io"),
)
# owner kinds whose pods are ranks of one job (a Deployment's or a DaemonSet's are not)
_RANK_OWNERS = frozenset({"PyTorchJob.kubeflow.org", "Job.batch.volcano.sh", "Job.batch", "StatefulSet.apps"})
# pod labels that carry a rank when the environment cannot be read
_INDEX_LABELS = ("batch.kubernetes.io/job-completion-index", "training.kubeflow.org/replica-index")


@dataclass(frozen=True)
class RankIdentity:
    """The job and rank of one GPU process (label values of gpu_training_rank_info)."""

    training_job_kind: str
    training_job: str
    rank: str = ""
    local_rank: str = ""
    world_size: str = ""


def parse_environ(blob: bytes) -> dict[str, str]:
    """The launcher variables of a NUL-separated environ blob (others are never kept)."""
    out: dict[str, str] = {}
    for item in blob[:ENVIRON_LIMIT_BYTES].split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode("ascii", "replace")
        if sep and name in _ENV_KEYS and name not in out:
            out[name] = value.decode("utf-8", "replace")
    return out


def read_environ(proc: Path, pid: int) -> dict[str, str]:
    """parse_environ of /proc/<pid>/environ; empty when it is gone or not ours to read."""
    try:
        with (proc / str(pid) / "environ").open("rb") as f:
            return parse_environ(f.read(ENVIRON_LIMIT_BYTES))
    except OSError:
        return {}


def _small_int(value: str | None) -> str:
    if value is None or not value.isdigit() or int(value) >= MAX_RANK:
        return ""
    return str(int(value))


def _controller(owner_refs: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    for ref in owner_refs:
        if ref.get("controller"):
            return job_kind(str(ref.get("apiVersion", "")), str(ref.get("kind", ""))), str(
                ref.get("name", "")
            )
    return None


def job_of_pod(labels: Mapping[str, str], owner_refs: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(training_job_kind, training_job) of a pod, or None when its controller runs no gang."""
    for label, kind in _LABEL_OWNERS:
        if labels.get(label):
            return kind, labels[label]
    owner = _controller(owner_refs)
    if owner is None or owner[0] not in _RANK_OWNERS or not owner[1]:
        return None
    if owner[0] == "Job.batch" and not labels.get(_INDEX_LABELS[0]):
        return None  # a non-indexed Job's pods are interchangeable workers, not ranks
    return owner


def rank_identity(
    labels: Mapping[str, str], owner_refs: Sequence[Mapping[str, Any]], env: Mapping[str, str]
) -> RankIdentity | None:
    """The job and rank of a process of this pod with this environment, or None when it is no rank.

    Without a pod (bare metal, Slurm) a torchrun process is still a rank: its job is named after the
    rendezvous endpoint it shares with its peers (MASTER_ADDR:MASTER_PORT)."""
    job = job_of_pod(labels, owner_refs)
    rank = _small_int(env.get("RANK"))
    if job is None:
        addr, port = env.get("MASTER_ADDR", ""), _small_int(env.get("MASTER_PORT"))
        if not (rank and _HOST.match(addr) and port):
            return None
        job = ("torchrun", f"{addr}:{port}")
    if not rank:
        rank = next((_small_int(labels.get(k)) for k in _INDEX_LABELS if _small_int(labels.get(k))), "")
    return RankIdentity(
        training_job_kind=job[0],
        training_job=job[1],
        rank=rank,
        local_rank=_small_int(env.get("LOCAL_RANK")),
        world_size=_small_int(env.get("WORLD_SIZE")),
    )


@dataclass(frozen=True)
class PodMeta:
    """The parts of a pod's metadata that say which job it belongs to."""

    labels: Mapping[str, str]
    owner_refs: tuple[Mapping[str, Any], ...]  # the controller ownerReference only (at most one)


def pod_meta(pod: Mapping[str, Any]) -> PodMeta:
    """The labels (string values only) and the controller ownerReference of a pod object."""
    meta = pod.get("metadata") or {}
    raw = meta.get("labels")
    labels = (
        {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(raw, Mapping)
        else {}
    )
    refs = meta.get("ownerReferences")
    owners = tuple(
        {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
        for r in (refs if isinstance(refs, list) else ())
        if isinstance(r, Mapping) and r.get("controller") is True
    )[:1]
    return PodMeta(labels, owners)
