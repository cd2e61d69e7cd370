"""The diagnosis step for one incident: find the pod's GPUs and node, read every catalogue signal
over the onset window from Prometheus (bounded concurrency, one deadline for the whole step), find
when the symptom began, and rank the candidate causes. It never raises: what it cannot do becomes a
"no diagnosis" with the reason."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpupulse.clock import Clock, SystemClock
from remediation.diagnosis import catalogue
from remediation.diagnosis.catalogue import Signal
from remediation.diagnosis.prom import PrometheusError, RangeClient, RangeSeries
from remediation.diagnosis.rank import (
    CauseObservation,
    RankSettings,
    SeriesData,
    estimate_onset,
    evaluate,
    rank,
)
from remediation.diagnosis.types import (
    NO_PROMETHEUS,
    PROMETHEUS_UNAVAILABLE,
    Diagnosis,
    OwnAction,
    SignalEvidence,
    no_diagnosis,
)

_REGEX_META = re.compile(r"[.^$*+?()\[\]{}|\\]")


@dataclass(frozen=True)
class DiagnosisSettings:
    """How much history to read and how long the step may take."""

    lookback_seconds: float = 2400.0  # read from this long before the alert fired
    step_seconds: float = 15.0
    deadline_seconds: float = 20.0  # the whole step, all queries together
    max_concurrent_queries: int = 6
    rank: RankSettings = field(default_factory=RankSettings)


class _Reads:
    """The outcome of the queries of one step: data, or why not."""

    def __init__(self) -> None:
        self.data: dict[str, SeriesData] = {}
        self.missing: dict[str, str] = {}
        self.errors = 0
        self.answered = 0


class Diagnoser:
    """Runs the diagnosis for an alert's labels; `client` None means no Prometheus is configured."""

    def __init__(
        self,
        client: RangeClient | None,
        settings: DiagnosisSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        self.settings = settings or DiagnosisSettings()
        self.clock = clock or SystemClock()

    async def diagnose(
        self, labels: Mapping[str, str], fired_at: float, own: Sequence[OwnAction] = ()
    ) -> Diagnosis:
        """The diagnosis of the incident an alert with `labels`, firing since `fired_at`, opened;
        `own` are the incident's own actions so far, whose effects are never named its cause."""
        now = self.clock.time()
        end = now
        start = min(fired_at, now) - self.settings.lookback_seconds
        if self.client is None:
            return no_diagnosis(
                NO_PROMETHEUS,
                "no Prometheus is configured (--diagnosis.prometheus-url), so no signal could be read",
                window_start=start,
                window_end=end,
                computed_at=now,
            )
        try:
            async with asyncio.timeout(self.settings.deadline_seconds):
                return await self._diagnose(self.client, labels, fired_at, start, end, now, own)
        except TimeoutError:
            return no_diagnosis(
                PROMETHEUS_UNAVAILABLE,
                f"Prometheus did not answer within the diagnosis deadline of "
                f"{self.settings.deadline_seconds:g} s",
                window_start=start,
                window_end=end,
                computed_at=now,
            )

    async def _diagnose(
        self,
        client: RangeClient,
        labels: Mapping[str, str],
        fired_at: float,
        start: float,
        end: float,
        now: float,
        own: Sequence[OwnAction],
    ) -> Diagnosis:
        step = self.settings.step_seconds
        try:
            values = await _resolve(client, labels, start, end, step)
        except PrometheusError as exc:
            return no_diagnosis(
                PROMETHEUS_UNAVAILABLE,
                f"Prometheus could not be read: {exc}",
                window_start=start,
                window_end=end,
                computed_at=now,
            )
        symptom_signal = catalogue.symptom_for(labels)
        signals: dict[str, Signal] = {}
        for c in catalogue.CAUSES:
            signals[c.primary.id] = c.primary
            for s in (*c.corroborating, *(r.signal for r in c.requires)):
                signals[s.id] = s
        for s in catalogue.CONTEXT:
            signals.setdefault(s.id, s)
        keyed = {f"cause:{k}": s for k, s in signals.items()}
        if symptom_signal is not None:
            keyed["symptom"] = symptom_signal
        reads = await self._read_all(client, keyed, values, start, end)
        if reads.errors and not reads.answered:
            first = next(iter(reads.missing.values()), "")
            return no_diagnosis(
                PROMETHEUS_UNAVAILABLE,
                f"Prometheus could not be read: {first}",
                window_start=start,
                window_end=end,
                computed_at=now,
            )
        rs = self.settings.rank
        symptom_data = reads.data.get("symptom")
        symptom_ev: SignalEvidence | None = None
        onset = fired_at
        if symptom_signal is not None:
            change = estimate_onset(
                symptom_data,
                symptom_signal.direction,
                fired_at=fired_at,
                settings=rs,
                lag_seconds=symptom_signal.lag_seconds,
            )
            if change is not None:
                onset = change.at
            if symptom_data is not None:
                symptom_ev = evaluate(symptom_signal, symptom_data, onset, rs)
                if change is None:
                    symptom_ev = _with_note(
                        symptom_ev, "no clear onset in the series: the alert's start is used"
                    )
        observations = [
            CauseObservation(
                c,
                reads.data.get(f"cause:{c.primary.id}"),
                [(s, reads.data.get(f"cause:{s.id}")) for s in c.corroborating],
                [(r, reads.data.get(f"cause:{r.signal.id}")) for r in c.requires],
            )
            for c in catalogue.CAUSES
            # the symptom's own series lines up with itself: it cannot be its own cause
            if symptom_signal is None or c.primary.id != symptom_signal.id
        ]
        context = [
            evaluate(s, reads.data[f"cause:{s.id}"], onset, rs)
            for s in catalogue.CONTEXT
            if f"cause:{s.id}" in reads.data
        ]
        missing = sorted(f"{k.removeprefix('cause:')}: {why}" for k, why in reads.missing.items())
        return rank(
            observations,
            symptom_onset=onset,
            window_start=start,
            window_end=end,
            computed_at=now,
            settings=rs,
            symptom=symptom_ev,
            context=context,
            missing=missing,
            own=own,
        )

    async def _read_all(
        self,
        client: RangeClient,
        signals: Mapping[str, Signal],
        values: Mapping[str, str],
        start: float,
        end: float,
    ) -> _Reads:
        reads = _Reads()
        gate = asyncio.Semaphore(self.settings.max_concurrent_queries)

        async def one(key: str, signal: Signal) -> None:
            query = signal.render(values)
            if query is None:
                absent = sorted(n for n in signal.needs() if not values.get(n))
                reads.missing[key] = f"no {', '.join(absent)} known for this incident"
                return
            async with gate:
                try:
                    result = await client.query_range(query, start, end, self.settings.step_seconds)
                except PrometheusError as exc:
                    reads.errors += 1
                    reads.missing[key] = str(exc)
                    return
            reads.answered += 1
            best = _longest(result)
            if best is None:
                reads.missing[key] = "no data" + (
                    f" ({signal.source} not scraped?)" if signal.source != "gpupulse" else ""
                )
                return
            reads.data[key] = SeriesData(query=query, points=best.points, labels=best.labels)

        await asyncio.gather(*(one(k, s) for k, s in signals.items()))
        return reads


async def _resolve(
    client: RangeClient, labels: Mapping[str, str], start: float, end: float, step: float
) -> dict[str, str]:
    """Placeholder values for the incident: its pod, model, node and GPUs, from the alert's labels and,
    where they lack some, from the engine and allocation info series."""
    values = {k: labels.get(k, "") for k in ("namespace", "pod", "model", "node")}
    uuids = {labels["uuid"]} if labels.get("uuid") else set()
    pod_sel = (
        f'namespace="{_q(values["namespace"])}",pod="{_q(values["pod"])}"'
        if values["namespace"] and values["pod"]
        else ""
    )
    if not uuids and pod_sel:
        for info in ("inference_engine_gpu_info", "gpu_allocation_info"):
            found = await client.query_range(f"group by (uuid, node) ({info}{{{pod_sel}}})", start, end, step)
            uuids = {s.labels["uuid"] for s in found if s.labels.get("uuid")}
            if not values["node"]:
                values["node"] = next((s.labels["node"] for s in found if s.labels.get("node")), "")
            if uuids:
                break
    if uuids and not pod_sel:
        # a GPU alert: diagnose for the pod that runs there (the first, in a stable order)
        sel = f'uuid=~"{_q(_alternation(uuids))}"'
        found = await client.query_range(
            f"group by (namespace, pod, node) (gpu_allocation_info{{{sel}}})", start, end, step
        )
        pods = sorted(
            (s.labels.get("namespace", ""), s.labels.get("pod", "")) for s in found if s.labels.get("pod")
        )
        if pods:
            values["namespace"], values["pod"] = pods[0]
        if not values["node"]:
            values["node"] = next((s.labels["node"] for s in found if s.labels.get("node")), "")
    values["uuids"] = _alternation(uuids)
    return values


def _alternation(uuids: set[str]) -> str:
    return "|".join(_REGEX_META.sub(r"\\\g<0>", u) for u in sorted(uuids))


def _q(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _longest(result: list[RangeSeries]) -> RangeSeries | None:
    with_points = [s for s in result if s.points]
    return max(with_points, key=lambda s: len(s.points)) if with_points else None


def _with_note(ev: SignalEvidence, note: str) -> SignalEvidence:
    return replace(ev, note=note)
