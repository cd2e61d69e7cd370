"""Device readings through pynvml's public wrappers follow the scenario on a ManualClock."""

from __future__ import annotations

import concurrent.futures

import pynvml as N
import pytest

from exporter.sim import ManualClock
from tests.sim.helpers import Installer, handles

CURVES = {
    "gpus": [
        {
            "model": "H100",
            "utilization": [[0, 0.0], [100, 1.0]],
            "temperature_celsius": [[0, 40], [100, 80]],
            "power_watts": [[0, 100], [100, 500]],
            "sm_clock_hertz": [[0, 1.98e9], [100, 9.9e8]],
            "pcie_link_generation": [[0, 5], [50, 5], [50, 3]],
            "clock_event_reasons": [
                {"from": 20, "until": 60, "reasons": ["sw_thermal_slowdown", "hw_slowdown"]}
            ],
        }
    ]
}


def test_values_follow_curves(sim: Installer, clock: ManualClock) -> None:
    sim(CURVES)
    (h,) = handles()
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU) == 40
    clock.set(50)
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 50
    assert N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU) == 60
    assert N.nvmlDeviceGetPowerUsage(h) == 300_000
    assert N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM) == 1485
    assert N.nvmlDeviceGetCurrPcieLinkGeneration(h) == 3
    assert N.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
    clock.set(1000)  # held after the last point
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 100
    assert N.nvmlDeviceGetMarginTemperature(h) == 90 - 80


def test_clock_event_reasons_follow_windows(sim: Installer, clock: ManualClock) -> None:
    sim(CURVES)
    (h,) = handles()
    assert N.nvmlDeviceGetCurrentClocksEventReasons(h) == N.nvmlClocksEventReasonGpuIdle  # utilization 0
    clock.set(30)
    assert N.nvmlDeviceGetCurrentClocksEventReasons(h) == (
        N.nvmlClocksEventReasonSwThermalSlowdown | N.nvmlClocksEventReasonHwSlowdown
    )
    clock.set(60)
    assert N.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    (fv,) = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN])
    assert fv.nvmlReturn == N.NVML_SUCCESS and fv.value.ullVal == 40 * 10**9


def test_static_identity(sim: Installer) -> None:
    sim("basic")
    h0, h1 = handles()
    assert N.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    assert N.nvmlDeviceGetUUID(h1) == "GPU-6a1f0c2e-3b7d-4e55-9c1a-000000000001"
    assert N.nvmlDeviceGetPciInfo(h1).busId == "00000000:2A:00.0"
    assert N.nvmlDeviceGetIndex(h1) == 1
    assert N.nvmlDeviceGetArchitecture(h0) == N.NVML_DEVICE_ARCH_HOPPER
    assert N.nvmlDeviceGetCudaComputeCapability(h0) == (9, 0)
    assert N.nvmlDeviceGetEnforcedPowerLimit(h0) == 700_000
    assert N.nvmlDeviceGetTemperatureThreshold(h0, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 90
    assert N.nvmlSystemGetDriverVersion() == "570.133.20"
    assert N.nvmlSystemGetCudaDriverVersion_v2() == 12080
    h = N.nvmlDeviceGetHandleByUUID(b"GPU-6a1f0c2e-3b7d-4e55-9c1a-000000000001")
    assert N.nvmlDeviceGetIndex(h) == 1


def test_memory_v2_invariant_and_v1_lumps_reserved(sim: Installer, clock: ManualClock) -> None:
    sim("leak")
    (h,) = handles()
    for t in (0, 60, 150, 299, 300, 600):
        clock.set(t)
        m = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
        assert m.total == m.reserved + m.free + m.used
        assert m.reserved > 0 and m.free >= 0
        v1 = N.nvmlDeviceGetMemoryInfo(h)
        assert v1.used == m.used + m.reserved and v1.free == m.free
    # the leak grew: 78 GiB + 512 MiB sidecar
    assert m.used == 78 * 2**30 + 512 * 2**20


def test_two_pass_process_queries(sim: Installer, clock: ManualClock) -> None:
    nv = sim("basic")
    _, h1 = handles()
    procs = N.nvmlDeviceGetComputeRunningProcesses(h1)
    assert [p.pid for p in procs] == [4202]  # pid 4203 starts at t=30
    assert nv.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # size query, then fill
    clock.set(90)
    procs = N.nvmlDeviceGetComputeRunningProcesses(h1)
    assert {p.pid: p.usedGpuMemory for p in procs} == {4202: 70 * 2**30, 4203: 6 * 2**30}
    assert all(p.gpuInstanceId == 0xFFFFFFFF for p in procs)
    assert N.nvmlDeviceGetGraphicsRunningProcesses(h1) == []
    assert N.nvmlSystemGetProcessName(4203) == "python eval.py"
    used = N.nvmlDeviceGetMemoryInfo(h1, version=N.nvmlMemory_v2).used
    assert used == 76 * 2**30  # derived from the live processes


def test_process_ends_disappear(sim: Installer, clock: ManualClock) -> None:
    sim("mig")
    clock.set(500)  # pid 6005 lives during [60, 400)
    _, h1 = handles()
    assert 6005 not in {p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h1)}


def test_process_utilization_samples(sim: Installer, clock: ManualClock) -> None:
    nv = sim("basic")
    _, h1 = handles()
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetProcessUtilization(h1, nv.epoch_us + 10**9)  # nothing newer than that
    clock.set(60)
    samples = N.nvmlDeviceGetProcessUtilization(h1, 0)
    assert {s.pid: s.smUtil for s in samples} == {4202: 50, 4203: 5}
    newest = max(s.timeStamp for s in samples)
    assert nv.epoch_us + 59_800_000 <= newest <= nv.epoch_us + 60_000_000
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetProcessUtilization(h1, newest)
    clock.advance(1)
    assert N.nvmlDeviceGetProcessUtilization(h1, newest)


def test_energy_is_monotonic_and_integrates_power(sim: Installer, clock: ManualClock) -> None:
    sim(CURVES)
    (h,) = handles()
    last = N.nvmlDeviceGetTotalEnergyConsumption(h)
    for _ in range(20):
        clock.advance(7.5)
        now = N.nvmlDeviceGetTotalEnergyConsumption(h)
        assert now >= last
        last = now
    # 100 -> 500 W over 100 s, then 500 W for 50 s: 30 kJ + 25 kJ
    assert last == pytest.approx(55_000_000, rel=1e-6)


def test_field_values_memory_temperature_and_unknown_fields(sim: Installer) -> None:
    sim("thermal")
    h = handles()[0]
    temp, energy, unknown = N.nvmlDeviceGetFieldValues(
        h,
        [
            N.NVML_FI_DEV_MEMORY_TEMP,
            N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            N.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL,
        ],
    )
    assert (temp.nvmlReturn, temp.valueType, temp.value.uiVal) == (
        N.NVML_SUCCESS,
        N.NVML_VALUE_TYPE_UNSIGNED_INT,
        60,
    )
    assert energy.nvmlReturn == N.NVML_SUCCESS and energy.value.ullVal == 0
    assert unknown.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED


def test_health_counters(sim: Installer, clock: ManualClock) -> None:
    sim("faults")
    h = handles()[0]
    assert N.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    clock.set(16)
    assert N.nvmlDeviceGetTotalEccErrors(h, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC) == 3
    assert N.nvmlDeviceGetTotalEccErrors(h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC) == 1
    assert N.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0)
    assert N.nvmlDeviceGetEccMode(h) == [1, 1]


def test_generation_specific_support(sim: Installer) -> None:
    sim("mixed-fleet")
    a100, h100, _h200, l40s, v100 = handles()
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetRemappedRows(v100)
    assert N.nvmlDeviceGetRetiredPages(v100, 0) == []
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetRetiredPages(a100, 0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetMigMode(l40s)
    assert N.nvmlDeviceGetMigMode(h100) == [0, 0]
    assert N.nvmlDeviceGetArchitecture(v100) == N.NVML_DEVICE_ARCH_VOLTA


def test_unimplemented_symbol_is_function_not_found(sim: Installer) -> None:
    sim("basic")
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetSamples(handles()[0], N.NVML_GPU_UTILIZATION_SAMPLES, 0)


def test_calls_before_init_are_uninitialized(sim: Installer) -> None:
    sim("basic", init=False)
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlDeviceGetCount()
    N.nvmlInit()
    h = handles()[0]
    N.nvmlShutdown()
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlDeviceGetPowerUsage(h)


def test_nvlink_and_topology(sim: Installer) -> None:
    sim(
        {
            "gpus": [
                {
                    "model": "H100",
                    "nvlink": {"links": 2, "peers": [{"link": 0, "peer_gpu_index": 1}], "down_links": [1]},
                },
                {"model": "H100", "nvlink": {"links": 2, "peers": [{"link": 0, "peer_gpu_index": 0}]}},
                {"model": "H100", "nvlink": {"switch": True}},
                {"model": "L40S"},
            ]
        }
    )
    a, b, c, d = handles()
    assert N.nvmlDeviceGetNvLinkState(a, 0) == N.NVML_FEATURE_ENABLED
    assert N.nvmlDeviceGetNvLinkState(a, 1) == N.NVML_FEATURE_DISABLED
    assert N.nvmlDeviceGetNvLinkRemotePciInfo(a, 0).busId == N.nvmlDeviceGetPciInfo(b).busId
    assert N.nvmlDeviceGetNvLinkRemoteDeviceType(c, 3) == N.NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert N.nvmlDeviceGetNvLinkRemotePciInfo(c, 0).busId != N.nvmlDeviceGetPciInfo(a).busId
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetNvLinkState(d, 0)
    assert N.nvmlDeviceGetP2PStatus(a, b, N.NVML_P2P_CAPS_INDEX_NVLINK) == N.NVML_P2P_STATUS_OK
    assert N.nvmlDeviceGetP2PStatus(a, c, N.NVML_P2P_CAPS_INDEX_NVLINK) == N.NVML_P2P_STATUS_NOT_SUPPORTED
    assert N.nvmlDeviceGetTopologyCommonAncestor(a, b) == N.NVML_TOPOLOGY_SINGLE
    assert N.nvmlDeviceGetTopologyCommonAncestor(a, d) == N.NVML_TOPOLOGY_SYSTEM
    (links,) = N.nvmlDeviceGetFieldValues(c, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert links.value.uiVal == 18
    assert N.nvmlDeviceGetNvLinkErrorCounter(c, 0, N.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 0


def test_concurrent_calls_are_all_counted(sim: Installer) -> None:
    nv = sim("large")
    hs = handles()

    def read(i: int) -> int:
        h = hs[i % len(hs)]
        N.nvmlDeviceGetComputeRunningProcesses(h)
        return int(N.nvmlDeviceGetPowerUsage(h))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(read, range(800)))
    assert all(r > 0 for r in results)
    assert nv.calls["nvmlDeviceGetPowerUsage"] == 800
    assert nv.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1600


def test_misc_static_queries(sim: Installer) -> None:
    sim("mixed-fleet")
    a100, *_, v100 = handles()
    assert N.nvmlDeviceGetBrand(v100) == N.NVML_BRAND_TESLA
    assert N.nvmlDeviceGetBrand(a100) == N.NVML_BRAND_NVIDIA
    assert N.nvmlDeviceGetEncoderUtilization(a100) == [0, 167_000]
    with pytest.raises(N.NVMLError_NotSupported):  # the scenario gives the V100 no NVLink wiring
        N.nvmlDeviceGetNvLinkErrorCounter(v100, 0, N.NVML_NVLINK_ERROR_DL_REPLAY)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetFanSpeed(a100)
    bar1 = N.nvmlDeviceGetBAR1MemoryInfo(a100)
    assert bar1.bar1Total == bar1.bar1Free + bar1.bar1Used


def test_overlapping_windows_count_reason_time_once(sim: Installer, clock: ManualClock) -> None:
    sim(
        {
            "gpus": [
                {
                    "model": "H100",
                    "utilization": 1.0,
                    "clock_event_reasons": [
                        {"from": 10, "until": 30, "reasons": ["sw_power_cap"]},
                        {"from": 20, "until": 40, "reasons": ["sw_power_cap", "hw_slowdown"]},
                    ],
                }
            ]
        }
    )
    (h,) = handles()
    clock.set(35)
    assert N.nvmlDeviceGetCurrentClocksEventReasons(h) == (
        N.nvmlClocksEventReasonSwPowerCap | N.nvmlClocksEventReasonHwSlowdown
    )
    clock.set(100)
    (fv,) = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP])
    assert fv.value.ullVal == 30 * 10**9  # [10, 40), not 20 + 20


def test_processes_utilization_info_matches_the_older_api(sim: Installer, clock: ManualClock) -> None:
    sim("basic")
    _, h1 = handles()
    clock.set(60)
    old = {(s.pid, s.smUtil, s.timeStamp) for s in N.nvmlDeviceGetProcessUtilization(h1, 0)}
    new = {(s.pid, s.smUtil, s.timeStamp) for s in N.nvmlDeviceGetProcessesUtilizationInfo(h1, 0)}
    assert new == old and len(new) == 2
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetProcessesUtilizationInfo(h1, max(t for _, _, t in new))
