"""PCIe and NVLink throughput per GPU: GPM on Hopper, NVML's PCIe sample and NVLink counters before it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml as N
import pytest

from alerts.rules.training import NVLINK_THROUGHPUT, PCIE_THROUGHPUT, TRAINING_SERIES
from exporter.collectors.gpus import Outcome
from exporter.nvml import Device, _counter_rates, _placeholder, read_interconnect
from gpupulse.metrics import gpu as c
from gpupulse.metrics.catalog import ALL_SPECS
from tests.exporter.harness import Harness, simulated_exporter

GIB = 2**30
H100_UUID = "GPU-00000000-0000-4000-8000-0000000c0000"
A100_UUID = "GPU-00000000-0000-4000-8000-0000000c0001"


def _scenario(tmp_path: Path, gpus: list[dict[str, Any]], **extra: Any) -> Path:
    path = tmp_path / "interconnect.yaml"
    path.write_text(json.dumps({"name": "interconnect", "node": "n", "gpus": gpus, **extra}))
    return path


def _series(h: Harness, name: str) -> dict[tuple[str, str], float]:
    """(uuid, direction) -> value of one throughput family in the latest snapshot."""
    assert h.sampler.snapshot is not None
    out: dict[tuple[str, str], float] = {}
    for fam in h.sampler.snapshot.families:
        if fam.name == name:
            for s in fam.samples:
                out[(s.labels["uuid"], s.labels["direction"])] = s.value
    return out


H100 = {
    "model": "H100-SXM5-80GB",
    "uuid": H100_UUID,
    "pcie_tx_bytes_per_second": "1GiB",
    "pcie_rx_bytes_per_second": "2GiB",
    "nvlink_tx_bytes_per_second": [[0, 0], [10, "200GiB"]],  # an all-reduce ramping up
    "nvlink_rx_bytes_per_second": "100GiB",
    "nvlink": {"links": 18, "switch": True},
}
A100 = {
    "model": "A100-SXM4-80GB",
    "uuid": A100_UUID,
    "pcie_tx_bytes_per_second": "3GiB",
    "pcie_rx_bytes_per_second": "4GiB",
    "nvlink_tx_bytes_per_second": [[0, 0], [10, "100GiB"]],
    "nvlink_rx_bytes_per_second": "50GiB",
    "nvlink": {"links": 12, "switch": True},
}


async def test_gpm_rates_are_bytes_per_second_over_the_tick_and_absent_on_the_first_sample(
    tmp_path: Path,
) -> None:
    async with simulated_exporter(_scenario(tmp_path, [H100]), collectors=["gpm"]) as h:
        await h.tick(0)
        assert _series(h, PCIE_THROUGHPUT) == {} and _series(h, NVLINK_THROUGHPUT) == {}  # baseline only
        await h.tick(2.0)  # GPM over [0, 2]: the ramp averages 20 GiB/s
        assert _series(h, PCIE_THROUGHPUT) == {
            (H100_UUID, "tx"): pytest.approx(1 * GIB),
            (H100_UUID, "rx"): pytest.approx(2 * GIB),
        }
        assert _series(h, NVLINK_THROUGHPUT) == {
            (H100_UUID, "tx"): pytest.approx(20 * GIB),
            (H100_UUID, "rx"): pytest.approx(100 * GIB),
        }


async def test_without_gpm_both_come_from_the_counters_as_a_rate_from_the_second_read(tmp_path: Path) -> None:
    async with simulated_exporter(_scenario(tmp_path, [A100]), collectors=["gpm"]) as h:
        await h.tick(0)
        assert _series(h, PCIE_THROUGHPUT) == {} and _series(h, NVLINK_THROUGHPUT) == {}  # baseline only
        await h.tick(4.0)  # counters over [0, 4]: the ramp averages 20 GiB/s
        assert _series(h, PCIE_THROUGHPUT) == {
            (A100_UUID, "tx"): pytest.approx(3 * GIB, rel=1e-6),
            (A100_UUID, "rx"): pytest.approx(4 * GIB, rel=1e-6),
        }
        assert _series(h, NVLINK_THROUGHPUT) == {
            (A100_UUID, "tx"): pytest.approx(20 * GIB, rel=1e-6),
            (A100_UUID, "rx"): pytest.approx(50 * GIB, rel=1e-6),
        }


async def test_a_driver_without_pcie_counters_uses_the_20_ms_pcie_sample(tmp_path: Path) -> None:
    # the PCIe byte counters came with driver 555; before it, nvmlDeviceGetPcieThroughput is a rate
    path = _scenario(tmp_path, [A100], driver_version="535.183.01")
    async with simulated_exporter(path, collectors=["gpm"]) as h:
        await h.tick(0)
        assert _series(h, PCIE_THROUGHPUT) == {
            (A100_UUID, "tx"): pytest.approx(3 * GIB, rel=1e-5),
            (A100_UUID, "rx"): pytest.approx(4 * GIB, rel=1e-5),
        }
        assert _series(h, NVLINK_THROUGHPUT) == {}
        await h.tick(4.0)
        assert _series(h, NVLINK_THROUGHPUT)[(A100_UUID, "rx")] == pytest.approx(50 * GIB, rel=1e-6)
        assert h.sim.calls["nvmlDeviceGetPcieThroughput"] == 4


async def test_not_supported_gives_no_series_rather_than_zero(tmp_path: Path) -> None:
    no_pcie = {**A100, "not_supported": ["nvmlDeviceGetPcieThroughput"]}
    no_nvlink = {"model": "H100-SXM5-80GB", "uuid": H100_UUID}  # a PCIe card: GPM has no NVLink rate
    path = _scenario(tmp_path, [no_nvlink, no_pcie], driver_version="535.183.01")
    async with simulated_exporter(path, collectors=["gpm"]) as h:
        for _ in range(3):
            await h.tick(1.0)
        assert set(_series(h, PCIE_THROUGHPUT)) == {(H100_UUID, "tx"), (H100_UUID, "rx")}
        assert set(_series(h, NVLINK_THROUGHPUT)) == {(A100_UUID, "tx"), (A100_UUID, "rx")}


async def test_a_hung_collective_reads_zero_traffic_not_no_traffic(tmp_path: Path) -> None:
    # the scenario's hang: kernels resident, nothing moves on PCIe or NVLink
    quiet = {"pcie_tx_bytes_per_second": 0, "pcie_rx_bytes_per_second": 0}
    quiet |= {"nvlink_tx_bytes_per_second": 0, "nvlink_rx_bytes_per_second": 0, "utilization": 1.0}
    gpus = [{**H100, **quiet}, {**A100, **quiet}]
    async with simulated_exporter(_scenario(tmp_path, gpus), collectors=["gpm"]) as h:
        await h.tick(0)
        await h.tick(1.0)
        for name in (PCIE_THROUGHPUT, NVLINK_THROUGHPUT):
            values = _series(h, name)
            assert len(values) == 4 and set(values.values()) == {0.0}


async def test_a_counter_that_went_down_gives_no_rate_then_recovers(tmp_path: Path) -> None:
    async with simulated_exporter(_scenario(tmp_path, [A100]), collectors=["gpm"]) as h:
        await h.tick(0)
        await h.tick(1.0)
        assert len(_series(h, NVLINK_THROUGHPUT)) == 2
        counters = h.fleet.slots[0].device.counters
        for group in ("pcie", "nvlink"):
            stamp, tx, rx = counters[group]
            assert tx is not None and rx is not None
            # as after a GPU reset or driver reload: the baseline is above what the counters read now
            counters[group] = (stamp, tx + 2**40, rx + 2**40)
        await h.tick(1.0)
        assert _series(h, NVLINK_THROUGHPUT) == {} and _series(h, PCIE_THROUGHPUT) == {}  # never negative
        await h.tick(1.0)
        assert _series(h, NVLINK_THROUGHPUT)[(A100_UUID, "rx")] == pytest.approx(50 * GIB, rel=1e-6)
        assert _series(h, PCIE_THROUGHPUT)[(A100_UUID, "rx")] == pytest.approx(4 * GIB, rel=1e-6)


async def test_series_of_a_lost_gpu_are_removed(tmp_path: Path) -> None:
    gpus = [{**H100, "lost_at": 3}, {**A100, "lost_at": 3}]
    async with simulated_exporter(_scenario(tmp_path, gpus), collectors=["gpm"]) as h:
        await h.tick(0)
        await h.tick(1.0)
        assert len(_series(h, PCIE_THROUGHPUT)) == 4 and len(_series(h, NVLINK_THROUGHPUT)) == 4
        await h.tick(3.0)
        assert all(s.lost for s in h.fleet.slots)
        assert _series(h, PCIE_THROUGHPUT) == {} and _series(h, NVLINK_THROUGHPUT) == {}


async def test_a_hung_throughput_call_does_not_stall_the_sample_or_hide_another_gpu(tmp_path: Path) -> None:
    faults = [{"gpu": 1, "call": "nvmlDeviceGetFieldValues", "kind": "hang", "from": 2, "until": 100}]
    async with simulated_exporter(_scenario(tmp_path, [H100, A100], faults=faults), collectors=["gpm"]) as h:
        await h.tick(0)
        await h.tick(1.0)
        assert len(_series(h, PCIE_THROUGHPUT)) == 4
        # the call hangs until scenario time passes 100, which the manual clock never reaches: the tick
        # returns only because the GPU's deadline (0.3 s in the harness) gives up on it
        await h.tick(1.0)
        assert h.fleet.slots[1].stale
        assert set(_series(h, PCIE_THROUGHPUT)) == {(H100_UUID, "tx"), (H100_UUID, "rx")}
        assert await h.fleet.run(h.fleet.slots[1], lambda d: None) == Outcome.STALE


def test_the_training_rules_read_the_families_the_catalog_declares() -> None:
    catalog = {spec.name: spec for spec in ALL_SPECS}
    for spec in (c.GPU_PCIE_THROUGHPUT, c.GPU_NVLINK_THROUGHPUT):
        assert spec.name in TRAINING_SERIES and catalog[spec.name] is spec
        # the rules join on uuid and sum the directions away; the labels are those of every gpu_* family
        assert spec.labels == ("uuid", "gpu", "direction") and spec.unit == "bytes_per_second"


def _field(value: int, timestamp_us: int) -> Any:
    # the shape of pynvml's c_nvmlFieldValue_t as _counter_rates reads it (unsigned long long)
    return SimpleNamespace(
        nvmlReturn=N.NVML_SUCCESS,
        valueType=N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        value=SimpleNamespace(ullVal=value),
        timestamp=timestamp_us,
    )


def test_a_counter_reading_the_driver_did_not_timestamp_is_timed_by_our_clock() -> None:
    dev = Device(static=_placeholder(0), handle=None)
    assert _counter_rates(dev, "nvlink", _field(0, 0), _field(0, 0), now_us=1_000_000) == (None, None)
    tx, rx = _counter_rates(dev, "nvlink", _field(1024, 0), _field(2048, 0), now_us=3_000_000)
    assert (tx, rx) == (512 * 1024.0, 1024 * 1024.0)  # KiB over 2 s


def test_a_repeated_cached_reading_keeps_the_older_baseline() -> None:
    dev = Device(static=_placeholder(0), handle=None)
    _counter_rates(dev, "pcie", _field(0, 1_000_000), _field(0, 1_000_000), now_us=0)
    assert _counter_rates(dev, "pcie", _field(0, 1_000_000), _field(0, 1_000_000), now_us=0) == (None, None)
    assert _counter_rates(dev, "pcie", _field(100, 2_000_000), _field(50, 2_000_000), now_us=0) == (
        100.0,
        50.0,
    )


def test_a_kept_field_array_never_passes_an_old_timestamp_as_new() -> None:
    # read_interconnect reuses its field-value array between ticks; a driver that stamps the first read
    # and not the next must get our clock for the second, not a rate against its own old stamp
    dev = Device(static=_placeholder(0), handle=None)
    dev.absent.add("counters:pcie")  # NVLink counters only
    dev.absent.update({"pcietx", "pcierx"})
    reads = iter([(1024, 5_000_000), (3072, 0), (3072, 0)])

    def field_values(handle: Any, count: Any, ref: Any) -> int:
        value, stamp = next(reads)
        for entry in ref._obj[: count.value]:
            entry.nvmlReturn, entry.valueType = N.NVML_SUCCESS, N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.value.ullVal = value
            if stamp:
                entry.timestamp = stamp
        return N.NVML_SUCCESS

    dev.functions["nvmlDeviceGetFieldValues"] = field_values
    now = iter([4.0, 7.0, 9.0])
    assert read_interconnect(dev, lambda: next(now)).nvlink_tx is None  # the baseline, stamped 5 s
    second = read_interconnect(dev, lambda: next(now))  # unstamped: timed at our 7 s
    assert second.nvlink_tx == (3072 - 1024) * 1024.0 / 2.0
    assert read_interconnect(dev, lambda: next(now)).nvlink_tx == 0.0  # and again at 9 s: no traffic
