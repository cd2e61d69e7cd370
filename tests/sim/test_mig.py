"""MIG: enumeration, per-instance memory and processes, what a MIG handle refuses."""

from __future__ import annotations

import pynvml as N
import pytest

from tests.sim.helpers import Installer, handles


def test_mig_enumeration(sim: Installer) -> None:
    sim("mig")
    a100, h100 = handles()
    assert N.nvmlDeviceGetMigMode(a100) == [N.NVML_DEVICE_MIG_ENABLE, N.NVML_DEVICE_MIG_ENABLE]
    count = N.nvmlDeviceGetMaxMigDeviceCount(h100)
    assert count == 7
    migs = []
    for i in range(count):
        try:
            migs.append(N.nvmlDeviceGetMigDeviceHandleByIndex(h100, i))
        except N.NVMLError_NotFound:
            continue
    assert len(migs) == 4
    ids = [(N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m)) for m in migs]
    assert ids == [(1, 0), (5, 0), (13, 0), (14, 0)]
    m = migs[0]
    assert N.nvmlDeviceIsMigDeviceHandle(m)
    assert not N.nvmlDeviceIsMigDeviceHandle(h100)
    assert N.nvmlDeviceGetUUID(m).startswith("MIG-")
    assert N.nvmlDeviceGetName(m) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
    assert N.nvmlDeviceGetUUID(parent) == N.nvmlDeviceGetUUID(h100)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetGpuInstanceId(h100)
    attrs = N.nvmlDeviceGetAttributes(m)
    assert (attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (3, 40448)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetAttributes(h100)


def test_mig_memory_and_processes(sim: Installer) -> None:
    sim("mig")
    _, h100 = handles()
    m0 = N.nvmlDeviceGetMigDeviceHandleByIndex(h100, 0)
    m3 = N.nvmlDeviceGetMigDeviceHandleByIndex(h100, 3)
    mem = N.nvmlDeviceGetMemoryInfo(m0, version=N.nvmlMemory_v2)
    assert mem.used == 20 * 2**30 and mem.total == mem.free + mem.used + mem.reserved
    assert N.nvmlDeviceGetMemoryInfo(m3, version=N.nvmlMemory_v2).used == 9 * 2**30
    procs = N.nvmlDeviceGetComputeRunningProcesses(m0)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [(6003, 1, 0)]
    # the parent handle aggregates every instance
    assert {p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h100)} == {6003, 6004}
    parent_used = N.nvmlDeviceGetMemoryInfo(h100, version=N.nvmlMemory_v2).used
    assert parent_used == (20 + 8 + 0 + 9) * 2**30


def test_mig_mode_hides_utilization(sim: Installer) -> None:
    sim("mig")
    a100, _ = handles()
    m = N.nvmlDeviceGetMigDeviceHandleByIndex(a100, 0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetUtilizationRates(a100)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetProcessUtilization(a100, 0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetPowerUsage(m)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetRemappedRows(a100)
    assert N.nvmlDeviceGetPowerUsage(a100) == 250_000
