"""How the sampler assembles collectors' families into one valid exposition."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from demo.neighbours import line as neighbour_line
from exporter.collectors.base import NodeState
from exporter.config import ExporterSettings
from exporter.errors import CollectorError
from exporter.sampler import Sampler
from tests.exporter.clocks import StepClock


class _Fixed:
    """A collector that returns (or fails with) prepared families."""

    interval_seconds: float | None = None

    def __init__(self, name: str, families: Sequence[Metric], fail: bool = False) -> None:
        self.name, self.families, self.fail = name, families, fail

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        if self.fail:
            raise CollectorError("kubelet went away", families=self.families)
        return self.families

    async def close(self) -> None:
        return None


def _assert_promtool_accepts(text: str) -> None:
    promtool = neighbour_line().promtool  # the current line's; missing: the test fails
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr + checked.stdout


def _dropped(collector: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(
        "gpupulse_series_dropped", "Series not exported because a cap was reached.", labels=["collector"]
    )
    family.add_metric([collector], value)
    return family


async def test_a_family_two_collectors_share_is_rendered_once() -> None:
    sampler = Sampler(
        [_Fixed("attribution", [_dropped("attribution", 3)]), _Fixed("engines", [_dropped("engines", 5)])],
        ExporterSettings(),
        StepClock(),
    )
    text = (await sampler.sample_once()).body.decode()

    assert text.count("# HELP gpupulse_series_dropped_total") == 1
    assert text.count("# TYPE gpupulse_series_dropped_total counter") == 1
    assert 'gpupulse_series_dropped_total{collector="attribution"} 3.0' in text
    assert 'gpupulse_series_dropped_total{collector="engines"} 5.0' in text
    _assert_promtool_accepts(text)


async def test_failed_round_still_serves_the_families_it_vouches_for() -> None:
    allocation = GaugeMetricFamily("gpu_allocation_info", "GPU allocated to a pod.", labels=["uuid", "pod"])
    allocation.add_metric(["GPU-1", "llama-0"], 1)
    sampler = Sampler([_Fixed("attribution", [allocation], fail=True)], ExporterSettings(), StepClock())
    text = (await sampler.sample_once()).body.decode()

    assert 'gpu_allocation_info{pod="llama-0",uuid="GPU-1"} 1.0' in text
    assert 'gpupulse_collector_success{collector="attribution"} 0.0' in text


def _joined(snapshot_families: Sequence[Metric]) -> Metric:
    return next(f for f in snapshot_families if f.name == "gpupulse_series_dropped")


async def test_a_shared_family_is_joined_anew_only_when_a_part_changes() -> None:
    engines = _Fixed("engines", [_dropped("engines", 5)])
    sampler = Sampler(
        [_Fixed("attribution", [_dropped("attribution", 3)]), engines], ExporterSettings(), StepClock()
    )
    first = _joined((await sampler.sample_once()).families)
    # the collectors serve the same objects (as an interval collector does between its rounds)
    assert _joined((await sampler.sample_once()).families) is first

    engines.families = [_dropped("engines", 6)]  # the next round's family: a new object
    snap = await sampler.sample_once()
    again = _joined(snap.families)

    assert again is not first
    assert [s.value for s in again.samples] == [3, 6]
    assert 'gpupulse_series_dropped_total{collector="engines"} 6.0' in snap.body.decode()
    assert [f.name for f in snap.families].count("gpupulse_series_dropped") == 1


async def test_shared_families_of_different_types_keep_the_first_and_say_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gauge = GaugeMetricFamily("gpupulse_series_dropped", "Not a counter.", labels=["collector"])
    gauge.add_metric(["engines"], 9)
    sampler = Sampler(
        [_Fixed("attribution", [_dropped("attribution", 3)]), _Fixed("engines", [gauge])],
        ExporterSettings(),
        StepClock(),
    )
    text = (await sampler.sample_once()).body.decode()
    await sampler.sample_once()  # the same parts: not joined (nor logged) again

    assert 'gpupulse_series_dropped_total{collector="attribution"} 3.0' in text
    assert 'gpupulse_series_dropped_total{collector="engines"}' not in text
    assert 'gpupulse_series_dropped{collector="engines"}' not in text
    assert [r.message for r in caplog.records].count(
        "families named gpupulse_series_dropped disagree on type (counter, gauge); dropping the latter"
    ) == 1
    _assert_promtool_accepts(text)
