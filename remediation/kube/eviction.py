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


@dataclass
class EvictionReport:
    """Outcome per pod key (namespace/name)."""

    evicted: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)  # deleted or replaced before we got to it
    blocked: dict[str, str] = field(default_factory=dict)  # key -> last refusal
    misconfigured: dict[str, str] = field(default_factory=dict)  # 500: several PDBs select the pod
    attempts: int = 0


async def evict_pods(
    client: KubeClient,
    pods: Iterable[PodRef],
    settings: EvictionSettings,
    clock: Clock,
    guard: Callable[[], None],
) -> EvictionReport:
    """Evict every pod, each retrying 429s with exponential backoff until a shared deadline."""
    report = EvictionReport()
    deadline = clock.monotonic() + settings.deadline_seconds
    limit = asyncio.Semaphore(max(1, settings.concurrency))

    async def one(pod: PodRef) -> None:
        delay = settings.backoff_initial_seconds
        async with limit:
            while True:
                guard()
                report.attempts += 1
                try:
                    await client.evict_pod(pod.namespace, pod.name, pod.uid)
                    report.evicted.append(pod.key)
                    return
                except (KubeNotFound, KubeConflict):
                    # 409 here means the UID precondition failed: the pod we meant is already gone
                    report.gone.append(pod.key)
                    return
                except KubeTooManyRequests as exc:
                    last = _refusal(exc)
                    # the server's own hint (a budget it has not computed yet says 10 s) is a floor
                    delay = max(delay, _retry_after_seconds(exc))
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
    except BaseExceptionGroup as failed:
        # the siblings are cancelled by now; hand the first cause to the caller as a plain exception
        raise failed.exceptions[0] from None
    return report


def _refusal(exc: KubeTooManyRequests) -> str:
    """The 429's message plus its causes (the API server names the blocking budget there)."""
    causes = (exc.body.get("details") or {}).get("causes") or []
    said = [str(c.get("message")) for c in causes if isinstance(c, dict) and c.get("message")]
    return "; ".join([exc.message or "429 TooManyRequests", *said])


def _retry_after_seconds(exc: KubeTooManyRequests) -> float:
    """details.retryAfterSeconds of a 429 Status (what the Retry-After header also says), else 0."""
    value = (exc.body.get("details") or {}).get("retryAfterSeconds")
    return float(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0.0
