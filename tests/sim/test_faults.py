"""Faults: lost GPUs, NOT_SUPPORTED calls, hangs that only uninstall or the clock release."""

from __future__ import annotations

import threading
from typing import Any

import pynvml as N
import pytest

from exporter.sim import ManualClock
from tests.sim.helpers import Installer, handles

JOIN_SECONDS = 5.0


def test_lost_gpu_raises_gpu_is_lost_only_on_that_gpu(sim: Installer, clock: ManualClock) -> None:
    sim("faults")
    hs = handles()
    assert N.nvmlDeviceGetPowerUsage(hs[1]) > 0  # fine before t=20
    clock.set(20)
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetPowerUsage(hs[1])
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetUUID(hs[1])
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetHandleByIndex(1)
    assert N.nvmlDeviceGetCount() == 4
    for i in (0, 3):
        assert N.nvmlDeviceGetUtilizationRates(hs[i]).gpu > 0


def test_not_supported_calls(sim: Installer) -> None:
    sim("faults")
    h3 = handles()[3]
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetTotalEnergyConsumption(h3)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetMarginTemperature(h3)
    assert N.nvmlDeviceGetPowerUsage(h3) > 0
    assert N.nvmlDeviceGetTotalEnergyConsumption(handles()[0]) >= 0


def _start(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = target()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_hang_blocks_only_its_call_and_uninstall_releases_it(sim: Installer, clock: ManualClock) -> None:
    nv = sim("faults")
    h2 = handles()[2]
    clock.set(10)
    thread, result = _start(lambda: N.nvmlDeviceGetPowerUsage(h2))
    thread.join(0.3)
    assert thread.is_alive()  # still blocked after a bounded wait
    # other calls on the same GPU still answer while the power read hangs
    assert N.nvmlDeviceGetUtilizationRates(h2).gpu == 70
    nv.uninstall()
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive()
    assert isinstance(result.get("error"), N.NVMLError)


def test_hang_ends_when_the_clock_passes_until(sim: Installer, clock: ManualClock) -> None:
    sim("faults")
    h2 = handles()[2]
    clock.set(39)
    thread, result = _start(lambda: N.nvmlDeviceGetPowerUsage(h2))
    thread.join(0.2)
    assert thread.is_alive()
    clock.set(40)
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive()
    assert result == {"value": round(N.nvmlDeviceGetPowerUsage(h2))}


def test_error_fault_window(sim: Installer, clock: ManualClock) -> None:
    sim(
        {
            "gpus": [{"model": "H100"}],
            "faults": [
                {"gpu": 0, "call": "*", "kind": "error", "error": "UNKNOWN", "from": 5, "until": 10},
            ],
        }
    )
    (h,) = handles()
    N.nvmlDeviceGetPowerUsage(h)
    clock.set(5)
    with pytest.raises(N.NVMLError_Unknown):
        N.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(N.NVMLError_Unknown):
        N.nvmlDeviceGetMemoryInfo(h)
    clock.set(10)
    assert N.nvmlDeviceGetPowerUsage(h) >= 0


def test_slow_fault_adds_latency_and_uninstall_cuts_it_short(sim: Installer) -> None:
    nv = sim(
        {
            "gpus": [{"model": "H100"}],
            "faults": [{"gpu": 0, "call": "nvmlDeviceGetPowerUsage", "kind": "slow", "seconds": 60}],
        }
    )
    (h,) = handles()
    thread, result = _start(lambda: N.nvmlDeviceGetPowerUsage(h))
    thread.join(0.2)
    assert thread.is_alive()
    nv.uninstall()
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive()
    assert "error" in result
