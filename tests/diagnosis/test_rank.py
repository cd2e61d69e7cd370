"""The pure ranking: change-points, alignment with the symptom's onset, gates, requirements, causes that
explain others, and the hostile cases (NaN, gaps, flat series, a change long before the symptom, the
traffic spike where load rises first, a neighbour next to an idle pod, an eviction before a restart)."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import replace

import pytest

from remediation.diagnosis import catalogue
from remediation.diagnosis.rank import (
    CauseObservation,
    RankSettings,
    SeriesData,
    _lead_words,
    alignment,
    change_point,
    check,
    clean,
    estimate_onset,
    evaluate,
    rank,
    strength,
)
from remediation.diagnosis.types import NOTHING_LINES_UP, SIGNALS_MISSING, Diagnosis, OwnAction, own_actions

ONSET = 1_000_000.0
STEP = 15.0
START, END = ONSET - 1800, ONSET + 300


def series(fn: Callable[[float], float], start: float = START, end: float = END) -> list[tuple[float, float]]:
    out = []
    t = start
    while t <= end:
        out.append((t, fn(t)))
        t += STEP
    return out


def step(
    before: float, after: float, at: float, noise: float = 0.0, seed: int = 1
) -> list[tuple[float, float]]:
    rnd = random.Random(seed)
    return series(lambda t: (after if t >= at else before) + rnd.gauss(0, noise))


def flat(value: float, noise: float = 0.0, seed: int = 2) -> list[tuple[float, float]]:
    rnd = random.Random(seed)
    return series(lambda t: value + rnd.gauss(0, noise))


def data(points: list[tuple[float, float]]) -> SeriesData:
    return SeriesData(query="q", points=points)


def obs(
    cause_id: str, primary: list[tuple[float, float]] | None, **signals: list[tuple[float, float]]
) -> CauseObservation:
    """A cause's observation; keyword arguments feed its corroborating and required signals by id."""
    c = catalogue.cause(cause_id)
    extra = [(s, data(signals[s.id]) if s.id in signals else None) for s in c.corroborating]
    needed = [(r, data(signals[r.signal.id]) if r.signal.id in signals else None) for r in c.requires]
    return CauseObservation(c, data(primary) if primary is not None else None, extra, needed)


def ranked(*observations: CauseObservation, onset: float = ONSET) -> Diagnosis:
    return rank(observations, symptom_onset=onset, window_start=START, window_end=END, computed_at=END)


# -- change-points ------------------------------------------------------------------------------


def test_change_point_finds_a_step_at_its_time_with_levels() -> None:
    change = change_point(step(1.0, 0.4, ONSET - 30, noise=0.02), "down", around=ONSET)
    assert change is not None
    assert abs(change.at - (ONSET - 30)) <= STEP
    assert change.before == pytest.approx(1.0, abs=0.05) and change.after == pytest.approx(0.4, abs=0.05)


def test_change_point_ignores_the_wrong_direction() -> None:
    assert change_point(step(1.0, 0.4, ONSET), "up", around=ONSET) is None


def test_flat_series_has_no_change_point_even_with_noise() -> None:
    assert change_point(flat(5.0), "up", around=ONSET) is None
    # noise alone may give a tiny "shift": its gate and strength keep it out of the ranking
    d = ranked(obs("serving.load", flat(50.0, noise=1.0)))
    assert d.status == "no_diagnosis" and d.reason_code == NOTHING_LINES_UP


def test_nan_inf_and_duplicate_timestamps_are_dropped_not_propagated() -> None:
    pts = step(1.0, 0.3, ONSET)
    hostile = [*pts[:10], (pts[10][0], math.nan), (pts[11][0], math.inf), *pts[12:], pts[-1]]
    hostile.insert(20, (pts[20][0], -math.inf))
    change = change_point(hostile, "down", around=ONSET)
    assert change is not None and math.isfinite(change.effect)
    assert abs(change.at - ONSET) <= STEP
    ev = evaluate(catalogue.cause("host.page_cache_eviction").primary, data(hostile), ONSET)
    json.dumps(ev.to_dict(), allow_nan=False)  # the record never carries a NaN


def test_a_gap_across_the_change_puts_it_in_the_middle_of_the_gap() -> None:
    pts = [(t, v) for t, v in step(1.0, 0.3, ONSET) if not ONSET - 240 <= t < ONSET + 60]
    change = change_point(pts, "down", around=ONSET)
    assert change is not None
    # last sample before the gap ONSET-255, first after ONSET+60: the change is placed between
    assert change.at == pytest.approx((ONSET - 255 + ONSET + 60) / 2)


def test_too_few_samples_is_no_change_and_says_so() -> None:
    ev = evaluate(catalogue.cause("serving.load").primary, data(step(1, 9, ONSET)[-4:]), ONSET)
    assert not ev.changed and ev.note == "too few samples"


def test_rate_signals_take_half_their_window_off_the_change_time() -> None:
    sig = catalogue.cause("serving.load").primary
    assert sig.lag_seconds == 60.0
    # a [2m] rate of a step at ONSET ramps from ONSET to ONSET+120: its middle is ONSET+60
    ramp = series(lambda t: 10.0 + 10.0 * min(1.0, max(0.0, (t - ONSET) / 120)))
    ev = evaluate(sig, data(ramp), ONSET)
    assert ev.lead_seconds is not None and abs(ev.lead_seconds) <= STEP


def test_of_two_steps_the_one_at_the_onset_is_chosen() -> None:
    pts = series(lambda t: 1.0 if t < ONSET - 1500 else (0.95 if t < ONSET else 0.5))
    change = change_point(pts, "down", around=ONSET)
    assert change is not None and abs(change.at - ONSET) <= STEP


# -- alignment ----------------------------------------------------------------------------------


def test_alignment_is_full_near_the_onset_and_zero_far_away_or_well_after() -> None:
    s = RankSettings()
    assert alignment(0.0) == 1.0 and alignment(s.slack_seconds) == 1.0
    assert 0.0 < alignment(300.0) < 1.0
    assert alignment(25 * 60.0) == 0.0  # long before
    assert alignment(-5 * 60.0) == 0.0  # well after the symptom: an effect, not a cause
    # trailing decays faster than leading
    assert alignment(-100.0) < alignment(100.0)


# -- ranking ------------------------------------------------------------------------------------


def test_page_cache_eviction_at_the_onset_is_the_top_cause_with_its_evidence() -> None:
    d = ranked(
        obs(
            "host.page_cache_eviction",
            step(1.0, 0.35, ONSET - 20, noise=0.01),
            node_disk_reads=step(2e6, 4e8, ONSET - 90, noise=1e5),
        ),
        obs("hardware.thermal_throttle", flat(0.0), gpu_temperature=flat(62.0, noise=0.5)),
        obs("serving.load", flat(40.0, noise=0.5)),
    )
    assert d.status == "diagnosed" and d.confident
    assert d.top is not None and d.top.cause == "host.page_cache_eviction" and d.top.layer == "host"
    assert d.headline == "host: page-cache eviction"
    primary, disk = d.top.evidence
    assert primary.before == pytest.approx(1.0, abs=0.05) and primary.after == pytest.approx(0.35, abs=0.05)
    assert primary.lead_seconds is not None and abs(primary.lead_seconds - 20) <= STEP
    assert disk.passed_gate and disk.alignment > 0  # node_exporter's disk reads corroborate
    assert [c.cause for c in d.candidates] == ["host.page_cache_eviction"]


def test_corroboration_raises_the_score() -> None:
    alone = ranked(obs("host.page_cache_eviction", step(1.0, 0.35, ONSET, noise=0.05)))
    backed = ranked(
        obs(
            "host.page_cache_eviction",
            step(1.0, 0.35, ONSET, noise=0.05),
            node_disk_reads=step(2e6, 4e8, ONSET),
        )
    )
    assert alone.top is not None and backed.top is not None
    assert backed.top.score > alone.top.score


def test_traffic_spike_negative_control_blames_load_never_the_gpu() -> None:
    # load rises first; GPU temperature, SM activity and host CPU follow it without reaching a fault
    d = ranked(
        obs(
            "serving.load", step(40.0, 110.0, ONSET - 75, noise=1.0), requests_running=step(8, 30, ONSET - 60)
        ),
        obs(
            "hardware.thermal_throttle",
            flat(0.0),
            gpu_temperature=step(61.0, 72.0, ONSET - 30, noise=0.3),
            gpu_sm_clock=flat(1.98e9),
        ),
        obs(
            "host.cpu_starvation",
            step(0.3, 0.62, ONSET - 60, noise=0.01),
            gpu_sm_activity_drop=step(0.4, 0.9, ONSET),
        ),
        obs("scheduling.gpu_memory_neighbour", flat(0.1)),
        obs("host.page_cache_eviction", flat(1.0)),
    )
    assert d.top is not None and d.top.cause == "serving.load" and d.top.layer == "serving"
    assert all(c.layer != "hardware" for c in d.candidates)
    # the host CPU rose, but to 0.62 cores: recorded as rejected, with the reason
    starved = next(c for c in d.rejected if c.cause == "host.cpu_starvation")
    assert "short of a fault" in starved.evidence[0].note


def test_a_signal_that_changed_long_before_the_symptom_is_not_the_cause() -> None:
    d = ranked(obs("host.page_cache_eviction", step(1.0, 0.3, ONSET - 25 * 60, noise=0.01)))
    assert d.status == "no_diagnosis" and d.reason_code == NOTHING_LINES_UP
    (late,) = d.rejected
    assert late.evidence[0].note == "changed 25 min before the symptom"


def test_a_change_well_after_the_symptom_is_an_effect_not_a_cause() -> None:
    d = ranked(
        obs("hardware.thermal_throttle", step(0.0, 1.0, ONSET + 240)),
        obs("serving.load", step(40.0, 100.0, ONSET - 60)),
    )
    assert d.top is not None and d.top.cause == "serving.load"
    assert "hardware.thermal_throttle" in {c.cause for c in d.rejected}


def test_specific_cause_beats_load_when_both_line_up() -> None:
    d = ranked(
        obs("serving.load", step(40.0, 90.0, ONSET - 60)),
        # no corroboration here: only the weights tell the two apart
        obs("host.cpu_starvation", step(0.5, 1.0, ONSET - 60)),
    )
    assert d.top is not None and d.top.cause == "host.cpu_starvation"
    assert [c.cause for c in d.candidates] == ["host.cpu_starvation", "serving.load"]
    # by score, not by the name's order: load is the generic explanation and weighs less
    assert d.candidates[0].score > d.candidates[1].score


def test_thermal_throttle_gate_and_order() -> None:
    d = ranked(
        obs(
            "hardware.thermal_throttle",
            step(0.0, 1.0, ONSET - 30),
            gpu_temperature=step(78.0, 91.0, ONSET - 120, noise=0.3),
            gpu_sm_clock=step(1.98e9, 1.2e9, ONSET - 30),
        ),
        obs("serving.load", flat(40.0, noise=0.5)),
    )
    assert d.top is not None and d.top.cause == "hardware.thermal_throttle" and d.confident
    assert all(e.passed_gate for e in d.top.evidence)


def test_no_data_at_all_is_signals_missing() -> None:
    d = ranked(obs("serving.load", None), obs("host.page_cache_eviction", None))
    assert d.status == "no_diagnosis" and d.reason_code == SIGNALS_MISSING
    assert d.headline.startswith("no diagnosis: ")


def test_two_close_candidates_of_different_layers_are_not_confident() -> None:
    d = ranked(
        obs("host.page_cache_eviction", step(1.0, 0.3, ONSET)),
        obs("hardware.thermal_throttle", step(0.0, 1.0, ONSET)),
    )
    assert d.status == "diagnosed" and not d.confident
    assert d.headline.endswith("(not certain)")


def test_estimate_onset_uses_the_shift_before_the_alert_fired() -> None:
    p99 = step(0.08, 2.4, ONSET, noise=0.005)
    change = estimate_onset(data(p99), "up", fired_at=ONSET + 240)
    assert change is not None and abs(change.at - ONSET) <= STEP
    assert estimate_onset(None, "up", fired_at=ONSET) is None
    assert estimate_onset(data(flat(0.1)), "up", fired_at=ONSET) is None


def test_the_diagnosis_round_trips_through_json() -> None:
    d = ranked(
        obs("host.page_cache_eviction", step(1.0, 0.35, ONSET), node_disk_reads=step(2e6, 4e8, ONSET)),
        obs("serving.load", step(40.0, 42.0, ONSET - 25 * 60)),
    )
    again = Diagnosis.from_dict(json.loads(json.dumps(d.to_dict(), allow_nan=False)))
    assert again.to_dict() == d.to_dict()
    assert again.top is not None and again.top.cause == d.top.cause  # type: ignore[union-attr]


def test_the_layers_are_eliminated_one_by_one() -> None:
    d = ranked(
        obs("host.page_cache_eviction", step(1.0, 0.35, ONSET)),
        obs("hardware.thermal_throttle", flat(0.0)),
        obs("serving.load", flat(40.0)),
        obs("scheduling.gpu_memory_neighbour", None),
    )
    assert d.layers == {
        "hardware": "ruled out: thermal throttling did not line up",
        "host": "cause: page-cache eviction",
        "scheduling": "no data",
        "serving": "ruled out: load did not line up",
    }


# -- requirements and explanations --------------------------------------------------------------


def test_a_neighbour_taking_sm_time_is_a_cause_only_when_the_pod_had_gpu_work() -> None:
    surge = step(0.5, 0.95, ONSET - 30, noise=0.01)
    busy = ranked(obs("scheduling.gpu_sm_neighbour", surge, own_sm_level=step(0.45, 0.05, ONSET - 30)))
    assert busy.top is not None and busy.top.cause == "scheduling.gpu_sm_neighbour" and busy.confident
    need = busy.top.evidence[-1]
    assert need.signal == "own_sm_level" and need.passed_gate and "met" in need.note
    idle = ranked(obs("scheduling.gpu_sm_neighbour", surge, own_sm_level=flat(0.0)))
    assert idle.status == "no_diagnosis" and idle.reason_code == NOTHING_LINES_UP
    (rejected,) = idle.rejected
    assert rejected.score == 0.0 and "not met" in rejected.evidence[-1].note
    # no data for what the cause needs: it cannot be told apart, so it is no cause
    blind = ranked(obs("scheduling.gpu_sm_neighbour", surge))
    assert blind.status == "no_diagnosis" and "no data to tell" in blind.rejected[0].evidence[-1].note


def test_a_saturated_node_is_contention_only_when_the_gpu_process_did_not_take_the_cpu_itself() -> None:
    node = step(0.35, 0.97, ONSET - 30, noise=0.01)
    others = ranked(obs("host.cpu_contention", node, process_host_cpu=step(0.6, 0.42, ONSET - 30)))
    assert others.top is not None and others.top.cause == "host.cpu_contention"
    itself = ranked(obs("host.cpu_contention", node, process_host_cpu=step(0.6, 6.0, ONSET - 30)))
    assert itself.status == "no_diagnosis"
    assert "not met" in itself.rejected[0].evidence[-1].note


def _rollout_and_eviction(evicted_at: float) -> Diagnosis:
    return ranked(
        obs("serving.rollout", step(1.0, 2.0, ONSET - 90)),
        obs("host.page_cache_eviction", step(1.0, 0.1, evicted_at, noise=0.005)),
        obs("serving.kv_cache", step(0.55, 0.05, ONSET, noise=0.005)),
    )


def test_a_restart_takes_the_cold_page_cache_and_the_empty_kv_cache_as_its_effects() -> None:
    d = _rollout_and_eviction(ONSET - 100)
    assert d.top is not None and d.top.cause == "serving.rollout" and d.confident
    assert [c.cause for c in d.candidates] == ["serving.rollout"]
    effects = {c.cause: c for c in d.rejected if c.explained_by}
    assert set(effects) == {"host.page_cache_eviction", "serving.kv_cache"}
    assert all(c.explained_by == "serving.rollout" and c.score > 0.2 for c in effects.values())
    assert "an effect of serving.rollout" in d.layers["host"]
    # what it explained is kept with the record
    again = Diagnosis.from_dict(json.loads(json.dumps(d.to_dict())))
    assert {c.cause: c.explained_by for c in again.rejected if c.explained_by} == {
        "host.page_cache_eviction": "serving.rollout",
        "serving.kv_cache": "serving.rollout",
    }


def test_an_eviction_that_began_before_the_restart_is_not_its_effect() -> None:
    d = _rollout_and_eviction(ONSET - 200)
    # it stays a rival cause in the ranking, with its own score, not an effect in `rejected`
    assert {c.cause for c in d.candidates} >= {"serving.rollout", "host.page_cache_eviction"}
    assert all(not c.explained_by for c in d.candidates)
    assert "host.page_cache_eviction" not in {c.cause for c in d.rejected}


def test_evidence_with_labels_names_them_in_its_note() -> None:
    top = SeriesData("topk", step(0.5, 0.95, ONSET - 30), {"namespace": "research", "pod": "vllm-0"})
    ev = evaluate(catalogue.cause("scheduling.gpu_sm_neighbour").corroborating[1], top, ONSET)
    assert ev.signal == "top_sm_neighbour" and "namespace=research, pod=vllm-0" in ev.note


# -- the edges of each rule (where a boundary is inclusive, and what each decay constant gives) ----


def test_alignment_holds_at_the_edges_of_its_window_and_decays_by_its_own_constant_each_way() -> None:
    assert alignment(60.0) == 1.0 and alignment(-60.0) == 1.0  # the slack, both ways, inclusive
    assert alignment(60.0 + 240.0) == pytest.approx(math.exp(-1))  # leading: e-folding 240 s
    assert alignment(-(60.0 + 60.0)) == pytest.approx(math.exp(-1))  # trailing: e-folding 60 s
    assert alignment(600.0) == pytest.approx(math.exp(-540 / 240)) and alignment(600.001) == 0.0
    assert alignment(-120.0) > 0.0 and alignment(-120.001) == 0.0


def test_strength_is_nothing_for_no_shift_and_0_63_at_its_scale() -> None:
    assert strength(0.0) == 0.0 and strength(-4.0) == 0.0
    assert strength(3.0) == pytest.approx(1 - math.exp(-1))


def test_the_lead_is_said_in_minutes_before_or_after_and_at_the_onset_within_30_s() -> None:
    assert _lead_words(29.9) == "at the onset" and _lead_words(-29.9) == "at the onset"
    assert _lead_words(30.0) == "0.5 min before the onset"
    assert _lead_words(-150.0) == "2.5 min after the onset"


def test_unreadable_samples_are_dropped_and_a_repeated_timestamp_keeps_its_last_value() -> None:
    hostile = [(1, "x"), (None, 1), (2, 2.0), (3, "4"), (2, 5.0), (0, 1), ("t", 1), (4, None)]
    assert clean(hostile) == [(0.0, 1.0), (2.0, 5.0), (3.0, 4.0)]  # type: ignore[arg-type]


def _grid(values: list[float]) -> list[tuple[float, float]]:
    return [(i * STEP, v) for i, v in enumerate(values)]


def test_a_change_needs_min_points_per_side_on_each_side_and_no_more() -> None:
    assert change_point(_grid([0, 0, 0, 10, 10, 10]), "up", around=None) is not None
    assert change_point(_grid([0, 0, 0, 10, 10]), "up", around=None) is None
    first = change_point(_grid([0] * 3 + [10] * 7), "up", around=None)
    last = change_point(_grid([0] * 7 + [10] * 3), "up", around=None)
    assert first is not None and first.at == 2.5 * STEP
    assert last is not None and last.at == 6.5 * STEP


def test_not_after_keeps_a_split_at_that_very_moment_and_drops_a_later_one() -> None:
    pts = _grid([0] * 3 + [10] * 7)  # the split lies at 37.5 s
    assert change_point(pts, "up", around=None, not_after=37.5) is not None
    assert change_point(pts, "up", around=None, not_after=37.4) is None


def test_a_requirement_reads_the_medians_of_the_windows_either_side_of_the_onset_edges_included() -> None:
    lag = 30.0  # a rate signal's samples stand for lag seconds earlier
    sig = catalogue.Signal("own", "own level", "q", "up", lag_seconds=lag)
    req = catalogue.Requirement(sig, "it had work", before_at_least=2.0, max_rise=5.0)
    at = {-615.0: 100.0, -600.0: 3.0, -15.0: 1.0, 0.0: 5.0, 300.0: 9.0, 315.0: 100.0}
    pts = [(ONSET + offset + lag, v) for offset, v in at.items()]
    ev = check(req, data(pts), ONSET)
    assert (ev.before, ev.after) == (2.0, 7.0)  # medians of (3, 1) and (5, 9)
    assert ev.passed_gate and ev.note.endswith("2 before, 7 after the onset, met")
    # nothing after the onset: the level before stands for both
    only_before = check(req, data([(ONSET + o + lag, v) for o, v in at.items() if o < 0]), ONSET)
    assert (only_before.before, only_before.after) == (2.0, 2.0)


def test_each_signal_says_in_words_what_it_did() -> None:
    residency = catalogue.cause("host.page_cache_eviction").primary
    assert evaluate(residency, data(flat(1.0)), ONSET).note == "no downward change"
    assert (
        evaluate(catalogue.cause("serving.load").primary, data(flat(1.0)), ONSET).note == "no upward change"
    )
    late = evaluate(residency, data(step(1.0, 0.3, ONSET + 240)), ONSET)
    assert late.note == "changed 4 min after the symptom" and late.alignment == 0.0
    short = evaluate(residency, data(step(1.0, 0.93, ONSET)), ONSET)
    assert short.note == "changed, but 0.93 is short of a fault (<= 0.9 and a change of at least 0.05)"
    assert (
        evaluate(residency, data(step(1.0, 0.3, ONSET - 90)), ONSET).note
        == "1 -> 0.3, 1.6 min before the onset"
    )
    # a per-pod series names its labels in a fixed order, whatever order they came in
    top = SeriesData("topk", step(0.5, 0.95, ONSET - 30), {"pod": "vllm-0", "namespace": "research"})
    ev = evaluate(catalogue.cause("scheduling.gpu_sm_neighbour").corroborating[1], top, ONSET)
    assert ev.note == "0.5 -> 0.95, 0.6 min before the onset (namespace=research, pod=vllm-0)"


def test_two_close_candidates_of_one_layer_are_confident_about_the_layer() -> None:
    d = ranked(
        obs("host.cpu_starvation", step(0.5, 1.0, ONSET - 60)),
        obs("host.page_cache_eviction", step(1.0, 0.3, ONSET - 60, noise=0.14)),
    )
    assert [c.layer for c in d.candidates] == ["host", "host"]
    assert d.candidates[0].score - d.candidates[1].score < RankSettings().confident_margin
    assert d.confident


def test_a_larger_step_too_early_to_line_up_weighs_nothing_against_a_smaller_one_at_the_onset() -> None:
    pts = series(lambda t: 1.0 if t < ONSET - 700 else (0.5 if t < ONSET else 0.3))
    change = change_point(pts, "down", around=ONSET)
    assert change is not None and abs(change.at - ONSET) <= STEP
    assert (change.before, change.after) == (0.5, 0.3)


def test_a_lone_cause_that_lines_up_only_loosely_is_ranked_but_not_confident() -> None:
    d = ranked(obs("host.page_cache_eviction", step(1.0, 0.3, ONSET - 330)))
    assert d.top is not None and d.top.cause == "host.page_cache_eviction"
    assert RankSettings().min_score <= d.top.score < RankSettings().confident_score
    assert not d.confident


def test_an_effect_is_timed_by_its_primary_signal_not_by_a_corroborating_one() -> None:
    # the disk reads moved long before the restart; the residency, which is what is ranked, right after
    d = ranked(
        obs("serving.rollout", step(1.0, 2.0, ONSET - 90)),
        obs(
            "host.page_cache_eviction",
            step(1.0, 0.1, ONSET - 100, noise=0.005),
            node_disk_reads=step(2e6, 4e8, ONSET - 400),
        ),
    )
    assert [c.cause for c in d.candidates] == ["serving.rollout"]
    assert [(c.cause, c.explained_by) for c in d.rejected] == [
        ("host.page_cache_eviction", "serving.rollout")
    ]


def test_an_effect_takes_no_effects_of_its_own() -> None:
    """Only a standing cause explains: an eviction the restart brought about does not in turn make
    the thermal throttle its effect, even where its cause says it could (a catalogue of our own)."""
    evict = obs("host.page_cache_eviction", step(1.0, 0.1, ONSET - 100, noise=0.15))
    evict = replace(evict, cause=replace(evict.cause, explains=("hardware.thermal_throttle",)))
    d = ranked(
        obs("serving.rollout", step(1.0, 2.0, ONSET - 90)),
        evict,
        obs("hardware.thermal_throttle", step(0.0, 1.0, ONSET - 60)),
    )
    assert [c.cause for c in d.candidates] == ["hardware.thermal_throttle", "serving.rollout"]
    assert [(c.cause, c.explained_by) for c in d.rejected] == [
        ("host.page_cache_eviction", "serving.rollout")
    ]


def test_the_record_keeps_60_points_of_a_long_series_spread_over_it() -> None:
    pts = step(1.0, 0.3, ONSET)  # 141 samples
    ev = evaluate(catalogue.cause("host.page_cache_eviction").primary, data(pts), ONSET)
    assert len(ev.points) == 60 and (ev.points[0].t, ev.points[0].v) == pts[0]
    assert [p.t for p in ev.points] == [pts[int(i * len(pts) / 60)][0] for i in range(60)]
    short = evaluate(catalogue.cause("host.page_cache_eviction").primary, data(pts[:60]), ONSET)
    assert [(p.t, p.v) for p in short.points] == pts[:60]
    few = evaluate(catalogue.cause("host.page_cache_eviction").primary, data(pts[:30]), ONSET)
    assert [(p.t, p.v) for p in few.points] == pts[:30]


def _alternating(shift: float, start: float) -> list[tuple[float, float]]:
    """Noise of exactly one unit (+1, -1, ...) around 0, then around `shift` from the onset."""
    grid = series(lambda t: 0.0, start=start)
    return [(t, (shift if t >= ONSET else 0.0) + (1.0 if i % 2 else -1.0)) for i, (t, _) in enumerate(grid)]


def test_a_shift_just_over_min_effect_noise_widths_is_a_change_with_the_noise_pooled_over_both_sides() -> (
    None
):
    # 315 s of history: 21 samples before the onset and 21 after, pooled with n - 2 degrees of freedom
    change = change_point(_alternating(2.2, ONSET - 315), "up", around=ONSET)
    assert change is not None and abs(change.at - ONSET) <= STEP
    assert RankSettings().min_effect < change.effect < 2.5


def test_a_clean_series_needs_a_shift_of_min_effect_times_2_percent_of_its_level() -> None:
    assert change_point(step(100.0, 103.0, ONSET), "up", around=ONSET) is None  # 3 < 2 x 2.06
    found = change_point(step(100.0, 105.0, ONSET), "up", around=ONSET)
    assert found is not None and found.effect == pytest.approx(5 / 2.1)


def test_a_cause_that_lines_up_too_loosely_to_score_min_score_is_rejected() -> None:
    d = ranked(obs("host.page_cache_eviction", step(1.0, 0.3, ONSET - 500)))  # alignment 0.16
    assert d.status == "no_diagnosis" and d.reason_code == NOTHING_LINES_UP
    (loose,) = d.rejected
    assert 0.0 < loose.score < RankSettings().min_score


def test_the_thresholds_hold_at_their_own_value_and_the_settings_given_are_used() -> None:
    clear = obs("host.page_cache_eviction", step(1.0, 0.3, ONSET), node_disk_reads=step(2e6, 4e8, ONSET))
    d = rank(
        [clear],
        symptom_onset=ONSET,
        window_start=START,
        window_end=END,
        computed_at=END,
        settings=RankSettings(confident_score=1.0),
    )
    assert d.top is not None and d.top.score == 1.0 and d.confident  # capped at 1.0, and 1.0 >= 1.0
    strict = RankSettings(min_score=0.5)
    loose = obs("host.page_cache_eviction", step(1.0, 0.3, ONSET - 330))  # scores 0.31
    d = rank(
        [loose], symptom_onset=ONSET, window_start=START, window_end=END, computed_at=END, settings=strict
    )
    assert d.status == "no_diagnosis"


def test_alignment_is_full_just_inside_the_slack_and_below_full_just_past_it() -> None:
    assert alignment(59.5) == 1.0 and alignment(-59.5) == 1.0
    assert alignment(60.5) < 1.0 and alignment(-60.5) < 1.0


def test_the_onset_ignores_a_larger_shift_after_the_alert_fired() -> None:
    # the symptom grew again ten minutes later (a second incident, or the remedy's own effect)
    p99 = series(lambda t: 0.08 if t < ONSET else (0.5 if t < ONSET + 600 else 20.0), end=ONSET + 1200)
    change = estimate_onset(data(p99), "up", fired_at=ONSET + 240)
    assert change is not None and abs(change.at - ONSET) <= STEP and change.after == 0.5


def test_of_two_equal_shifts_the_later_one_is_the_change() -> None:
    # two identical rises (21 samples at 10 between 40-sample stretches at 0): the last one counts
    pts = [(i * STEP, 10.0 if (40 <= i <= 60 or 101 <= i <= 121) else 0.0) for i in range(130)]
    change = change_point(pts, "up", around=None)
    assert change is not None and change.at == 100.5 * STEP


def test_the_effect_is_the_shift_in_noise_widths_the_same_up_or_down() -> None:
    down = change_point(step(1.0, 0.5, ONSET), "down", around=ONSET)
    up = change_point(step(0.5, 1.0, ONSET), "up", around=ONSET)
    assert down is not None and up is not None
    assert down.effect == pytest.approx(25.0) and up.effect == pytest.approx(25.0)  # 0.5 / (2 % of 1.0)


def test_a_requirement_is_a_level_not_a_change_in_the_record() -> None:
    surge = step(0.5, 0.95, ONSET - 30, noise=0.01)
    d = ranked(obs("scheduling.gpu_sm_neighbour", surge, own_sm_level=step(0.45, 0.05, ONSET - 30)))
    assert d.top is not None
    need = d.top.evidence[-1]
    assert need.signal == "own_sm_level" and not need.changed
    assert (need.strength, need.alignment, need.change_at, need.lead_seconds) == (0.0, 0.0, None, None)


def test_the_reason_quotes_the_top_causes_primary_signal() -> None:
    d = ranked(
        obs(
            "host.page_cache_eviction",
            step(1.0, 0.35, ONSET - 20),
            node_disk_reads=step(2e6, 4e8, ONSET - 90),
        )
    )
    assert d.reason == "host: page-cache eviction changed in line with the symptom (1 -> 0.35, at the onset)"


def _weighted(o: CauseObservation, weight: float, explains: tuple[str, ...] = ()) -> CauseObservation:
    return replace(o, cause=replace(o.cause, weight=weight, explains=explains or o.cause.explains))


def test_every_standing_cause_takes_its_effects_after_an_effect_in_between() -> None:
    """Best first: the rollout takes the eviction; the eviction, an effect, is passed over; the thermal
    throttle below it still takes its own effect (a catalogue of our own, weights setting the order)."""
    d = ranked(
        obs("serving.rollout", step(1.0, 2.0, ONSET - 90)),
        _weighted(obs("host.page_cache_eviction", step(1.0, 0.1, ONSET - 100)), 0.8),
        _weighted(
            obs("hardware.thermal_throttle", step(0.0, 1.0, ONSET - 60)),
            0.6,
            ("scheduling.gpu_memory_neighbour",),
        ),
        _weighted(obs("scheduling.gpu_memory_neighbour", step(0.1, 0.6, ONSET - 50)), 0.4),
    )
    assert [c.cause for c in d.candidates] == ["serving.rollout", "hardware.thermal_throttle"]
    assert {c.cause: c.explained_by for c in d.rejected} == {
        "host.page_cache_eviction": "serving.rollout",
        "scheduling.gpu_memory_neighbour": "hardware.thermal_throttle",
    }
    assert d.layers == {  # each effect under its own layer only
        "hardware": "cause: thermal throttling",
        "host": "explained: page-cache eviction (an effect of serving.rollout)",
        "scheduling": "explained: another pod on the GPU takes its memory"
        " (an effect of hardware.thermal_throttle)",
        "serving": "cause: restart or rollout (cold start)",
    }


def test_the_effect_is_the_shift_over_the_noise_pooled_with_n_minus_2_degrees_of_freedom() -> None:
    pts = _alternating(2.2, START)  # 40 samples in the before window, 21 in the after window
    change = change_point(pts, "up", around=ONSET)
    before = [v for t, v in pts if ONSET - 600 <= t < ONSET]
    after = [v for t, v in pts if ONSET <= t <= ONSET + 300]
    mb, ma = statistics.fmean(before), statistics.fmean(after)
    ss = sum((x - mb) ** 2 for x in before) + sum((y - ma) ** 2 for y in after)
    assert (len(before), len(after)) == (40, 21)
    assert change is not None and change.effect == pytest.approx((ma - mb) / math.sqrt(ss / 59))


def test_min_effect_noise_widths_is_the_edge_between_noise_and_a_change() -> None:
    assert change_point(_alternating(1.945, ONSET - 315), "up", around=ONSET) is None  # 1.993 widths
    change = change_point(_alternating(1.96, ONSET - 315), "up", around=ONSET)
    assert change is not None and change.effect == pytest.approx(2.008, abs=1e-3)


def test_of_two_shifts_the_larger_wins_even_within_one_noise_width() -> None:
    def two(first: float, second: float) -> list[tuple[float, float]]:
        level = [first if 40 <= i <= 60 else second if 101 <= i <= 121 else 0.0 for i in range(130)]
        return [(i * STEP, v + (1.0 if i % 2 else -1.0)) for i, v in enumerate(level)]

    change = change_point(two(2.6, 2.5), "up", around=None)  # about 2.5 and 2.4 noise widths
    assert change is not None and change.at == 39.5 * STEP


def test_the_cause_that_takes_an_effect_is_timed_by_its_primary_signal_too() -> None:
    # the restart counter moved after the onset; the new GPU process, what is ranked, before it
    d = ranked(
        obs("serving.rollout", step(1.0, 2.0, ONSET - 90), container_restarts=step(0.0, 1.0, ONSET + 100)),
        obs("host.page_cache_eviction", step(1.0, 0.1, ONSET - 100, noise=0.005)),
    )
    assert [c.cause for c in d.candidates] == ["serving.rollout"]
    assert [(c.cause, c.explained_by) for c in d.rejected] == [
        ("host.page_cache_eviction", "serving.rollout")
    ]


def test_the_onset_may_lie_up_to_the_slack_after_the_alert_fired() -> None:
    p99 = step(0.08, 2.4, ONSET)  # the split lies at ONSET - 7.5
    change = estimate_onset(data(p99), "up", fired_at=ONSET - 50)  # 42.5 s after it: within 60
    assert change is not None and change.at == ONSET - 7.5


# -- what the controller itself did (issue 40) ----------------------------------------------------


def _xid_restart_loop(*own: OwnAction) -> Diagnosis:
    """An XID 13 restart loop: the alert fired at ONSET, our restart followed 40 s later and its new
    GPU process shows 75 s after that (a young pod, a cold start); the KV cache it emptied reads
    empty in the 5m-rate rule a few minutes later."""
    return rank(
        (
            obs("serving.rollout", step(1.0, 2.0, ONSET + 75), engine_cold_start=step(0.0, 45.0, ONSET + 90)),
            obs("serving.kv_cache", step(0.55, 0.05, ONSET + 240, noise=0.005)),
        ),
        symptom_onset=ONSET,
        window_start=START,
        window_end=END,
        computed_at=END,
        own=own,
    )


def test_a_new_process_that_our_own_restart_started_is_never_named_the_cause() -> None:
    # without the ledger's actions, the new process lines up and is named: what the demo showed
    assert _xid_restart_loop().top is not None
    assert _xid_restart_loop().top.cause == "serving.rollout"  # type: ignore[union-attr]
    ours = OwnAction("restart", ONSET + 40, ONSET + 45)
    d = _xid_restart_loop(ours)
    assert d.status == "no_diagnosis" and d.top is None
    assert "serving.rollout" not in {c.cause for c in d.candidates}
    (rollout,) = [c for c in d.rejected if c.cause == "serving.rollout"]
    assert rollout.caused_by_us == "our restart at 1970-01-12T13:47:20+00:00"
    assert "our own actions" in d.reason and "our restart at" in d.reason
    # the KV cache our restart emptied is its effect, not a rival cause either
    (kv,) = [c for c in d.rejected if c.cause == "serving.kv_cache"]
    assert kv.explained_by == "serving.rollout"
    assert "not a cause" in d.layers["serving"]
    # kept with the record
    again = Diagnosis.from_dict(json.loads(json.dumps(d.to_dict())))
    assert [c.caused_by_us for c in again.rejected if c.cause == "serving.rollout"] == [rollout.caused_by_us]


def test_a_rollout_before_our_action_or_long_after_it_is_still_a_cause() -> None:
    # our action came 5 minutes after the process change: the rollout was somebody else's
    before = _xid_restart_loop(OwnAction("restart", ONSET + 375, ONSET + 380))
    assert before.top is not None and before.top.cause == "serving.rollout"
    # an action long settled (more than own_action_settle_seconds before the change) did not cause it
    settle = RankSettings().own_action_settle_seconds
    old = _xid_restart_loop(OwnAction("restart", ONSET + 75 - settle - 120, ONSET + 75 - settle - 60))
    assert old.top is not None and old.top.cause == "serving.rollout"
    # within the settle time after the action finished it is ours, however slow the pod came back
    slow = _xid_restart_loop(OwnAction("migrate", ONSET + 75 - settle + 30, ONSET + 75 - settle + 60))
    assert slow.top is None


def test_a_cause_our_actions_do_not_bring_about_is_named_whatever_we_did() -> None:
    thermal = catalogue.cause("hardware.thermal_throttle")
    assert not thermal.follows_our_actions and catalogue.cause("serving.rollout").follows_our_actions
    d = rank(
        (obs("hardware.thermal_throttle", step(0.0, 1.0, ONSET - 30)),),
        symptom_onset=ONSET,
        window_start=START,
        window_end=END,
        computed_at=END,
        own=(OwnAction("restart", ONSET - 40, ONSET - 35),),
    )
    assert d.top is not None and d.top.cause == "hardware.thermal_throttle" and not d.top.caused_by_us


def test_own_actions_are_the_acting_rungs_that_may_have_changed_the_target() -> None:
    history = [
        {"at": 10.0, "kind": "opened", "rung": "", "status": "open", "finished_at": None},
        {"at": 20.0, "kind": "action", "rung": "restart", "status": "succeeded", "finished_at": 25.0},
        {"at": 30.0, "kind": "action", "rung": "restart", "status": "dry_run", "finished_at": 30.0},
        {"at": 40.0, "kind": "action", "rung": "migrate", "status": "refused", "finished_at": 41.0},
        {"at": 50.0, "kind": "action", "rung": "migrate", "status": "skipped", "finished_at": 50.0},
        {"at": 60.0, "kind": "action", "rung": "page", "status": "sent", "finished_at": 61.0},
        {"at": 70.0, "kind": "action", "rung": "migrate", "status": "started", "finished_at": None},
        {"at": 5.0, "kind": "action", "rung": "restart", "status": "failed", "finished_at": 6.0},
    ]
    assert own_actions(history) == (
        OwnAction("restart", 5.0, 6.0),
        OwnAction("restart", 20.0, 25.0),
        OwnAction("migrate", 70.0, None),
    )
