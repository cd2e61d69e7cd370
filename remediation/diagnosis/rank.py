"""Pure ranking: which candidate cause changed, in the direction that would cause the symptom, at the
moment the symptom began.

For each series the change-point is the split that best separates a local "before" level from an
"after" level, each over its own short window, weighted by how close the split lies to the symptom's
onset. A cause counts when its primary signal moved the right way, reached a level that is a fault
by itself (its gate) and moved no later than the symptom allows; its score is how clearly it moved,
times how well it lines up, times its weight, raised a little by each corroborating signal that
lines up too. A cause may require a level around the onset (the pod had GPU work to be slowed); and
a cause that brings others about (a restart: a cold page cache, an empty KV cache) takes those
that line up with it as its effects rather than as rivals. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from remediation.diagnosis.catalogue import Cause, Requirement, Signal
from remediation.diagnosis.types import (
    LAYERS,
    NOTHING_LINES_UP,
    SIGNALS_MISSING,
    Candidate,
    Diagnosis,
    Direction,
    OwnAction,
    Point,
    SignalEvidence,
    no_diagnosis,
)


@dataclass(frozen=True)
class RankSettings:
    """The method's constants, with units in their names (docs/design/diagnosis.md explains each)."""

    before_window_seconds: float = 600.0  # the local baseline each split is compared against
    after_window_seconds: float = 300.0
    min_points_per_side: int = 3
    # a cause may lead the symptom by this much (gradual effects: memory filling, cache draining)
    max_lead_seconds: float = 600.0
    # ... and trail it by this much (the symptom's own series is smoothed, e.g. a 5m-rate p99)
    max_lag_seconds: float = 120.0
    slack_seconds: float = 60.0  # changes this close to the onset line up fully
    lead_decay_seconds: float = 240.0
    lag_decay_seconds: float = 60.0
    relative_noise_floor: float = 0.02  # a perfectly clean series still has this much noise
    min_effect: float = 2.0  # a shift smaller than this many noise widths is noise, not a change
    strength_scale: float = 3.0  # a shift of this many noise widths gives strength 0.63
    corroboration_bonus: float = 0.15
    min_score: float = 0.2
    confident_score: float = 0.35
    confident_margin: float = 0.15
    evidence_points: int = 60  # points kept per series in the record
    # a change that follows one of the incident's own actions within this long (a restarted pod is
    # scheduled, pulls its image, loads its weights and starts serving) is that action's doing
    own_action_settle_seconds: float = 900.0


@dataclass(frozen=True)
class SeriesData:
    """A series as read from Prometheus (or built by a test)."""

    query: str
    points: Sequence[tuple[float, float]]
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CauseObservation:
    """A catalogue cause with the series read for its signals (None: no data)."""

    cause: Cause
    primary: SeriesData | None
    corroborating: Sequence[tuple[Signal, SeriesData | None]] = ()
    requirements: Sequence[tuple[Requirement, SeriesData | None]] = ()


@dataclass(frozen=True)
class Change:
    at: float  # Unix seconds
    before: float
    after: float
    effect: float  # shift in noise widths, signed so that positive is the given direction


def clean(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Finite samples in time order, one per timestamp (the last one wins)."""
    by_t: dict[float, float] = {}
    for t, v in points:
        try:
            tf, vf = float(t), float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(tf) and math.isfinite(vf):
            by_t[tf] = vf
    return sorted(by_t.items())


def change_point(
    points: Sequence[tuple[float, float]],
    direction: Direction,
    *,
    around: float | None,
    settings: RankSettings = RankSettings(),
    lag_seconds: float = 0.0,
    not_after: float | None = None,
) -> Change | None:
    """The most convincing shift of `points` in `direction`; with `around`, shifts near it are
    preferred (each split's effect is weighted by its alignment). None for a flat or short series."""
    pts = clean(points)
    n = len(pts)
    k_min = settings.min_points_per_side
    if n < 2 * k_min:
        return None
    sign = 1.0 if direction == "up" else -1.0
    ts = [t for t, _ in pts]
    vs = [v for _, v in pts]
    # prefix sums make each split's local means and variances O(1)
    s1, s2 = [0.0], [0.0]
    for v in vs:
        s1.append(s1[-1] + v)
        s2.append(s2[-1] + v * v)
    best: tuple[float, int, int, int] | None = None
    for k in range(k_min, n - k_min + 1):
        t_split = _split_time(pts, k) - lag_seconds
        if not_after is not None and t_split > not_after:
            break
        lo = bisect.bisect_left(ts, ts[k] - settings.before_window_seconds, 0, k)
        hi = bisect.bisect_right(ts, ts[k] + settings.after_window_seconds, k, n)
        nb, na = k - lo, hi - k
        if nb < k_min or na < k_min:
            continue
        mb, ma = (s1[k] - s1[lo]) / nb, (s1[hi] - s1[k]) / na
        shift = sign * (ma - mb)
        if shift <= 0:
            continue
        ss = max(0.0, (s2[k] - s2[lo]) - nb * mb * mb) + max(0.0, (s2[hi] - s2[k]) - na * ma * ma)
        noise = math.sqrt(ss / (nb + na - 2))
        floor = settings.relative_noise_floor * max(abs(mb), abs(ma)) + 1e-12
        effect = shift / max(noise, floor)
        if effect < settings.min_effect:
            continue
        weight = 1.0 if around is None else alignment(around - t_split, settings)
        value = effect * weight
        # ties go to the later split: the last level change before the onset is the one that counts
        if value > 0 and (best is None or value >= best[0]):
            best = (value, k, lo, hi)
    if best is None:
        return None
    _, k, lo, hi = best
    before, after = vs[lo:k], vs[k:hi]
    mb, ma = statistics.fmean(before), statistics.fmean(after)
    noise = _pooled_sd(before, after, mb, ma)
    floor = settings.relative_noise_floor * max(abs(mb), abs(ma)) + 1e-12
    return Change(
        _split_time(pts, k) - lag_seconds,
        statistics.median(before),
        statistics.median(after),
        (1.0 if direction == "up" else -1.0) * (ma - mb) / max(noise, floor),
    )


def alignment(lead_seconds: float, settings: RankSettings = RankSettings()) -> float:
    """1 when the change lies within the slack of the onset, decaying with distance; 0 outside the
    window a cause may lead or trail the symptom by."""
    if lead_seconds > settings.max_lead_seconds or lead_seconds < -settings.max_lag_seconds:
        return 0.0
    excess = abs(lead_seconds) - settings.slack_seconds
    if excess <= 0:
        return 1.0
    decay = settings.lead_decay_seconds if lead_seconds > 0 else settings.lag_decay_seconds
    return math.exp(-excess / decay)


def strength(effect: float, settings: RankSettings = RankSettings()) -> float:
    return 1.0 - math.exp(-max(0.0, effect) / settings.strength_scale)


def estimate_onset(
    symptom: SeriesData | None,
    direction: Direction,
    *,
    fired_at: float,
    settings: RankSettings = RankSettings(),
    lag_seconds: float = 0.0,
) -> Change | None:
    """When the symptom began: its strongest shift that happened by the time its alert fired."""
    if symptom is None:
        return None
    return change_point(
        symptom.points,
        direction,
        around=None,
        settings=settings,
        lag_seconds=lag_seconds,
        not_after=fired_at + settings.slack_seconds,
    )


def evaluate(
    signal: Signal,
    data: SeriesData,
    onset: float,
    settings: RankSettings = RankSettings(),
) -> SignalEvidence:
    """What one signal did around `onset`, with a note in words."""
    pts = clean(data.points)
    change = change_point(
        pts, signal.direction, around=onset, settings=settings, lag_seconds=signal.lag_seconds
    )
    if change is None:
        # nothing near the onset: say so when it moved elsewhere in the window (long before, after)
        change = change_point(
            pts, signal.direction, around=None, settings=settings, lag_seconds=signal.lag_seconds
        )
    kept = _downsample(pts, settings.evidence_points)
    common = {
        "signal": signal.id,
        "title": signal.title,
        "query": data.query,
        "direction": signal.direction,
        "labels": dict(data.labels),
        "points": kept,
    }
    if change is None:
        level = statistics.median(v for _, v in pts) if pts else None
        note = (
            "too few samples"
            if len(pts) < 2 * settings.min_points_per_side
            else f"no {signal.direction}ward change"
        )
        return SignalEvidence(
            changed=False,
            change_at=None,
            before=level,
            after=level,
            lead_seconds=None,
            strength=0.0,
            alignment=0.0,
            passed_gate=False,
            note=note,
            **common,  # type: ignore[arg-type]
        )
    lead = onset - change.at
    align = alignment(lead, settings)
    passed = signal.gate.passes(change.before, change.after)
    if align == 0.0:
        when = "before" if lead > 0 else "after"
        note = f"changed {abs(lead) / 60:.0f} min {when} the symptom"
    elif not passed:
        note = f"changed, but {change.after:g} is short of a fault ({signal.gate.describe()})"
    else:
        note = f"{change.before:g} -> {change.after:g}, {_lead_words(lead)}"
    if data.labels:
        # a per-pod series (the largest neighbour): who it is belongs in what a reader sees
        note += " (" + ", ".join(f"{k}={v}" for k, v in sorted(data.labels.items())) + ")"
    return SignalEvidence(
        changed=True,
        change_at=change.at,
        before=change.before,
        after=change.after,
        lead_seconds=lead,
        strength=strength(change.effect, settings),
        alignment=align,
        passed_gate=passed,
        note=note,
        **common,  # type: ignore[arg-type]
    )


def check(
    requirement: Requirement,
    data: SeriesData | None,
    onset: float,
    settings: RankSettings = RankSettings(),
) -> SignalEvidence:
    """Whether a cause's required level held around `onset`: the medians over the before and after
    windows either side of it. No data is not met: the cause cannot be told apart then."""
    signal = requirement.signal
    pts = clean(data.points) if data is not None else []
    lag = signal.lag_seconds
    before = [v for t, v in pts if onset - settings.before_window_seconds <= t - lag < onset]
    after = [v for t, v in pts if onset <= t - lag <= onset + settings.after_window_seconds]
    mb = statistics.median(before) if before else None
    ma = statistics.median(after) if after else mb
    met = mb is not None and ma is not None and requirement.met(mb, ma)
    if mb is None or ma is None:
        note = f"needed: {requirement.why}; no data to tell"
    else:
        levels = f"{mb:g} before, {ma:g} after the onset"
        note = f"needed: {requirement.why} ({requirement.describe()}): {levels}, " + (
            "met" if met else "not met"
        )
    return SignalEvidence(
        signal=signal.id,
        title=signal.title,
        query=data.query if data is not None else signal.query,
        direction=signal.direction,
        changed=False,
        change_at=None,
        before=mb,
        after=ma,
        lead_seconds=None,
        strength=0.0,
        alignment=0.0,
        passed_gate=met,
        note=note,
        labels=dict(data.labels) if data is not None else {},
        points=_downsample(pts, settings.evidence_points),
    )


def rank(
    observations: Sequence[CauseObservation],
    *,
    symptom_onset: float,
    window_start: float,
    window_end: float,
    computed_at: float,
    settings: RankSettings = RankSettings(),
    symptom: SignalEvidence | None = None,
    context: Sequence[SignalEvidence] = (),
    missing: Sequence[str] = (),
    own: Sequence[OwnAction] = (),
) -> Diagnosis:
    """Rank candidate causes by how well their change lines up with `symptom_onset`; what the
    incident's `own` actions brought about (our restart's new process) is never one of them."""
    accepted: list[Candidate] = []
    rejected: list[Candidate] = []
    obs_by = {o.cause.id: o.cause for o in observations}
    have_data = False
    for obs in observations:
        if obs.primary is None:
            continue
        have_data = True
        primary = evaluate(obs.cause.primary, obs.primary, symptom_onset, settings)
        extra = [
            evaluate(sig, data, symptom_onset, settings)
            for sig, data in obs.corroborating
            if data is not None
        ]
        lined_up = [e for e in extra if e.changed and e.alignment > 0 and e.passed_gate]
        needed = [check(req, data, symptom_onset, settings) for req, data in obs.requirements]
        base = primary.strength * primary.alignment * obs.cause.weight
        score = min(1.0, base * (1.0 + settings.corroboration_bonus * len(lined_up)))
        candidate = Candidate(
            cause=obs.cause.id,
            layer=obs.cause.layer,
            title=obs.cause.title,
            score=score if primary.passed_gate and all(n.passed_gate for n in needed) else 0.0,
            evidence=(primary, *extra, *needed),
        )
        if (
            primary.changed
            and primary.passed_gate
            and primary.alignment > 0
            and score >= settings.min_score
            and all(n.passed_gate for n in needed)
        ):
            accepted.append(candidate)
        elif primary.changed:
            rejected.append(candidate)
    accepted = [_ours(obs_by[c.cause], c, own, settings) for c in accepted]
    accepted.sort(key=lambda c: (-c.score, c.cause))
    # ours still explain their effects (our restart empties the KV cache): those are ours as well
    accepted, effects = _explain(observations, accepted, settings)
    ours = [c for c in accepted if c.caused_by_us]
    accepted = [c for c in accepted if not c.caused_by_us]
    rejected = sorted([*rejected, *effects, *ours], key=lambda c: c.cause)
    layers = _layers(observations, accepted, effects, ours)
    if not have_data:
        return no_diagnosis(
            SIGNALS_MISSING,
            "none of the candidate signals has data for this pod or GPU in the window",
            window_start=window_start,
            window_end=window_end,
            computed_at=computed_at,
            symptom_onset=symptom_onset,
            missing=missing,
            symptom=symptom,
            layers=layers,
        )
    if not accepted:
        why = "no candidate signal changed to a fault level in line with the symptom's onset"
        if ours:
            why += f" but what our own actions brought about ({ours[0].title}: {ours[0].caused_by_us})"
        return no_diagnosis(
            NOTHING_LINES_UP,
            why,
            window_start=window_start,
            window_end=window_end,
            computed_at=computed_at,
            symptom_onset=symptom_onset,
            missing=missing,
            rejected=rejected,
            symptom=symptom,
            layers=layers,
        )
    top = accepted[0]
    second = accepted[1].score if len(accepted) > 1 else 0.0
    confident = top.score >= settings.confident_score and (
        top.score - second >= settings.confident_margin or top.layer == accepted[1].layer
    )
    return Diagnosis(
        status="diagnosed",
        reason_code="",
        reason=f"{top.label} changed in line with the symptom ({top.evidence[0].note})",
        symptom_onset=symptom_onset,
        window_start=window_start,
        window_end=window_end,
        computed_at=computed_at,
        candidates=tuple(accepted),
        rejected=tuple(rejected),
        missing=tuple(missing),
        symptom=symptom,
        confident=confident,
        context=tuple(context),
        layers=layers,
    )


def _ours(cause: Cause, candidate: Candidate, own: Sequence[OwnAction], settings: RankSettings) -> Candidate:
    """The candidate marked as the doing of one of our own actions when its cause is one our
    actions bring about and its change came in the wake of one (from the slack before the action
    started to the settle time after it finished); else unchanged."""
    at = candidate.evidence[0].change_at
    if not cause.follows_our_actions or at is None:
        return candidate
    for action in own:
        end = action.finished_at if action.finished_at is not None else action.started_at
        if action.started_at - settings.slack_seconds <= at <= end + settings.own_action_settle_seconds:
            return replace(candidate, caused_by_us=action.describe())
    return candidate


def _explain(
    observations: Sequence[CauseObservation], accepted: Sequence[Candidate], settings: RankSettings
) -> tuple[list[Candidate], list[Candidate]]:
    """The accepted candidates that remain causes, and those that are effects of a better one: named in
    its `explains` and changed no earlier than it (within the slack) and within the lead window after."""
    explains = {o.cause.id: o.cause.explains for o in observations}
    by: dict[str, str] = {}
    for a in accepted:  # best first
        at = a.evidence[0].change_at
        if a.cause in by or at is None:
            continue
        for b in accepted:
            bt = b.evidence[0].change_at
            if b is a or b.cause in by or b.cause not in explains.get(a.cause, ()) or bt is None:
                continue
            if at - settings.slack_seconds <= bt <= at + settings.max_lead_seconds:
                by[b.cause] = a.cause
    causes = [c for c in accepted if c.cause not in by]
    effects = [replace(c, explained_by=by[c.cause]) for c in accepted if c.cause in by]
    return causes, effects


def _layers(
    observations: Sequence[CauseObservation],
    accepted: Sequence[Candidate],
    effects: Sequence[Candidate] = (),
    ours: Sequence[Candidate] = (),
) -> dict[str, str]:
    """The elimination, layer by layer: where a cause lined up, what lined up as the effect of
    another, what was read and ruled out, or that nothing could be read."""
    out: dict[str, str] = {}
    for layer in LAYERS:
        found = [c.title for c in accepted if c.layer == layer]
        explained = [f"{c.title} (an effect of {c.explained_by})" for c in effects if c.layer == layer]
        explained += [f"{c.title} ({c.caused_by_us}, not a cause)" for c in ours if c.layer == layer]
        read = [o.cause.title for o in observations if o.cause.layer == layer and o.primary is not None]
        if found:
            out[layer] = "cause: " + ", ".join([*found, *explained])
        elif explained:
            out[layer] = "explained: " + ", ".join(explained)
        elif read:
            out[layer] = "ruled out: " + ", ".join(read) + " did not line up"
        else:
            out[layer] = "no data"
    return out


def _split_time(pts: Sequence[tuple[float, float]], k: int) -> float:
    # the change happened between the last sample before and the first after: a gap widens it
    return (pts[k - 1][0] + pts[k][0]) / 2.0


def _pooled_sd(a: Sequence[float], b: Sequence[float], ma: float, mb: float) -> float:
    ss = sum((x - ma) ** 2 for x in a) + sum((x - mb) ** 2 for x in b)
    dof = len(a) + len(b) - 2
    return math.sqrt(ss / dof) if dof > 0 else 0.0


def _downsample(pts: Sequence[tuple[float, float]], limit: int) -> tuple[Point, ...]:
    if len(pts) <= limit:
        return tuple(Point(t, v) for t, v in pts)
    stride = len(pts) / limit
    return tuple(Point(*pts[int(i * stride)]) for i in range(limit))


def _lead_words(lead: float) -> str:
    if abs(lead) < 30:
        return "at the onset"
    minutes = abs(lead) / 60
    return f"{minutes:.1f} min {'before' if lead > 0 else 'after'} the onset"
