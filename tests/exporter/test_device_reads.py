"""read_device calls the C functions with outputs kept between ticks: it must read what pynvml's own
wrappers read, fall back on old drivers, and never serve a previous tick's value from a kept output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml as N
import yaml

from exporter.nvml import DeviceReading, Nvml, read_device
from exporter.sim import ManualClock, install, load_scenario
from tests.exporter.harness import simulated_exporter

UUID = "GPU-00000000-0000-4000-8000-000000000000"


def _scenario(tmp_path: Path, **gpu: Any) -> Path:
    data = {
        "name": "device-reads",
        "duration_seconds": 120,
        "driver_version": "570.133.20",
        "gpus": [
            {
                "model": "H100",
                "uuid": UUID,
                "utilization": [[0, 0.1], [100, 0.9]],
                "temperature_celsius": [[0, 40], [100, 80]],
                **gpu,
            }
        ],
        "processes": [{"pid": 100, "gpu": 0, "memory_bytes": "1GiB", "sm_utilization": 0.5}],
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _wrappers(handle: Any) -> tuple[DeviceReading, tuple[int, int, int, int]]:
    """The same fields read through pynvml's wrappers, each output freshly allocated."""
    util = N.nvmlDeviceGetUtilizationRates(handle)
    mem = N.nvmlDeviceGetMemoryInfo(handle, N.nvmlMemory_v2)
    field = N.nvmlDeviceGetFieldValues(handle, [N.NVML_FI_DEV_MEMORY_TEMP])[0]
    return DeviceReading(
        memory=None,
        utilization_ratio=util.gpu / 100.0,
        memory_utilization_ratio=util.memory / 100.0,
        temperature_celsius=float(N.nvmlDeviceGetTemperatureV(handle, N.NVML_TEMPERATURE_GPU)),
        memory_temperature_celsius=float(field.value.uiVal) if field.nvmlReturn == 0 else None,
        thermal_margin_celsius=float(N.nvmlDeviceGetMarginTemperature(handle)),
        power_watts=N.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        energy_joules=N.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0,
        sm_clock_hertz=N.nvmlDeviceGetClockInfo(handle, N.NVML_CLOCK_SM) * 1e6,
        memory_clock_hertz=N.nvmlDeviceGetClockInfo(handle, N.NVML_CLOCK_MEM) * 1e6,
        clock_event_reasons=N.nvmlDeviceGetCurrentClocksEventReasons(handle),
        performance_state=N.nvmlDeviceGetPerformanceState(handle),
        fan_speed_ratio=None,  # the H100 SXM has no fan
    ), (mem.total, mem.used, mem.free, mem.reserved)


def test_read_device_reads_what_the_pynvml_wrappers_read_tick_after_tick(tmp_path: Path) -> None:
    clock = ManualClock(1.0)
    with install(load_scenario(str(_scenario(tmp_path))), clock):
        nvml = Nvml()
        nvml.init()
        try:
            (dev,) = nvml.discover()
            seen = set()
            for _ in range(5):  # the kept outputs are rewritten every tick, the values move
                clock.advance(10.0)
                ours = read_device(dev)
                theirs, memory = _wrappers(dev.handle)
                assert ours.memory is not None
                assert (ours.memory.total_bytes, ours.memory.used_bytes) == memory[:2]
                assert (ours.memory.free_bytes, ours.memory.reserved_bytes) == memory[2:]
                assert ours._replace(memory=None) == theirs
                seen.add(ours.temperature_celsius)
            assert len(seen) == 5
        finally:
            nvml.shutdown()


def test_driver_without_the_v2_calls_falls_back_to_the_old_ones(tmp_path: Path) -> None:
    old = ["nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2"]
    clock = ManualClock(1.0)
    with install(load_scenario(str(_scenario(tmp_path, not_supported=old))), clock) as sim:
        nvml = Nvml()
        nvml.init()
        try:
            (dev,) = nvml.discover()
            for _ in range(3):
                clock.advance(1.0)
                reading = read_device(dev)
                assert reading.temperature_celsius == float(N.nvmlDeviceGetTemperature(dev.handle, 0))
                v1 = N.nvmlDeviceGetMemoryInfo(dev.handle)
                assert reading.memory is not None
                assert (reading.memory.used_bytes, reading.memory.reserved_bytes) == (v1.used, None)
            # each missing call was asked once, then remembered as absent
            assert sim.calls["nvmlDeviceGetTemperatureV"] == 1
            assert sim.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
        finally:
            nvml.shutdown()


async def test_a_call_failing_this_tick_serves_no_value_not_the_last_one(tmp_path: Path) -> None:
    faults = [{"gpu": 0, "call": "nvmlDeviceGetPowerUsage", "kind": "error", "error": "TIMEOUT"}]
    faults[0].update({"from": 5, "until": 7})
    path = _scenario(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["faults"] = faults
    path.write_text(yaml.safe_dump(data))
    async with simulated_exporter(path, start_seconds=3.0) as h:
        await h.tick(0)
        assert "gpu_power_watts{" in h.text()
        await h.tick(3.0)  # t = 6: the power call answers TIMEOUT this tick
        text = h.text()
        assert "gpu_power_watts{" not in text
        assert 'gpu_up{gpu="0",uuid="' + UUID + '"} 1.0' in text  # the rest of the GPU still reads
        await h.tick(2.0)  # t = 8: it answers again (a transient error is not remembered as absent)
        assert "gpu_power_watts{" in h.text()
