"""Tiered sampling: fields that change slowly are read on their own interval and served from the last
read between, never for a GPU that is stale or lost."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.exporter.harness import SETTINGS, simulated_exporter
from tests.exporter.test_exporter_failures import GPU0, GPU1, series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exporter"
TIERED = replace(SETTINGS, slow_fields_interval_seconds=10.0)
SLOW_CALLS = (
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetPcieReplayCounter",
)


def of_gpu(text: str, name: str, gpu: str) -> list[str]:
    """Label sets of `name` that belong to the GPU (matched by its `gpu` label and UUID)."""
    index, uuid = gpu.split(",")
    return [k for k in series(text, name) if index in k and uuid in k]


def slow_calls(calls: dict[str, int]) -> dict[str, int]:
    return {name: calls.get(name, 0) for name in SLOW_CALLS}


async def test_slow_fields_are_read_every_interval_and_served_between() -> None:
    async with simulated_exporter(FIXTURES / "failures.yaml", start_seconds=0.0, settings=TIERED) as h:
        await h.tick(0)
        first = slow_calls(h.sim.calls)
        assert all(n > 0 for name, n in first.items() if name != "nvmlDeviceGetNvLinkState")
        fast_before = h.sim.calls["nvmlDeviceGetTemperatureV"]
        for _ in range(5):
            await h.tick(1.0)
            text = h.text()
            # served from the last read, every tick
            assert len(of_gpu(text, "gpu_ecc_errors_total", GPU0)) == 2
            assert of_gpu(text, "gpu_power_limit_watts", GPU0)
            assert of_gpu(text, "gpu_pcie_link_width", GPU0)
        assert slow_calls(h.sim.calls) == first  # no slow-tier call in those five ticks
        assert h.sim.calls["nvmlDeviceGetTemperatureV"] > fast_before  # the fast tier went on
        await h.tick(5.0)  # 10 s after the first read
        assert all(slow_calls(h.sim.calls)[n] > first[n] for n in first if first[n])


async def test_a_gpu_back_from_stale_is_read_afresh_and_a_lost_one_serves_nothing() -> None:
    async with simulated_exporter(FIXTURES / "failures.yaml", start_seconds=9.0, settings=TIERED) as h:
        await h.tick(0)
        await h.tick(2.0)  # t = 11: GPU 1 hangs in its power call
        text = h.text()
        assert not of_gpu(text, "gpu_power_limit_watts", GPU1)  # nothing stale served
        assert not of_gpu(text, "gpu_ecc_errors_total", GPU1)
        await h.tick(8.0)  # t = 19, before the next slow read: GPU 0 still up
        await h.tick(2.0)  # t = 21: GPU 0 fell off the bus at 20
        text = h.text()
        assert not of_gpu(text, "gpu_ecc_errors_total", GPU0)
        assert not of_gpu(text, "gpu_power_limit_watts", GPU0)
        await h.tick(18.0)  # t = 39: a slow-tier read; GPU 1 still hangs, so it has no reading
        limit_reads = h.sim.calls["nvmlDeviceGetEnforcedPowerLimit"]
        h.clock.advance(2.0)  # t = 41: the hang ended at 40; the next slow-tier read is due at 49 ...
        await h.returned(1)
        await h.tick(0)
        text = h.text()
        assert of_gpu(text, "gpu_power_limit_watts", GPU1)  # ... yet GPU 1 is read as soon as it answers
        assert h.sim.calls["nvmlDeviceGetEnforcedPowerLimit"] == limit_reads + 1  # it alone


async def test_interval_zero_reads_every_tick() -> None:
    every = replace(SETTINGS, slow_fields_interval_seconds=0.0)
    async with simulated_exporter(FIXTURES / "failures.yaml", settings=every) as h:
        await h.tick(0)
        before = h.sim.calls["nvmlDeviceGetTotalEccErrors"]
        await h.tick(1.0)
        assert h.sim.calls["nvmlDeviceGetTotalEccErrors"] > before


async def test_a_gpu_stale_between_slow_reads_is_read_afresh_when_it_answers(tmp_path: Path) -> None:
    # a hang shorter than the slow interval: stale at 11, answering again from 14, next slow read at 19
    short = (FIXTURES / "failures.yaml").read_text().replace("from: 10, until: 40", "from: 10, until: 14")
    scenario = tmp_path / "short-hang.yaml"
    scenario.write_text(short)
    async with simulated_exporter(scenario, start_seconds=9.0, settings=TIERED) as h:
        await h.tick(0)  # t = 9: a slow-tier read of both GPUs
        assert of_gpu(h.text(), "gpu_power_limit_watts", GPU1)
        await h.tick(2.0)  # t = 11: GPU 1 hangs; its last reading is forgotten
        assert not of_gpu(h.text(), "gpu_power_limit_watts", GPU1)
        limit_reads = h.sim.calls["nvmlDeviceGetEnforcedPowerLimit"]
        h.clock.advance(4.0)  # t = 15: the hang ended at 14
        await h.returned(1)
        await h.tick(0)
        assert of_gpu(h.text(), "gpu_power_limit_watts", GPU1)
        # read afresh, not the reading from before the hang, although the slow tier is due only at 19
        assert h.sim.calls["nvmlDeviceGetEnforcedPowerLimit"] == limit_reads + 1
