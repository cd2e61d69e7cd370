"""The typed result of a diagnosis: ranked candidate causes with their evidence, or why there is none.

Everything here is plain data that round-trips through JSON (`to_dict` / `from_dict`), so the ledger
stores it with the incident and the API, CLI and pages read the same record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

Layer = Literal["hardware", "host", "scheduling", "serving"]
Direction = Literal["up", "down"]
Status = Literal["diagnosed", "no_diagnosis"]

LAYERS: tuple[Layer, ...] = ("hardware", "host", "scheduling", "serving")

# Why there is no diagnosis; the free-text `reason` says the specifics.
NO_PROMETHEUS = "no_prometheus"
PROMETHEUS_UNAVAILABLE = "prometheus_unavailable"
SIGNALS_MISSING = "signals_missing"
NOTHING_LINES_UP = "nothing_lines_up"
DIAGNOSIS_BUSY = "busy"
DIAGNOSIS_FAILED = "failed"


@dataclass(frozen=True)
class Point:
    """One sample: Unix seconds and value."""

    t: float
    v: float


@dataclass(frozen=True)
class SignalEvidence:
    """What one signal did around the symptom: its change-point, levels before and after, lead."""

    signal: str  # catalogue id, e.g. "page_cache_residency"
    title: str
    query: str
    direction: Direction  # the direction that would make it a cause
    changed: bool  # a change-point was found in the expected direction
    change_at: float | None  # Unix seconds of the first sample after the change-point
    before: float | None  # median level before the change-point (or the onset)
    after: float | None  # median level after it
    lead_seconds: float | None  # symptom onset minus change_at: positive = the signal moved first
    strength: float  # 0..1, how clearly the level shifted (noise-normalised)
    alignment: float  # 0..1, how well the change lines up with the onset
    passed_gate: bool  # the level after the change is a fault by itself (e.g. throttle active)
    note: str = ""  # why it does or does not count, in words
    labels: Mapping[str, str] = field(default_factory=dict)
    points: tuple[Point, ...] = ()  # the series over the window, downsampled for the record

    def to_dict(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "title": self.title,
            "query": self.query,
            "direction": self.direction,
            "changed": self.changed,
            "change_at": self.change_at,
            "before": _num(self.before),
            "after": _num(self.after),
            "lead_seconds": self.lead_seconds,
            "strength": round(self.strength, 4),
            "alignment": round(self.alignment, 4),
            "passed_gate": self.passed_gate,
            "note": self.note,
            "labels": dict(self.labels),
            "points": [[p.t, p.v] for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SignalEvidence:
        return cls(
            signal=str(d["signal"]),
            title=str(d.get("title", "")),
            query=str(d.get("query", "")),
            direction="down" if d.get("direction") == "down" else "up",
            changed=bool(d.get("changed")),
            change_at=_opt_float(d.get("change_at")),
            before=_opt_float(d.get("before")),
            after=_opt_float(d.get("after")),
            lead_seconds=_opt_float(d.get("lead_seconds")),
            strength=float(d.get("strength", 0.0)),
            alignment=float(d.get("alignment", 0.0)),
            passed_gate=bool(d.get("passed_gate")),
            note=str(d.get("note", "")),
            labels={str(k): str(v) for k, v in dict(d.get("labels") or {}).items()},
            points=tuple(Point(float(t), float(v)) for t, v in d.get("points") or ()),
        )


# What an action entry of the ledger records when it changed nothing on the cluster.
_NO_CHANGE_STATUSES = frozenset({"dry_run", "skipped", "blocked", "refused"})


@dataclass(frozen=True)
class OwnAction:
    """An action the controller took for the incident being diagnosed (one ledger entry): what it did
    to the incident's own target (a restarted pod, a job moved off a node) is never that incident's
    cause."""

    rung: str  # restart, migrate
    started_at: float  # Unix seconds
    finished_at: float | None = None

    def describe(self) -> str:
        """What a reader sees: "our restart at 2026-12-04T18:20:00+00:00"."""
        at = datetime.fromtimestamp(self.started_at, tz=UTC).isoformat(timespec="seconds")
        return f"our {self.rung} at {at}"


def own_actions(history: Sequence[Mapping[str, Any]]) -> tuple[OwnAction, ...]:
    """The actions of one incident's ledger history (`Ledger.history`) that may have changed its
    target: acting rungs, less those recorded as changing nothing (dry run, skipped, blocked,
    refused). An action still in flight counts: its effect may already show."""
    out = []
    for entry in history:
        rung = str(entry.get("rung") or "")
        if entry.get("kind") != "action" or rung in ("", "page"):
            continue
        if str(entry.get("status") or "") in _NO_CHANGE_STATUSES:
            continue
        started = _opt_float(entry.get("at"))
        if started is None:
            continue
        out.append(OwnAction(rung, started, _opt_float(entry.get("finished_at"))))
    return tuple(sorted(out, key=lambda a: a.started_at))


@dataclass(frozen=True)
class Candidate:
    """One candidate cause, scored by its primary signal and backed by corroborating ones."""

    cause: str  # "<layer>.<name>", e.g. "host.page_cache_eviction"
    layer: Layer
    title: str
    score: float  # 0..1
    evidence: tuple[SignalEvidence, ...]  # primary first, then corroborating, then requirements
    # the cause that brought this one about (a restart leaves the page cache cold): it lined up, but
    # as an effect of that cause, not as a rival to it
    explained_by: str = ""
    # the controller's own action that brought it about (a new process after our restart): it lined
    # up, but the incident's own remediation is never named as its cause
    caused_by_us: str = ""

    @property
    def label(self) -> str:
        """What a human reads: "host: page-cache eviction"."""
        return f"{self.layer}: {self.title}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cause": self.cause,
            "layer": self.layer,
            "title": self.title,
            "label": self.label,
            "score": round(self.score, 4),
            "evidence": [e.to_dict() for e in self.evidence],
        }
        if self.explained_by:
            out["explained_by"] = self.explained_by
        if self.caused_by_us:
            out["caused_by_us"] = self.caused_by_us
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        layer = str(d.get("layer", "serving"))
        return cls(
            cause=str(d["cause"]),
            layer=layer if layer in LAYERS else "serving",
            title=str(d.get("title", "")),
            score=float(d.get("score", 0.0)),
            evidence=tuple(SignalEvidence.from_dict(e) for e in d.get("evidence") or ()),
            explained_by=str(d.get("explained_by") or ""),
            caused_by_us=str(d.get("caused_by_us") or ""),
        )


@dataclass(frozen=True)
class Diagnosis:
    """The outcome of one diagnosis run, stored with the incident."""

    status: Status
    reason_code: str  # "" when diagnosed; else one of the constants above
    reason: str  # one sentence a human reads
    symptom_onset: float | None
    window_start: float
    window_end: float
    computed_at: float
    candidates: tuple[Candidate, ...] = ()  # best first, only those that line up
    rejected: tuple[Candidate, ...] = ()  # changed but did not line up or did not pass the gate
    missing: tuple[str, ...] = ()  # signals with no data
    symptom: SignalEvidence | None = None
    confident: bool = False  # top is clearly ahead: decisions may use it
    context: tuple[SignalEvidence, ...] = ()  # symptom-side signals shown, not ranked (queue, batch latency)
    # layer by layer, what the elimination found: "cause", "ruled out: ...", "no data"
    layers: Mapping[str, str] = field(default_factory=dict)

    @property
    def top(self) -> Candidate | None:
        return self.candidates[0] if self.candidates and self.status == "diagnosed" else None

    @property
    def headline(self) -> str:
        """One line for summaries: the top cause, or "no diagnosis: why"."""
        top = self.top
        if top is None:
            return f"no diagnosis: {self.reason}"
        sure = "" if self.confident else " (not certain)"
        return f"{top.label}{sure}"

    def to_dict(self) -> dict[str, Any]:
        top = self.top
        return {
            "status": self.status,
            "headline": self.headline,
            "top_cause": top.cause if top else None,
            "top_layer": top.layer if top else None,
            "confident": self.confident,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "symptom_onset": self.symptom_onset,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "computed_at": self.computed_at,
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected": [c.to_dict() for c in self.rejected],
            "missing": list(self.missing),
            "symptom": self.symptom.to_dict() if self.symptom else None,
            "context": [c.to_dict() for c in self.context],
            "layers": dict(self.layers),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Diagnosis:
        symptom = d.get("symptom")
        return cls(
            status="diagnosed" if d.get("status") == "diagnosed" else "no_diagnosis",
            reason_code=str(d.get("reason_code", "")),
            reason=str(d.get("reason", "")),
            symptom_onset=_opt_float(d.get("symptom_onset")),
            window_start=float(d.get("window_start", 0.0)),
            window_end=float(d.get("window_end", 0.0)),
            computed_at=float(d.get("computed_at", 0.0)),
            candidates=tuple(Candidate.from_dict(c) for c in d.get("candidates") or ()),
            rejected=tuple(Candidate.from_dict(c) for c in d.get("rejected") or ()),
            missing=tuple(str(m) for m in d.get("missing") or ()),
            symptom=SignalEvidence.from_dict(symptom) if isinstance(symptom, Mapping) else None,
            confident=bool(d.get("confident")),
            context=tuple(SignalEvidence.from_dict(c) for c in d.get("context") or ()),
            layers={str(k): str(v) for k, v in dict(d.get("layers") or {}).items()},
        )


def no_diagnosis(
    code: str,
    reason: str,
    *,
    window_start: float,
    window_end: float,
    computed_at: float,
    symptom_onset: float | None = None,
    missing: Sequence[str] = (),
    rejected: Sequence[Candidate] = (),
    symptom: SignalEvidence | None = None,
    layers: Mapping[str, str] | None = None,
) -> Diagnosis:
    """A Diagnosis that says it cannot tell, and why."""
    return Diagnosis(
        status="no_diagnosis",
        reason_code=code,
        reason=reason,
        symptom_onset=symptom_onset,
        window_start=window_start,
        window_end=window_end,
        computed_at=computed_at,
        rejected=tuple(rejected),
        missing=tuple(missing),
        symptom=symptom,
        layers=dict(layers or {}),
    )


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return x


def _opt_float(x: object) -> float | None:
    if x is None:
        return None
    try:
        value = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
