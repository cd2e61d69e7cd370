"""Specs of the NVML collectors: device, gpm, health, nvlink, processes and mig (one group each)."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, counter, gauge, info

# --- collector "device" --------------------------------------------------------------------------
GPU_INFO = info(
    "gpu_info",
    "Static facts about a GPU; join on uuid.",
    "device",
    ("uuid", "gpu", "name", "pci_bus_id", "driver_version", "vbios_version", "mig_mode"),
)
GPU_UP = gauge(
    "gpu_up",
    "",
    "1 when the GPU answered its last sample, 0 when it is lost or its call failed or hung.",
    "device",
)
GPU_UTILIZATION = gauge(
    "gpu_utilization_ratio",
    "ratio",
    "Share of the last NVML sample period in which at least one kernel was running (NVML utilization.gpu); "
    "not SM activity, see gpu_sm_active_ratio.",
    "device",
)
GPU_MEMORY_UTILIZATION = gauge(
    "gpu_memory_utilization_ratio",
    "ratio",
    "Share of the last NVML sample period in which device memory was read or written (not capacity).",
    "device",
)
GPU_MEMORY_USED = gauge(
    "gpu_memory_used_bytes", "bytes", "Device memory allocated by processes (NVML memory v2).", "device"
)
GPU_MEMORY_TOTAL = gauge("gpu_memory_total_bytes", "bytes", "Total device memory.", "device")
GPU_MEMORY_RESERVED = gauge(
    "gpu_memory_reserved_bytes",
    "bytes",
    "Device memory reserved by the driver and firmware (NVML memory v2).",
    "device",
)
GPU_MEMORY_FREE = gauge(
    "gpu_memory_free_bytes", "bytes", "Device memory neither used nor reserved.", "device"
)
GPU_TEMPERATURE = gauge("gpu_temperature_celsius", "celsius", "GPU core temperature.", "device")
GPU_MEMORY_TEMPERATURE = gauge(
    "gpu_memory_temperature_celsius", "celsius", "HBM/memory temperature.", "device"
)
GPU_SLOWDOWN_TEMPERATURE = gauge(
    "gpu_slowdown_temperature_celsius",
    "celsius",
    "Temperature at which the GPU begins hardware slowdown.",
    "device",
)
GPU_SHUTDOWN_TEMPERATURE = gauge(
    "gpu_shutdown_temperature_celsius",
    "celsius",
    "Temperature at which the GPU shuts down to protect itself.",
    "device",
)
GPU_THERMAL_MARGIN = gauge(
    "gpu_thermal_margin_celsius",
    "celsius",
    "Distance to the nearest slowdown threshold (NVML margin temperature).",
    "device",
)
GPU_POWER = gauge(
    "gpu_power_watts", "watts", "Board power draw (a 1 s average on Ampere and newer).", "device"
)
GPU_POWER_LIMIT = gauge(
    "gpu_power_limit_watts", "watts", "Enforced power limit after all limiters.", "device"
)
GPU_ENERGY = counter(
    "gpu_energy_joules_total", "joules", "Energy consumed since the driver was last loaded.", "device"
)
GPU_SM_CLOCK = gauge("gpu_sm_clock_hertz", "hertz", "Current SM clock.", "device")
GPU_MEMORY_CLOCK = gauge("gpu_memory_clock_hertz", "hertz", "Current memory clock.", "device")
GPU_CLOCK_EVENT = gauge(
    "gpu_clock_event_active",
    "",
    "1 while NVML reports this clock event (throttle) reason as active, else 0.",
    "device",
    ("uuid", "gpu", "reason"),
)
GPU_PCIE_GEN = gauge(
    "gpu_pcie_link_generation", "", "Current PCIe link generation (drops at idle).", "device"
)
GPU_PCIE_GEN_MAX = gauge(
    "gpu_pcie_link_generation_max", "", "Maximum PCIe link generation of GPU and slot.", "device"
)
GPU_PCIE_WIDTH = gauge(
    "gpu_pcie_link_width", "", "Current PCIe link width in lanes (drops at idle).", "device"
)
GPU_PCIE_WIDTH_MAX = gauge(
    "gpu_pcie_link_width_max", "", "Maximum PCIe link width of GPU and slot in lanes.", "device"
)
GPU_PCIE_REPLAYS = counter("gpu_pcie_replays_total", "", "PCIe replay (retransmission) events.", "device")
GPU_PSTATE = gauge("gpu_performance_state", "", "Current performance state, 0 (max) to 15 (min).", "device")
GPU_FAN_SPEED = gauge(
    "gpu_fan_speed_ratio",
    "ratio",
    "Intended fan speed as a share of the maximum; can exceed 1. Absent on fanless boards.",
    "device",
)

# --- collector "gpm" -----------------------------------------------------------------------------
GPU_SM_ACTIVE = gauge(
    "gpu_sm_active_ratio",
    "ratio",
    "Share of SMs that were busy over the last sampling interval (GPM, Hopper and newer).",
    "gpm",
)
GPU_SM_OCCUPANCY = gauge(
    "gpu_sm_occupancy_ratio", "ratio", "Resident warps as a share of the theoretical maximum (GPM).", "gpm"
)
GPU_TENSOR_ACTIVE = gauge(
    "gpu_tensor_active_ratio", "ratio", "Share of time SMs issued any tensor instruction (GPM).", "gpm"
)
GPU_DRAM_ACTIVE = gauge(
    "gpu_dram_active_ratio",
    "ratio",
    "DRAM bandwidth used as a share of the theoretical maximum (GPM).",
    "gpm",
)
_TRAFFIC = ("uuid", "gpu", "direction")
GPU_PCIE_THROUGHPUT = gauge(
    "gpu_pcie_throughput_bytes_per_second",
    "bytes_per_second",
    "PCIe traffic of the GPU by direction (tx: from the GPU), averaged over the last sampling interval "
    "(GPM, Hopper and newer); without GPM a 20 ms driver sample (nvmlDeviceGetPcieThroughput).",
    "gpm",
    _TRAFFIC,
)
GPU_NVLINK_THROUGHPUT = gauge(
    "gpu_nvlink_throughput_bytes_per_second",
    "bytes_per_second",
    "NVLink data traffic of the GPU by direction (tx: from the GPU), summed over its links and averaged "
    "over the last sampling interval (GPM, or the NVML throughput counters without GPM).",
    "gpm",
    _TRAFFIC,
)

# --- collector "health" --------------------------------------------------------------------------
GPU_XID_ERRORS = counter(
    "gpu_xid_errors_total",
    "",
    "XID critical errors seen by the NVML event thread, per code.",
    "health",
    ("uuid", "gpu", "xid"),
)
GPU_ECC_ERRORS = counter(
    "gpu_ecc_errors_total",
    "",
    "ECC memory errors since the driver was loaded (volatile counters).",
    "health",
    ("uuid", "gpu", "type"),
)
GPU_REMAPPED_ROWS = counter(
    "gpu_remapped_rows_total",
    "",
    "Memory rows remapped, by the error class that caused it.",
    "health",
    ("uuid", "gpu", "cause"),
)
GPU_REMAPPED_ROWS_PENDING = gauge(
    "gpu_remapped_rows_pending", "", "1 when a row remapping waits for a GPU reset.", "health"
)
GPU_REMAPPED_ROWS_FAILED = gauge(
    "gpu_remapped_rows_failed", "", "1 when a row remapping has ever failed.", "health"
)

# --- collector "nvlink" --------------------------------------------------------------------------
GPU_NVLINK_UP = gauge(
    "gpu_nvlink_up", "", "1 when the NVLink link is active, else 0.", "nvlink", ("uuid", "gpu", "link")
)
GPU_NVLINK_PEER_INFO = info(
    "gpu_nvlink_peer_info",
    "A pair of GPUs joined by NVLink; via is direct or nvswitch, links the number of active links.",
    "nvlink",
    ("uuid", "gpu", "peer_uuid", "peer_gpu", "via", "links"),
)

# --- collector "processes" -----------------------------------------------------------------------
_PROC = ("uuid", "gpu", "pid", "namespace", "pod", "container")
GPU_PROCESS_MEMORY = gauge(
    "gpu_process_memory_used_bytes",
    "bytes",
    "Device memory used by a process (host PID); pod labels empty when unknown.",
    "processes",
    _PROC,
)
GPU_PROCESS_SM_UTILIZATION = gauge(
    "gpu_process_sm_utilization_ratio",
    "ratio",
    "A process's share of kernel-running time over the last interval (NVML process samples; 0 when it "
    "had no sample).",
    "processes",
    _PROC,
)

# --- collector "mig" -----------------------------------------------------------------------------
_MIG = ("uuid", "gpu", "mig_uuid")
GPU_MIG_INFO = info(
    "gpu_mig_info",
    "A MIG instance of a GPU.",
    "mig",
    ("uuid", "gpu", "mig_uuid", "gpu_instance_id", "compute_instance_id", "profile"),
)
GPU_MIG_MEMORY_USED = gauge(
    "gpu_mig_memory_used_bytes", "bytes", "Device memory used in a MIG instance.", "mig", _MIG
)
GPU_MIG_MEMORY_TOTAL = gauge(
    "gpu_mig_memory_total_bytes", "bytes", "Device memory of a MIG instance.", "mig", _MIG
)
GPU_MIG_SM_ACTIVE = gauge(
    "gpu_mig_sm_active_ratio", "ratio", "Share of the instance's SMs that were busy (GPM).", "mig", _MIG
)
GPU_MIG_SM_OCCUPANCY = gauge(
    "gpu_mig_sm_occupancy_ratio", "ratio", "Warp occupancy in a MIG instance (GPM).", "mig", _MIG
)
GPU_MIG_TENSOR_ACTIVE = gauge(
    "gpu_mig_tensor_active_ratio", "ratio", "Tensor activity in a MIG instance (GPM).", "mig", _MIG
)
GPU_MIG_DRAM_ACTIVE = gauge(
    "gpu_mig_dram_active_ratio", "ratio", "DRAM bandwidth use in a MIG instance (GPM).", "mig", _MIG
)

DEVICE_METRICS: tuple[MetricSpec, ...] = (
    GPU_INFO,
    GPU_UP,
    GPU_UTILIZATION,
    GPU_MEMORY_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_RESERVED,
    GPU_MEMORY_FREE,
    GPU_TEMPERATURE,
    GPU_MEMORY_TEMPERATURE,
    GPU_SLOWDOWN_TEMPERATURE,
    GPU_SHUTDOWN_TEMPERATURE,
    GPU_THERMAL_MARGIN,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_ENERGY,
    GPU_SM_CLOCK,
    GPU_MEMORY_CLOCK,
    GPU_CLOCK_EVENT,
    GPU_PCIE_GEN,
    GPU_PCIE_GEN_MAX,
    GPU_PCIE_WIDTH,
    GPU_PCIE_WIDTH_MAX,
    GPU_PCIE_REPLAYS,
    GPU_PSTATE,
    GPU_FAN_SPEED,
)
GPM_METRICS = (GPU_SM_ACTIVE, GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVE, GPU_DRAM_ACTIVE)
INTERCONNECT_METRICS = (GPU_PCIE_THROUGHPUT, GPU_NVLINK_THROUGHPUT)
HEALTH_METRICS = (
    GPU_XID_ERRORS,
    GPU_ECC_ERRORS,
    GPU_REMAPPED_ROWS,
    GPU_REMAPPED_ROWS_PENDING,
    GPU_REMAPPED_ROWS_FAILED,
)
NVLINK_METRICS = (GPU_NVLINK_UP, GPU_NVLINK_PEER_INFO)
PROCESS_METRICS = (GPU_PROCESS_MEMORY, GPU_PROCESS_SM_UTILIZATION)
MIG_METRICS = (
    GPU_MIG_INFO,
    GPU_MIG_MEMORY_USED,
    GPU_MIG_MEMORY_TOTAL,
    GPU_MIG_SM_ACTIVE,
    GPU_MIG_SM_OCCUPANCY,
    GPU_MIG_TENSOR_ACTIVE,
    GPU_MIG_DRAM_ACTIVE,
)

GPU_METRICS: tuple[MetricSpec, ...] = (
    DEVICE_METRICS
    + GPM_METRICS
    + INTERCONNECT_METRICS
    + HEALTH_METRICS
    + NVLINK_METRICS
    + PROCESS_METRICS
    + MIG_METRICS
)
