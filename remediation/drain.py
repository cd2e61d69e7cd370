"""Wait for a training job's next step (or checkpoint) to land before it is drained.

The controller learns that a boundary passed from Prometheus: the progress gauge (by default the
exporter's gpu_training_progress_last_step_timestamp_seconds, Unix time of the job's last step;
docs/metrics.md) moving past the moment the drain was decided. Alerts carry no such label, and a
label frozen when the alert fired could not say that a later step landed. Whatever stops the read
(no Prometheus, an error, a job with no progress series) drains at once, with the reason recorded:
a wait never holds back a drain the controller cannot justify holding back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from gpupulse.clock import Clock
from gpupulse.contract import TRAINING_JOB_KIND_LABEL, TRAINING_JOB_LABEL
from remediation.diagnosis.prom import PrometheusError, RangeClient
from remediation.model import Target

BoundaryKind = Literal["boundary", "deadline", "no_signal", "unreachable"]

# how far back a read looks for the gauge's latest sample (a few scrapes)
LOOKBACK_SECONDS = 120.0
READ_STEP_SECONDS = 15.0


class ProgressUnavailable(Exception):
    """The progress source could not answer (unreachable, an error, no Prometheus configured)."""


class ProgressSource(Protocol):
    """Where the waiter reads a job's last progress (tests pass a fake)."""

    async def last_progress_at(self, target: Target) -> float | None:
        """Unix time of the job's last step or checkpoint; None when the job has no progress series."""
        ...


@dataclass(frozen=True)
class BoundaryOutcome:
    """How a wait ended: what it saw, when, and the sentence the ledger keeps."""

    kind: BoundaryKind
    at: float  # wall time the wait ended (the drain follows at once)
    progress_at: float | None
    summary: str


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def progress_query(metric: str, target: Target) -> str:
    """max over the job's ranks and containers: any rank's step is the job's (a gang steps together)."""
    return (
        f'max({metric}{{namespace="{_quote(target.namespace)}",'
        f'{TRAINING_JOB_KIND_LABEL}="{_quote(target.training_job_kind)}",'
        f'{TRAINING_JOB_LABEL}="{_quote(target.training_job)}"}})'
    )


class PrometheusProgress:
    """The job's progress gauge from Prometheus: the latest sample of the last LOOKBACK_SECONDS."""

    def __init__(self, client: RangeClient, metric: str, clock: Clock) -> None:
        self.client = client
        self.metric = metric
        self.clock = clock

    async def last_progress_at(self, target: Target) -> float | None:
        now = self.clock.time()
        try:
            series = await self.client.query_range(
                progress_query(self.metric, target), now - LOOKBACK_SECONDS, now, READ_STEP_SECONDS
            )
        except PrometheusError as exc:
            raise ProgressUnavailable(str(exc)) from exc
        points = [p for s in series for p in s.points]
        return max(value for _, value in points) if points else None


class NoProgressSource:
    """No Prometheus is configured: every wait ends at once, saying so."""

    async def last_progress_at(self, target: Target) -> float | None:
        raise ProgressUnavailable("no Prometheus is configured (--verify.prometheus-url)")


class BoundaryWaiter:
    """Polls a ProgressSource until the job's progress moves past the decision, or the deadline."""

    def __init__(self, source: ProgressSource, clock: Clock, poll_seconds: float) -> None:
        self.source = source
        self.clock = clock
        self.poll_seconds = poll_seconds

    async def wait(
        self,
        target: Target,
        decided_at: float,
        wait_max_seconds: float,
    ) -> BoundaryOutcome:
        """Return once a step or checkpoint landed after `decided_at`, or at decided_at + wait_max."""
        deadline = decided_at + wait_max_seconds
        while True:
            try:
                last = await self.source.last_progress_at(target)
            except ProgressUnavailable as exc:
                now = self.clock.time()
                return BoundaryOutcome(
                    "unreachable", now, None, f"progress unreadable ({exc}): drained at once"
                )
            now = self.clock.time()
            if last is None:
                return BoundaryOutcome(
                    "no_signal", now, None, "the job shows no progress series: drained at once"
                )
            if last > decided_at:
                return BoundaryOutcome(
                    "boundary", now, last, f"the job's next step landed at {iso(last)}: drained after it"
                )
            if now >= deadline:
                return BoundaryOutcome(
                    "deadline",
                    now,
                    last,
                    f"no step since {iso(last)} by the deadline {iso(deadline)}: drained at the deadline",
                )
            await self.clock.sleep(min(self.poll_seconds, deadline - now))
