"""Installing and uninstalling the simulation patches and restores pynvml exactly."""

from __future__ import annotations

import pynvml as N
import pytest

from exporter.errors import SimAlreadyInstalledError
from exporter.sim import ManualClock, implemented_symbols, install, installed, load_scenario
from exporter.sim.library import RESTORED_NAMES, pynvml_private_names_present

REQUIRED_SYMBOLS = """
nvmlInit_v2 nvmlInitWithFlags nvmlShutdown nvmlErrorString nvmlSystemGetDriverVersion
nvmlSystemGetCudaDriverVersion nvmlSystemGetCudaDriverVersion_v2 nvmlSystemGetNVMLVersion
nvmlDeviceGetCount_v2 nvmlDeviceGetHandleByIndex_v2 nvmlDeviceGetHandleByUUID nvmlDeviceGetUUID
nvmlDeviceGetName nvmlDeviceGetIndex nvmlDeviceGetMinorNumber nvmlDeviceGetSerial
nvmlDeviceGetVbiosVersion nvmlDeviceGetPciInfo_v3 nvmlDeviceGetArchitecture
nvmlDeviceGetCudaComputeCapability nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo_v2
nvmlDeviceGetUtilizationRates nvmlDeviceGetTemperature nvmlDeviceGetTemperatureV
nvmlDeviceGetTemperatureThreshold nvmlDeviceGetMarginTemperature nvmlDeviceGetPowerUsage
nvmlDeviceGetEnforcedPowerLimit nvmlDeviceGetPowerManagementLimit
nvmlDeviceGetTotalEnergyConsumption nvmlDeviceGetClockInfo nvmlDeviceGetMaxClockInfo
nvmlDeviceGetCurrentClocksEventReasons nvmlDeviceGetCurrentClocksThrottleReasons
nvmlDeviceGetPerformanceState nvmlDeviceGetCurrPcieLinkGeneration nvmlDeviceGetMaxPcieLinkGeneration
nvmlDeviceGetCurrPcieLinkWidth nvmlDeviceGetMaxPcieLinkWidth nvmlDeviceGetPcieReplayCounter
nvmlDeviceGetEccMode nvmlDeviceGetTotalEccErrors nvmlDeviceGetRemappedRows nvmlDeviceGetRetiredPages
nvmlDeviceGetComputeRunningProcesses_v3 nvmlDeviceGetGraphicsRunningProcesses_v3
nvmlDeviceGetMPSComputeRunningProcesses_v3 nvmlDeviceGetProcessUtilization nvmlDeviceGetFieldValues
nvmlDeviceGetNvLinkState nvmlDeviceGetNvLinkRemotePciInfo_v2 nvmlDeviceGetP2PStatus
nvmlDeviceGetTopologyCommonAncestor nvmlDeviceGetSupportedEventTypes nvmlDeviceRegisterEvents
nvmlEventSetCreate nvmlEventSetWait_v2 nvmlEventSetFree nvmlGpmQueryDeviceSupport nvmlGpmSampleAlloc
nvmlGpmSampleFree nvmlGpmSampleGet nvmlGpmMigSampleGet nvmlGpmMetricsGet nvmlDeviceGetMigMode
nvmlDeviceGetMaxMigDeviceCount nvmlDeviceGetMigDeviceHandleByIndex nvmlDeviceIsMigDeviceHandle
nvmlDeviceGetDeviceHandleFromMigDeviceHandle nvmlDeviceGetGpuInstanceId
nvmlDeviceGetComputeInstanceId
""".split()


def test_pynvml_private_names_the_sim_relies_on_exist() -> None:
    assert all(pynvml_private_names_present().values()), pynvml_private_names_present()
    assert isinstance(N._nvmlGetFunctionPointer_cache, dict)


def test_pynvml_wrappers_use_the_symbol_names_we_implement() -> None:
    # Guards against a pynvml upgrade renaming C symbols (e.g. a new _v4 process list)
    import inspect

    src = inspect.getsource(N)
    for name in REQUIRED_SYMBOLS:
        if name not in ("nvmlInit_v2", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            assert f'"{name}"' in src, name


def test_every_required_symbol_is_implemented() -> None:
    assert set(REQUIRED_SYMBOLS) <= set(implemented_symbols())


def test_install_and_uninstall_restore_pynvml() -> None:
    before = {name: getattr(N, name) for name in RESTORED_NAMES}
    with install(load_scenario("basic"), ManualClock()) as nv:
        assert installed() is nv
        assert N._nvmlGetFunctionPointer is not before["_nvmlGetFunctionPointer"]
        N.nvmlInit()
        assert N.nvmlDeviceGetCount() == 2
        assert N._nvmlGetFunctionPointer_cache == {}  # our lookup bypasses pynvml's cache
    assert installed() is None
    for name, value in before.items():
        assert getattr(N, name) is value  # including the init refcount, though nvmlInit raised it
    assert N._nvmlGetFunctionPointer_cache == {}


def test_only_one_installed_at_a_time() -> None:
    with install(load_scenario("basic"), ManualClock()):
        with pytest.raises(SimAlreadyInstalledError):
            install(load_scenario("basic"), ManualClock())
    with install(load_scenario("basic"), ManualClock()) as again:
        assert installed() is again


def test_uninstall_twice_is_harmless() -> None:
    nv = install(load_scenario("basic"), ManualClock())
    nv.uninstall()
    nv.uninstall()
    assert installed() is None


def test_error_strings_come_from_the_sim() -> None:
    with install(load_scenario("basic"), ManualClock()):
        N.nvmlInit()
        assert N.nvmlErrorString(N.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
        assert str(N.NVMLError(N.NVML_ERROR_NOT_READY))  # an uncached code goes through nvmlErrorString
