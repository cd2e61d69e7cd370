"""The NVML collectors of a tick share one GPU round: each plans its reads, the sampler sends them to
the GPUs as one batch per GPU, and each publishes from its answers. A collector that fails to plan or
publish fails alone; a caller that gives up on a round does not end it for the others; a tick leaves
nothing for the cyclic garbage collector."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.collectors.base import NodeState
from exporter.collectors.gpus import Answers, Outcome
from exporter.errors import CollectorError
from exporter.nvml import Device
from tests.exporter.harness import simulated_exporter
from tests.exporter.test_exporter_failures import FAILURES, GPU0, series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exporter"


class _Beside:
    """A collector outside the fleet (a plug-in's shape), on every tick."""

    name = "beside"
    interval_seconds = None

    def __init__(self) -> None:
        self.rounds = 0

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        self.rounds += 1
        family = GaugeMetricFamily("beside_round", "which round this is")
        family.add_metric([], float(self.rounds))
        return [family]

    async def close(self) -> None:
        return None


def _count_rounds(runner: Any) -> list[int]:
    """Counts the rounds handed to the fleet's runner (or fanned out when it refuses)."""
    rounds = [0]
    submit: Callable[[Callable[[], None]], bool] = runner.submit

    def counted(fn: Callable[[], None]) -> bool:
        rounds[0] += 1
        return submit(fn)

    runner.submit = counted
    return rounds


async def test_every_nvml_collector_of_a_tick_rides_in_one_round_beside_other_collectors() -> None:
    beside = _Beside()
    async with simulated_exporter(FAILURES, start_seconds=1.0, extra=[beside]) as h:
        await h.tick(0)
        rounds = _count_rounds(h.fleet._runner)
        calls = dict(h.sim.calls)
        for n in range(1, 4):
            await h.tick(1.0)
            assert rounds[0] == n  # one hand-over per tick, for six collectors and three GPUs
        text = h.text()
        assert series(text, "beside_round") == {"": 4.0}
        # every collector of the fast tier read in those rounds
        for symbol in (
            "nvmlDeviceGetTemperatureV",
            "nvmlGpmSampleGet",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetProcessUtilization",
        ):
            assert h.sim.calls[symbol] > calls.get(symbol, 0), symbol
        success = series(text, "gpupulse_collector_success")
        assert {k: v for k, v in success.items() if v != 1.0} == {}
        names = ("device", "gpm", "health", "nvlink", "processes", "mig", "beside")
        assert set(success) >= {f'{{collector="{n}"}}' for n in names}


@pytest.mark.parametrize("step", ["plan", "publish"])
async def test_a_collector_that_crashes_fails_alone(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0) as h:
        gpm = next(c for c in h.sampler.collectors if c.name == "gpm")

        def broken(*_: object) -> Sequence[Metric]:
            raise RuntimeError(f"a bug in {step}")

        monkeypatch.setattr(gpm, step, broken)
        await h.tick(0)
        await h.tick(1.0)
        text = h.text()
        success = series(text, "gpupulse_collector_success")
        assert success['{collector="gpm"}'] == 0.0
        assert {k for k, v in success.items() if v == 0.0} == {'{collector="gpm"}'}
        assert "{" + GPU0 + "}" in series(text, "gpu_temperature_celsius")  # the others published
        assert not series(text, "gpu_sm_active_ratio")


async def test_a_collector_error_in_publish_serves_the_families_it_carries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0, collectors=["device", "health"]) as h:
        health = next(c for c in h.sampler.collectors if c.name == "health")
        publish = health.publish

        def partial(answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
            raise CollectorError("part of the round failed", list(publish(answers, state)))

        monkeypatch.setattr(health, "publish", partial)
        await h.tick(0)
        text = h.text()
        assert series(text, "gpupulse_collector_success")['{collector="health"}'] == 0.0
        assert series(text, "gpu_ecc_errors_total")  # what it did read is served


async def test_a_caller_that_gives_up_does_not_end_the_round_for_the_others() -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0) as h:
        slots = h.fleet.slots

        def index(dev: Device) -> int:
            return dev.static.index

        # both queued in this turn: one round
        quitter = asyncio.ensure_future(h.fleet.answer([(index, slots)]))
        stayer = asyncio.ensure_future(h.fleet.answer([(index, slots[:2]), (index, slots[2:])]))
        await asyncio.sleep(0)  # both have queued their reads
        quitter.cancel()
        answers = await stayer
        assert [[r for _, r in a] for a in answers] == [[0, 1], [2]]
        assert quitter.cancelled()


async def test_a_read_that_raises_fails_only_itself() -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0) as h:
        slots = h.fleet.slots

        def picky(dev: Device) -> int:
            if dev.static.index == 1:
                raise ValueError("a bug reading GPU 1")
            return dev.static.index

        (picked, plain) = await h.fleet.answer([(picky, slots), (lambda dev: "ok", slots)])
        assert [r for _, r in picked] == [0, Outcome.FAILED, 2]
        assert [r for _, r in plain] == ["ok", "ok", "ok"]
        assert not slots[1].lost and not slots[1].stale


async def test_a_tick_leaves_no_reference_cycles() -> None:
    # A round's callbacks and jobs refer to each other; left as a cycle, every tick's readings wait
    # for the cyclic collector, which then runs ten times as often and walks the whole heap.
    async with simulated_exporter(FIXTURES / "failures.yaml", start_seconds=1.0) as h:
        for _ in range(3):
            await h.tick(1.0)
        gc.collect()
        gc.disable()
        try:
            for _ in range(5):
                await h.tick(1.0)
            assert gc.collect() == 0
        finally:
            gc.enable()
