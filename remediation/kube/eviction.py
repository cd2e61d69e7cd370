"""Evict pods through the Eviction API, backing off while PodDisruptionBudgets say no."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from gpupulse.clock import Clock
from remediation.errors import KubeConflict, KubeNotFound, KubeTooManyRequests, KubeUnavailable
from remediation.kube.client import KubeClient
from remediation.kube.pods import PodRef

DeadlinePolicy = Literal["fail", "delete"]
# kube-apiserver's 500 (no reason) for a pod that several PodDisruptionBudgets select: a retry never helps
_SEVERAL_PDBS = "more than one PodDisruptionBudget"


@dataclass(frozen=True)
class EvictionSettings:
    """Backoff and deadline for one drain."""

    deadline_seconds: float = 300.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 30.0
    concurrency: int = 8
    # how often an evicted pod is read again until it is gone
    gone_poll_seconds: float = 1.0


@dataclass
class EvictionReport:
    """Outcome per pod key (namespace/name)."""

    evicted: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)  # deleted or replaced before we got to it
    blocked: dict[str, str] = field(default_factory=dict)  # key -> last refusal
    misconfigured: dict[str, str] = field(default_factory=dict)  # 500: several PDBs select the pod
    # evicted, but still there at the deadline: an eviction is a graceful delete that the node's
    # kubelet confirms, and a hung node never does (kubectl drain waits for the same)
    terminating: dict[str, str] = field(default_factory=dict)
    attempts: int = 0


async def evict_pods(
    client: KubeClient,
    pods: Iterable[PodRef],
    settings: EvictionSettings,
    clock: Clock,
    guard: Callable[[], None],
    terminating: Iterable[PodRef] = (),
) -> EvictionReport:
    """Evict every pod, each retrying 429s with exponential backoff until a shared deadline.

    Pods of `terminating` were evicted or deleted before (an earlier attempt, a human): they are not
    evicted again, only waited for until the same deadline, so a pod a hung kubelet keeps is reported
    as terminating on every attempt, never taken as moved."""
    report = EvictionReport()
    deadline = clock.monotonic() + settings.deadline_seconds
    limit = asyncio.Semaphore(max(1, settings.concurrency))

    async def wait(pod: PodRef) -> None:
        async with limit:
            guard()
            still = await _wait_gone(client, pod, deadline, settings.gone_poll_seconds, clock)
            if still:
                report.terminating[pod.key] = still
            else:
                report.gone.append(pod.key)

    async def one(pod: PodRef) -> None:
        delay = settings.backoff_initial_seconds
        async with limit:
            while True:
                guard()
                report.attempts += 1
                try:
                    await client.evict_pod(pod.namespace, pod.name, pod.uid)
                    still = await _wait_gone(client, pod, deadline, settings.gone_poll_seconds, clock)
                    if still:
                        report.terminating[pod.key] = still
                    else:
                        report.evicted.append(pod.key)
                    return
                except (KubeNotFound, KubeConflict):
                    # 409 here means the UID precondition failed: the pod we meant is already gone
                    report.gone.append(pod.key)
                    return
                except KubeTooManyRequests as exc:
                    last = _refusal(exc)
                    # the server's own hint (a budget it has not computed yet says 10 s) is a floor
                    delay = max(delay, exc.retry_after_seconds)
                except KubeUnavailable as exc:
                    if exc.status == 500 and _SEVERAL_PDBS in exc.message:
                        report.misconfigured[pod.key] = exc.message
                        return
                    # any other 500 (an etcd timeout, a failing admission webhook) may pass: retry
                    last = str(exc)
                left = deadline - clock.monotonic()
                if left <= 0:
                    report.blocked[pod.key] = last
                    return
                await clock.sleep(min(delay, left))
                delay = min(delay * 2, settings.backoff_max_seconds)

    try:
        async with asyncio.TaskGroup() as group:
            for pod in pods:
                group.create_task(one(pod))
            for pod in terminating:
                group.create_task(wait(pod))
    except BaseExceptionGroup as failed:
        # the siblings are cancelled by now; hand the first cause to the caller as a plain exception
        raise failed.exceptions[0] from None
    return report


async def _wait_gone(
    client: KubeClient, pod: PodRef, deadline: float, poll_seconds: float, clock: Clock
) -> str:
    """ "" once the evicted pod is gone (deleted, or replaced under its name), else why it is not."""
    while True:
        try:
            current = await client.get_pod(pod.namespace, pod.name)
        except KubeNotFound:
            return ""
        except KubeUnavailable:
            current = None  # a read that failed says nothing; ask again
        if current is not None:
            meta = current.get("metadata") or {}
            if meta.get("uid") != pod.uid:
                return ""
        left = deadline - clock.monotonic()
        if left <= 0:
            since = (current or {}).get("metadata", {}).get("deletionTimestamp", "?")
            node = (current or {}).get("spec", {}).get("nodeName", "?")
            return f"evicted, still terminating since {since} (the kubelet of {node} has not confirmed)"
        await clock.sleep(min(poll_seconds, left))


def _refusal(exc: KubeTooManyRequests) -> str:
    """The 429's message plus its causes (the API server names the blocking budget there)."""
    causes = (exc.body.get("details") or {}).get("causes") or []
    said = [str(c.get("message")) for c in causes if isinstance(c, dict) and c.get("message")]
    return "; ".join([exc.message or "429 TooManyRequests", *said])
