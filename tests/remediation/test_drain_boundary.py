"""Drain at a boundary: a training job's drain waits for its next step within a deadline set by the
fault's urgency (remediation/decide/boundary.py, remediation/drain.py), read from a fake progress
source on the fake clock, and from a fake Prometheus speaking the range API's semantics."""

from __future__ import annotations

import pytest

from remediation.decide.boundary import boundary_wait
from remediation.diagnosis.prom import PrometheusError, RangeSeries
from remediation.drain import (
    BoundaryWaiter,
    NoProgressSource,
    ProgressUnavailable,
    PrometheusProgress,
    progress_query,
)
from remediation.errors import SignatureError
from remediation.model import Target
from remediation.settings import EngineDrainSettings
from remediation.signatures import parse_document
from tests.fakes.clock import FakeClock
from tests.fakes.progress import LandsAt, Unreachable

JOB = Target(
    kind="job",
    namespace="train",
    node="gpu-b",
    training_job_kind="JobSet.jobset.x-k8s.io",
    training_job="llama",
)
MINUTE = 60.0


def test_fatal_faults_drain_now_and_degrading_ones_wait_up_to_the_tunable() -> None:
    settings = EngineDrainSettings(checkpoint_wait_max_seconds=30 * MINUTE)
    assert boundary_wait("migrate", JOB, "training_node_fault", settings).seconds == 0  # XID 79, reset
    assert boundary_wait("restart", JOB, "training_hang", settings).seconds == 0  # no step will land
    slow = boundary_wait("migrate", JOB, "training_straggler", settings)
    assert (slow.seconds, slow.urgency) == (30 * MINUTE, "degrading")
    assert boundary_wait("migrate", JOB, "training_degraded", settings).seconds == 30 * MINUTE
    assert boundary_wait("migrate", JOB, "not-a-class", settings).seconds == 0  # unknown: as before
    # inference and every other target is drained as today; a page never waits
    pod = Target(kind="pod", namespace="llm", pod="vllm-0")
    assert boundary_wait("migrate", pod, "training_straggler", settings).seconds == 0
    assert boundary_wait("page", JOB, "training_straggler", settings).seconds == 0
    off = EngineDrainSettings(checkpoint_wait_max_seconds=0)
    assert boundary_wait("migrate", JOB, "training_straggler", off).seconds == 0


async def test_a_checkpoint_four_minutes_out_drains_at_four_minutes_not_at_once() -> None:
    clock = FakeClock()
    decided = clock.time()
    source = LandsAt(clock, decided + 4 * MINUTE, before=decided - 10 * MINUTE)
    out = await BoundaryWaiter(source, clock, poll_seconds=30).wait(JOB, decided, 30 * MINUTE)
    assert out.kind == "boundary"
    assert out.at - decided == 4 * MINUTE and out.progress_at == decided + 4 * MINUTE
    assert "landed" in out.summary


async def test_no_step_within_the_tunable_drains_at_the_deadline() -> None:
    clock = FakeClock()
    decided = clock.time()
    source = LandsAt(clock, None, before=decided - 10 * MINUTE)
    out = await BoundaryWaiter(source, clock, poll_seconds=70).wait(JOB, decided, 30 * MINUTE)
    assert out.kind == "deadline"
    assert out.at - decided == 30 * MINUTE  # the last sleep is cut to the deadline, never past it
    assert max(clock.sleeps) == 70 and "deadline" in out.summary


async def test_an_unreachable_source_or_a_job_without_progress_drains_at_once_saying_why() -> None:
    clock = FakeClock()
    decided = clock.time()
    out = await BoundaryWaiter(Unreachable(), clock, 30).wait(JOB, decided, 30 * MINUTE)
    assert (out.kind, out.at) == ("unreachable", decided)
    assert "connection refused" in out.summary and "at once" in out.summary
    out = await BoundaryWaiter(NoProgressSource(), clock, 30).wait(JOB, decided, 30 * MINUTE)
    assert out.kind == "unreachable" and "no Prometheus" in out.summary

    class Silent:
        async def last_progress_at(self, target: Target) -> float | None:
            return None

    out = await BoundaryWaiter(Silent(), clock, 30).wait(JOB, decided, 30 * MINUTE)
    assert (out.kind, out.at) == ("no_signal", decided) and not clock.sleeps


class FakeRange:
    def __init__(self, series: list[RangeSeries] | None = None, error: str = "") -> None:
        self.series, self.error = series or [], error
        self.queries: list[tuple[str, float, float]] = []

    async def query_range(
        self, query: str, start: float, end: float, step_seconds: float
    ) -> list[RangeSeries]:
        self.queries.append((query, start, end))
        if self.error:
            raise PrometheusError(self.error)
        return self.series


async def test_prometheus_progress_reads_the_jobs_latest_step_time_and_maps_errors() -> None:
    clock = FakeClock()
    prom = FakeRange([RangeSeries({}, [(clock.time() - 30, 100.0), (clock.time() - 15, 250.0)])])
    source = PrometheusProgress(prom, "gpu_training_progress_last_step_timestamp_seconds", clock)
    assert await source.last_progress_at(JOB) == 250.0
    query, start, end = prom.queries[0]
    assert query == progress_query("gpu_training_progress_last_step_timestamp_seconds", JOB)
    assert 'training_job="llama"' in query and 'training_job_kind="JobSet.jobset.x-k8s.io"' in query
    assert end == clock.time() and start < end
    assert await PrometheusProgress(FakeRange(), "m", clock).last_progress_at(JOB) is None
    with pytest.raises(ProgressUnavailable, match="503"):
        await PrometheusProgress(FakeRange(error="answered 503"), "m", clock).last_progress_at(JOB)


def test_a_label_value_cannot_break_out_of_the_query() -> None:
    evil = Target(kind="job", namespace='a"}or vector(1)', training_job_kind="k", training_job="j")
    assert 'namespace="a\\"}or vector(1)"' in progress_query("m", evil)


def test_a_signature_sets_its_own_wait_and_a_negative_one_is_refused() -> None:
    doc = """
signatures:
  - name: slow-rank-short-wait
    fault_class: training_straggler
    match: {labels: {fault_class: training_straggler}}
    ladder: {rungs: [migrate, page], checkpoint_wait_max_seconds: 300}
    restart_fixes: false
    reason: a slow rank
"""
    [sig] = parse_document(doc, "user.yaml", "user")
    assert sig.ladder.checkpoint_wait_max_seconds == 300
    assert sig.ladder.to_dict()["checkpoint_wait_max_seconds"] == 300
    settings = EngineDrainSettings(checkpoint_wait_max_seconds=1800)
    wait = sig.ladder.checkpoint_wait_max_seconds
    assert boundary_wait("migrate", JOB, "training_straggler", settings, wait).seconds == 300
    assert boundary_wait("migrate", JOB, "training_node_fault", settings, 0.0).seconds == 0
    with pytest.raises(SignatureError, match="checkpoint_wait_max_seconds"):
        parse_document(doc.replace(": 300", ": -1"), "user.yaml", "user")
