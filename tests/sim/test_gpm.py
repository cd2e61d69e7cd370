"""GPM: rolling sample pairs averaged from the curves, the 100 ms rule, Hopper-only support."""

from __future__ import annotations

import math

import pynvml as N
import pytest

from exporter.sim import ManualClock
from tests.sim.helpers import Installer, handles

IDS = [N.NVML_GPM_METRIC_SM_UTIL, N.NVML_GPM_METRIC_SM_OCCUPANCY, N.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
       N.NVML_GPM_METRIC_DRAM_BW_UTIL, N.NVML_GPM_METRIC_FP64_UTIL]  # fmt: skip


def metrics(s1: object, s2: object) -> dict[int, float | None]:
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(IDS)
    mg.sample1, mg.sample2 = s1, s2
    for i, mid in enumerate(IDS):
        mg.metrics[i].metricId = mid
    N.nvmlGpmMetricsGet(mg)
    return {
        mid: (mg.metrics[i].value if mg.metrics[i].nvmlReturn == N.NVML_SUCCESS else None)
        for i, mid in enumerate(IDS)
    }


SCENARIO = {
    "gpus": [
        {
            "model": "H100",
            "sm_active": [[0, 0.0], [10, 1.0]],
            "sm_occupancy": 0.25,
            "tensor_active": [[0, 0.2], [10, 0.2], [10, 0.6]],
            "dram_active": 0.5,
        },
        {"model": "A100", "sm_active": 0.5},
    ]
}


def test_rolling_pair_averages_the_interval(sim: Installer, clock: ManualClock) -> None:
    sim(SCENARIO)
    h = handles()[0]
    assert N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    prev, cur = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, prev)
    clock.set(10)
    N.nvmlGpmSampleGet(h, cur)
    m = metrics(prev, cur)
    assert m[N.NVML_GPM_METRIC_SM_UTIL] == pytest.approx(50.0)  # ramp 0 -> 100 % averages 50 %
    assert m[N.NVML_GPM_METRIC_SM_OCCUPANCY] == pytest.approx(25.0)
    assert m[N.NVML_GPM_METRIC_DRAM_BW_UTIL] == pytest.approx(50.0)
    assert m[N.NVML_GPM_METRIC_FP64_UTIL] is None  # not simulated -> per-metric NOT_SUPPORTED
    prev, cur = cur, prev  # rotate, as the exporter does
    clock.set(20)
    N.nvmlGpmSampleGet(h, cur)
    m = metrics(prev, cur)
    assert m[N.NVML_GPM_METRIC_SM_UTIL] == pytest.approx(100.0)
    assert m[N.NVML_GPM_METRIC_ANY_TENSOR_UTIL] == pytest.approx(60.0)
    assert all(v is None or math.isfinite(v) for v in m.values())
    N.nvmlGpmSampleFree(prev)
    N.nvmlGpmSampleFree(cur)


def test_samples_closer_than_100ms_fail_per_metric(sim: Installer, clock: ManualClock) -> None:
    sim(SCENARIO)
    h = handles()[0]
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, s1)
    clock.advance(0.099)
    N.nvmlGpmSampleGet(h, s2)
    assert set(metrics(s1, s2).values()) == {None}  # the call succeeds, every metric is invalid
    clock.advance(0.002)
    N.nvmlGpmSampleGet(h, s2)
    assert metrics(s1, s2)[N.NVML_GPM_METRIC_SM_UTIL] is not None


def test_metrics_from_an_unfilled_sample_fail(sim: Installer) -> None:
    sim(SCENARIO)
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(handles()[0], s1)
    with pytest.raises(N.NVMLError_InvalidArgument):
        metrics(s1, s2)


def test_gpm_unsupported_before_hopper(sim: Installer) -> None:
    sim(SCENARIO)
    a100 = handles()[1]
    assert N.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpmSampleGet(a100, N.nvmlGpmSampleAlloc())


def test_gpm_per_mig_instance(sim: Installer, clock: ManualClock) -> None:
    sim("mig")
    a100, h100 = handles()
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmMigSampleGet(h100, 5, s1)  # GPU instance 5 runs at 45 % SM activity
    clock.set(30)
    N.nvmlGpmMigSampleGet(h100, 5, s2)
    assert metrics(s1, s2)[N.NVML_GPM_METRIC_SM_UTIL] == pytest.approx(45.0)
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(h100, 3)
    N.nvmlGpmSampleGet(mig, s1)
    clock.set(60)
    N.nvmlGpmSampleGet(mig, s2)
    assert metrics(s1, s2)[N.NVML_GPM_METRIC_SM_UTIL] == pytest.approx(90.0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpmMigSampleGet(a100, 2, s1)


def test_traffic_rates_match_the_cumulative_counters(sim: Installer, clock: ManualClock) -> None:
    sim(
        {
            "gpus": [
                {
                    "model": "H100",
                    "pcie_tx_bytes_per_second": "1GiB",
                    "nvlink_rx_bytes_per_second": [[0, 0], [10, "20GiB"]],
                    "nvlink": {"links": 4, "switch": True, "down_links": [3]},
                }
            ]
        }
    )
    (h,) = handles()
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, s1)
    clock.set(10)
    N.nvmlGpmSampleGet(h, s2)
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = N.NVML_GPM_METRICS_GET_VERSION, 2, s1, s2
    mg.metrics[0].metricId = N.NVML_GPM_METRIC_PCIE_TX_PER_SEC
    mg.metrics[1].metricId = N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    N.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].value == pytest.approx(1024.0)  # MiB/s
    assert mg.metrics[1].value == pytest.approx(10 * 1024.0)  # ramp 0 -> 20 GiB/s averages 10
    pcie, total, link0, link3 = N.nvmlDeviceGetFieldValues(
        h,
        [
            N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 3),
        ],
    )
    assert pcie.value.ullVal == 10 * 2**30
    assert total.value.ullVal == 100 * 2**20  # 100 GiB in KiB
    assert link0.value.ullVal == total.value.ullVal // 3  # spread over the three links that are up
    assert link3.value.ullVal == 0


def test_pcie_throughput_is_kb_per_second_over_the_last_20_ms(sim: Installer, clock: ManualClock) -> None:
    # nvml.h: nvmlDeviceGetPcieThroughput samples a byte counter over 20 ms, in KB/s (1 KB granularity)
    sim(
        {
            "gpus": [
                {
                    "model": "A100",
                    "pcie_tx_bytes_per_second": [[0, 0], [10, "10GiB"]],
                    "pcie_rx_bytes_per_second": "1MiB",
                }
            ]
        }
    )
    (h,) = handles()
    clock.set(5)
    assert N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES) == int(
        (5 - 0.01) * 2**20
    )  # the ramp at 4.99 s, in KiB/s
    assert N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES) == 1024
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_COUNT)


def test_a_driver_before_555_has_no_pcie_byte_counters(sim: Installer) -> None:
    sim(
        {"driver_version": "535.183.01", "gpus": [{"model": "A100", "nvlink": {"links": 12, "switch": True}}]}
    )
    (h,) = handles()
    pcie, nvlink = N.nvmlDeviceGetFieldValues(
        h, [N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)]
    )
    assert pcie.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED
    assert nvlink.nvmlReturn == N.NVML_SUCCESS
