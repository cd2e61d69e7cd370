"""The benign-fleet bench's pure parts: the fleet's timeline, promtool's input notation and output."""

from __future__ import annotations

from pathlib import Path

from bench.benign.evaluate import _promtool_time, _values, input_series, parse_results
from bench.benign.fleet import list_fleets, load_fleet
from bench.benign.replay import Scrapes, parse_exposition
from bench.benign.timeline import HOUR, diurnal, plan

SHORT = Path(__file__).resolve().parents[1] / "alerts" / "benign-short.fleet.yaml"


def test_absent_scrapes_are_one_staleness_marker_then_missing_samples() -> None:
    assert _values([1.0, 1.0, None, None, None, 2.0]) == "1x1 stale _x2 2"
    assert _values([None, None, 3.0, None]) == "_x2 3 stale"
    assert _values([0.5]) == "0.5"


def test_a_failed_scrape_drops_every_series_of_the_node_and_up_reads_zero() -> None:
    s = Scrapes("n", [0.0, 60.0, 120.0], up=[1, 0, 1])
    s.add(0, {'gpu_up{gpu="0"}': 1.0})
    s.add(2, {'gpu_up{gpu="0"}': 1.0})
    series = {x["series"]: x["values"] for x in input_series([s])}
    assert series['up{job="gpupulse-exporter",instance="n:9400",node="n"}'] == "1 0 1"
    assert series['gpu_up{job="gpupulse-exporter",instance="n:9400",node="n",gpu="0"}'] == "1 stale 1"


def test_exposition_lines_are_kept_by_sample_name() -> None:
    text = '# HELP x y\n# TYPE gpu_up gauge\ngpu_up{gpu="0",uuid="GPU-1"} 1\ngpu_info{gpu="0"} 1\n'
    assert parse_exposition(text, frozenset({"gpu_up"})) == {'gpu_up{gpu="0",uuid="GPU-1"}': 1.0}


def test_promtool_results_are_read_back_per_expression_and_time() -> None:
    out = (
        "  FAILED:\n"
        '    expr: "count(a{b=\\"c\\"})", time: 1h30m,\n'
        "        exp: nil\n"
        '        got: {alertname="X", pod="p-1"} 2E+00, {alertname="Y"} 1E+00\n'
    )
    assert parse_results(out) == {
        ('count(a{b="c"})', "1h30m"): [({"alertname": "X", "pod": "p-1"}, 2.0), ({"alertname": "Y"}, 1.0)]
    }
    assert [_promtool_time(s) for s in (3600, 5400, 45, 90000)] == ["1h", "1h30m", "45s", "1d1h"]


def test_every_bench_fleet_parses_and_plays_without_two_pods_on_one_gpu() -> None:
    assert len(list_fleets()) >= 3
    for name in list_fleets():
        fleet = load_fleet(name)
        assert fleet.hours == 72 and fleet.gpu_count == 32, name
        plan(fleet)  # raises on overlapping tenancies


def test_the_short_fleet_has_one_of_every_benign_event() -> None:
    fleet = load_fleet(str(SHORT))
    h100, a100 = plan(fleet)
    # the exporter restarts: two runs with a down window between them (a drain adds one on a100)
    assert len(h100.runs) == 2 and h100.runs[0][1] == 2 * HOUR
    assert len(a100.runs) == 3
    assert h100.scrape_fails(3 * HOUR + 30) and not h100.scrape_fails(3 * HOUR + 130)
    # rollouts rename pods: every 4 h after the 1 h offset (hours 5 and 9), GPU 0 sees the first pod
    # and one per rollout
    assert len({x.pod for x in h100.tenancies if x.gpu == 0}) == 3
    # the drain stops the second job; it comes back after it, on every GPU of the node
    late = [x for x in a100.tenancies if x.training_job == "ft-2"]
    assert {x.start for x in late} == {5 * HOUR, 7 * HOUR}
    assert not a100.tenants_at(6.75 * HOUR)
    # the night trough and the day band
    serving = fleet.serving[0]
    assert diurnal(serving, 3 * HOUR) == 0.20
    assert 0.85 <= diurnal(serving, 38 * HOUR) <= 0.92
