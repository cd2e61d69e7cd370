"""The ladder itself: which rung and attempt come next, and how a target is identified."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import cast

from gpupulse.contract import TARGET_IDENTITY, TARGET_KINDS, TRAINING_JOB_KIND_LABEL, TRAINING_JOB_LABEL
from remediation.model import Rung, Target, TargetKind
from remediation.signatures import LadderSpec

# Kubernetes random suffixes use this alphabet (no vowels), so "my-redis" is never mistaken for one.
_SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]"
_DEPLOYMENT_POD = re.compile(rf"^(?P<w>.+)-{_SUFFIX}{{6,10}}-{_SUFFIX}{{5}}$")
_GENERATED_POD = re.compile(rf"^(?P<w>.+)-{_SUFFIX}{{5}}$")


def first_step(spec: LadderSpec, blocked: frozenset[Rung] = frozenset()) -> tuple[Rung, int]:
    """The first rung of a new incident (page when everything else is ruled out)."""
    for rung in spec.rungs:
        if rung not in blocked:
            return rung, 1
    return "page", 1


def next_step(
    spec: LadderSpec, rung: str, attempt: int, blocked: frozenset[Rung] = frozenset()
) -> tuple[Rung, int]:
    """After (rung, attempt) failed: another attempt of the same rung, else the next allowed rung."""
    if (
        rung in ("restart", "migrate")
        and rung not in blocked
        and attempt < spec.attempts_for(cast(Rung, rung))
    ):
        return cast(Rung, rung), attempt + 1
    later = spec.rungs[list(spec.rungs).index(rung) + 1 :] if rung in spec.rungs else spec.rungs
    for nxt in later:
        if nxt not in blocked:
            return nxt, 1
    return "page", 1


def target_problem(target: Target, kind_known: bool) -> str:
    """Why this target cannot be acted on (empty when its identity is complete per docs/alerts.md)."""
    if not kind_known:
        return "alert has no valid target_kind label; the controller never guesses a target"
    missing = [name for name in TARGET_IDENTITY[target.kind] if not getattr(target, name)]
    if missing:
        return f"target_kind {target.kind} without {', '.join(missing)}: the target is not identified"
    return ""


def target_from_labels(labels: Mapping[str, str]) -> tuple[Target, bool]:
    """The remediation target per docs/alerts.md; the flag is False when target_kind was missing/invalid."""
    kind_label = labels.get("target_kind", "")
    known = kind_label in TARGET_KINDS
    if known:
        kind = cast(TargetKind, kind_label)
    elif labels.get(TRAINING_JOB_LABEL):
        kind = "job"
    elif labels.get("pod"):
        kind = "pod"
    elif labels.get("uuid"):
        kind = "gpu"
    elif labels.get("node"):
        kind = "node"
    else:
        kind = "exporter"
    node = labels.get("node", "")
    if kind == "exporter" and not node:
        node = labels.get("instance", "")
    if kind == "job":
        # the suspect rank's node, GPU and pod ride along: the evidence, and what a migrate cordons
        return Target(
            kind="job",
            node=node,
            namespace=labels.get("namespace", ""),
            pod=labels.get("pod", ""),
            uuid=labels.get("uuid", ""),
            training_job_kind=labels.get(TRAINING_JOB_KIND_LABEL, ""),
            training_job=labels.get(TRAINING_JOB_LABEL, ""),
        ), known
    target = Target(
        kind=kind,
        node=node,
        namespace=labels.get("namespace", "") if kind in ("pod", "controller") else "",
        pod=labels.get("pod", "") if kind == "pod" else "",
        uuid=labels.get("uuid", "") if kind in ("pod", "gpu") else "",
    )
    return target, known


def workload_name(pod: str) -> str:
    """The owner name a generated pod name was made from (deployment/replicaset/daemonset pods)."""
    for pattern in (_DEPLOYMENT_POD, _GENERATED_POD):
        m = pattern.match(pod)
        if m:
            return m.group("w")
    return pod


def incident_identity(target: Target) -> str:
    """Exact identity of a target (one incident per signature and identity)."""
    if target.kind == "pod":
        return f"pod:{target.namespace}/{target.pod}"
    if target.kind == "gpu":
        return f"gpu:{target.node}/{target.uuid}"
    if target.kind == "job":
        # the job, not the suspect rank: every alert about one job is one incident per signature, and
        # a restarted job keeps its name, so this is also its identity across restarts
        return f"job:{target.namespace}/{target.training_job_kind}/{target.training_job}"
    if target.kind == "controller":
        return f"controller:{target.namespace}"
    return f"{target.kind}:{target.node}"


def loop_identity(target: Target) -> str:
    """Identity that survives a restart: a restarted pod gets a new name but the same workload."""
    if target.kind == "pod":
        return f"pod:{target.namespace}/{workload_name(target.pod)}"
    return incident_identity(target)
