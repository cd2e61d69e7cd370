"""Every metric family gpupulse exports, declared once; families are built only from these specs.

`python -m exporter.catalog --markdown > docs/metrics.md` regenerates the reference page.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exporter.metricspec import MetricSpec

_GPU = ("uuid", "gpu")


def _g(name: str, unit: str, help: str, collector: str, labels: tuple[str, ...] = _GPU) -> MetricSpec:
    return MetricSpec(name=name, type="gauge", unit=unit, labels=labels, help=help, collector=collector)


def _c(name: str, unit: str, help: str, collector: str, labels: tuple[str, ...] = _GPU) -> MetricSpec:
    return MetricSpec(name=name, type="counter", unit=unit, labels=labels, help=help, collector=collector)


def _i(name: str, help: str, collector: str, labels: tuple[str, ...]) -> MetricSpec:
    return MetricSpec(name=name, type="info", unit="", labels=labels, help=help, collector=collector)


# --- collector "device" --------------------------------------------------------------------------
GPU_INFO = _i(
    "gpu_info",
    "Static facts about a GPU; join on uuid.",
    "device",
    ("uuid", "gpu", "name", "pci_bus_id", "driver_version", "vbios_version", "mig_mode"),
)
GPU_UP = _g(
    "gpu_up",
    "",
    "1 when the GPU answered its last sample, 0 when it is lost or its call failed or hung.",
    "device",
)
GPU_UTILIZATION = _g(
    "gpu_utilization_ratio",
    "ratio",
    "Share of the last NVML sample period in which at least one kernel was running (NVML utilization.gpu); "
    "not SM activity, see gpu_sm_active_ratio.",
    "device",
)
GPU_MEMORY_UTILIZATION = _g(
    "gpu_memory_utilization_ratio",
    "ratio",
    "Share of the last NVML sample period in which device memory was read or written (not capacity).",
    "device",
)
GPU_MEMORY_USED = _g(
    "gpu_memory_used_bytes", "bytes", "Device memory allocated by processes (NVML memory v2).", "device"
)
GPU_MEMORY_TOTAL = _g("gpu_memory_total_bytes", "bytes", "Total device memory.", "device")
GPU_MEMORY_RESERVED = _g(
    "gpu_memory_reserved_bytes",
    "bytes",
    "Device memory reserved by the driver and firmware (NVML memory v2).",
    "device",
)
GPU_MEMORY_FREE = _g("gpu_memory_free_bytes", "bytes", "Device memory neither used nor reserved.", "device")
GPU_TEMPERATURE = _g("gpu_temperature_celsius", "celsius", "GPU core temperature.", "device")
GPU_MEMORY_TEMPERATURE = _g("gpu_memory_temperature_celsius", "celsius", "HBM/memory temperature.", "device")
GPU_SLOWDOWN_TEMPERATURE = _g(
    "gpu_slowdown_temperature_celsius",
    "celsius",
    "Temperature at which the GPU begins hardware slowdown.",
    "device",
)
GPU_SHUTDOWN_TEMPERATURE = _g(
    "gpu_shutdown_temperature_celsius",
    "celsius",
    "Temperature at which the GPU shuts down to protect itself.",
    "device",
)
GPU_THERMAL_MARGIN = _g(
    "gpu_thermal_margin_celsius",
    "celsius",
    "Distance to the nearest slowdown threshold (NVML margin temperature).",
    "device",
)
GPU_POWER = _g("gpu_power_watts", "watts", "Board power draw (a 1 s average on Ampere and newer).", "device")
GPU_POWER_LIMIT = _g("gpu_power_limit_watts", "watts", "Enforced power limit after all limiters.", "device")
GPU_ENERGY = _c(
    "gpu_energy_joules_total", "joules", "Energy consumed since the driver was last loaded.", "device"
)
GPU_SM_CLOCK = _g("gpu_sm_clock_hertz", "hertz", "Current SM clock.", "device")
GPU_MEMORY_CLOCK = _g("gpu_memory_clock_hertz", "hertz", "Current memory clock.", "device")
GPU_CLOCK_EVENT = _g(
    "gpu_clock_event_active",
    "",
    "1 while NVML reports this clock event (throttle) reason as active, else 0.",
    "device",
    ("uuid", "gpu", "reason"),
)
GPU_PCIE_GEN = _g("gpu_pcie_link_generation", "", "Current PCIe link generation (drops at idle).", "device")
GPU_PCIE_GEN_MAX = _g(
    "gpu_pcie_link_generation_max", "", "Maximum PCIe link generation of GPU and slot.", "device"
)
GPU_PCIE_WIDTH = _g("gpu_pcie_link_width", "", "Current PCIe link width in lanes (drops at idle).", "device")
GPU_PCIE_WIDTH_MAX = _g(
    "gpu_pcie_link_width_max", "", "Maximum PCIe link width of GPU and slot in lanes.", "device"
)
GPU_PCIE_REPLAYS = _c("gpu_pcie_replays_total", "", "PCIe replay (retransmission) events.", "device")
GPU_PSTATE = _g("gpu_performance_state", "", "Current performance state, 0 (max) to 15 (min).", "device")
GPU_FAN_SPEED = _g(
    "gpu_fan_speed_ratio",
    "ratio",
    "Intended fan speed as a share of the maximum; can exceed 1. Absent on fanless boards.",
    "device",
)

# --- collector "gpm" -----------------------------------------------------------------------------
GPU_SM_ACTIVE = _g(
    "gpu_sm_active_ratio",
    "ratio",
    "Share of SMs that were busy over the last sampling interval (GPM, Hopper and newer).",
    "gpm",
)
GPU_SM_OCCUPANCY = _g(
    "gpu_sm_occupancy_ratio", "ratio", "Resident warps as a share of the theoretical maximum (GPM).", "gpm"
)
GPU_TENSOR_ACTIVE = _g(
    "gpu_tensor_active_ratio", "ratio", "Share of time SMs issued any tensor instruction (GPM).", "gpm"
)
GPU_DRAM_ACTIVE = _g(
    "gpu_dram_active_ratio",
    "ratio",
    "DRAM bandwidth used as a share of the theoretical maximum (GPM).",
    "gpm",
)

# --- collector "health" --------------------------------------------------------------------------
GPU_XID_ERRORS = _c(
    "gpu_xid_errors_total",
    "",
    "XID critical errors seen by the NVML event thread, per code.",
    "health",
    ("uuid", "gpu", "xid"),
)
GPU_ECC_ERRORS = _c(
    "gpu_ecc_errors_total",
    "",
    "ECC memory errors since the driver was loaded (volatile counters).",
    "health",
    ("uuid", "gpu", "type"),
)
GPU_REMAPPED_ROWS = _c(
    "gpu_remapped_rows_total",
    "",
    "Memory rows remapped, by the error class that caused it.",
    "health",
    ("uuid", "gpu", "cause"),
)
GPU_REMAPPED_ROWS_PENDING = _g(
    "gpu_remapped_rows_pending", "", "1 when a row remapping waits for a GPU reset.", "health"
)
GPU_REMAPPED_ROWS_FAILED = _g(
    "gpu_remapped_rows_failed", "", "1 when a row remapping has ever failed.", "health"
)

# --- collector "nvlink" --------------------------------------------------------------------------
GPU_NVLINK_UP = _g(
    "gpu_nvlink_up", "", "1 when the NVLink link is active, else 0.", "nvlink", ("uuid", "gpu", "link")
)
GPU_NVLINK_PEER_INFO = _i(
    "gpu_nvlink_peer_info",
    "A pair of GPUs joined by NVLink; via is direct or nvswitch, links the number of active links.",
    "nvlink",
    ("uuid", "gpu", "peer_uuid", "peer_gpu", "via", "links"),
)

# --- collector "processes" -----------------------------------------------------------------------
_PROC = ("uuid", "gpu", "pid", "namespace", "pod", "container")
GPU_PROCESS_MEMORY = _g(
    "gpu_process_memory_used_bytes",
    "bytes",
    "Device memory used by a process (host PID); pod labels empty when unknown.",
    "processes",
    _PROC,
)
GPU_PROCESS_SM_UTILIZATION = _g(
    "gpu_process_sm_utilization_ratio",
    "ratio",
    "A process's share of kernel-running time over the last interval (NVML process samples; 0 when it "
    "had no sample).",
    "processes",
    _PROC,
)

# --- collector "mig" -----------------------------------------------------------------------------
_MIG = ("uuid", "gpu", "mig_uuid")
GPU_MIG_INFO = _i(
    "gpu_mig_info",
    "A MIG instance of a GPU.",
    "mig",
    ("uuid", "gpu", "mig_uuid", "gpu_instance_id", "compute_instance_id", "profile"),
)
GPU_MIG_MEMORY_USED = _g(
    "gpu_mig_memory_used_bytes", "bytes", "Device memory used in a MIG instance.", "mig", _MIG
)
GPU_MIG_MEMORY_TOTAL = _g(
    "gpu_mig_memory_total_bytes", "bytes", "Device memory of a MIG instance.", "mig", _MIG
)
GPU_MIG_SM_ACTIVE = _g(
    "gpu_mig_sm_active_ratio", "ratio", "Share of the instance's SMs that were busy (GPM).", "mig", _MIG
)
GPU_MIG_SM_OCCUPANCY = _g(
    "gpu_mig_sm_occupancy_ratio", "ratio", "Warp occupancy in a MIG instance (GPM).", "mig", _MIG
)
GPU_MIG_TENSOR_ACTIVE = _g(
    "gpu_mig_tensor_active_ratio", "ratio", "Tensor activity in a MIG instance (GPM).", "mig", _MIG
)
GPU_MIG_DRAM_ACTIVE = _g(
    "gpu_mig_dram_active_ratio", "ratio", "DRAM bandwidth use in a MIG instance (GPM).", "mig", _MIG
)

# --- exporter self-metrics -----------------------------------------------------------------------
COLLECTOR_SUCCESS = _g(
    "gpupulse_collector_success", "", "1 when the collector's last round succeeded.", "self", ("collector",)
)
COLLECTOR_DURATION = _g(
    "gpupulse_collector_duration_seconds",
    "seconds",
    "Wall time of the collector's last round.",
    "self",
    ("collector",),
)
LAST_SAMPLE_TIMESTAMP = _g(
    "gpupulse_last_sample_timestamp_seconds",
    "seconds",
    "Unix time at which the last good sample finished.",
    "self",
    (),
)
GPU_STALE = _g(
    "gpupulse_gpu_stale",
    "",
    "1 while an NVML call on this GPU is past its deadline; its values are dropped until it answers.",
    "self",
)
BUILD_INFO = _i(
    "gpupulse_build_info",
    "Version of the running exporter.",
    "self",
    ("version", "python_version", "nvml_binding_version"),
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
SELF_METRICS = (COLLECTOR_SUCCESS, COLLECTOR_DURATION, LAST_SAMPLE_TIMESTAMP, GPU_STALE, BUILD_INFO)

CORE_METRICS: tuple[MetricSpec, ...] = (
    DEVICE_METRICS
    + GPM_METRICS
    + HEALTH_METRICS
    + NVLINK_METRICS
    + PROCESS_METRICS
    + MIG_METRICS
    + SELF_METRICS
)

# Other helpers' specs: (module, attribute). Listed here so ALL_METRICS includes them once they exist.
_PLUGIN_SPECS = (
    ("exporter.engines.specs", "ENGINE_METRICS"),
    ("exporter.attribution.specs", "ATTRIBUTION_METRICS"),
    ("exporter.pagecache.specs", "PAGECACHE_METRICS"),
)


def _plugin_specs() -> tuple[MetricSpec, ...]:
    found: list[MetricSpec] = []
    for module, attribute in _PLUGIN_SPECS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found.extend(getattr(mod, attribute, ()))
    return tuple(found)


ALL_METRICS: tuple[MetricSpec, ...] = CORE_METRICS + _plugin_specs()


Family = GaugeMetricFamily | CounterMetricFamily


def family(spec: MetricSpec) -> Family:
    """An empty prometheus_client family for a gauge, counter or info spec."""
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
    if spec.type in ("gauge", "info"):
        # Info families are rendered as gauges of value 1 under their full *_info name.
        return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
    raise ValueError(f"{spec.name}: build histograms with prometheus_client directly")


def labels_of(spec: MetricSpec, **values: str) -> list[str]:
    """Label values in the spec's order; raises KeyError when one is missing."""
    return [values[label] for label in spec.labels]


def validate(specs: Iterable[MetricSpec]) -> list[str]:
    """Naming problems in the given specs (empty when they all follow the conventions)."""
    problems: list[str] = []
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            problems.append(f"{spec.name}: declared twice")
        seen.add(spec.name)
        if spec.type == "counter" and not spec.name.endswith("_total"):
            problems.append(f"{spec.name}: counters end in _total")
        if spec.type != "counter" and spec.name.endswith("_total"):
            problems.append(f"{spec.name}: only counters end in _total")
        if spec.type == "info" and not spec.name.endswith("_info"):
            problems.append(f"{spec.name}: info metrics end in _info")
        if spec.unit and spec.unit not in spec.name:
            problems.append(f"{spec.name}: unit {spec.unit} missing from the name")
        if not spec.help.strip():
            problems.append(f"{spec.name}: no help text")
        if spec.name.startswith("gpu_") and spec.labels[:2] != _GPU and spec.collector != "attribution":
            problems.append(f"{spec.name}: per-GPU series start with the uuid and gpu labels")
    return problems


def markdown(specs: Sequence[MetricSpec]) -> str:
    """The metric reference page (docs/metrics.md)."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from `exporter/catalog.py` by `python -m exporter.catalog --markdown > docs/metrics.md`;",
        "a test fails when this page drifts from the catalog. Every per-GPU series carries `uuid` and `gpu`",
        "(the NVML index); the `node` label comes from the scrape configuration.",
        "",
    ]
    by_collector: dict[str, list[MetricSpec]] = {}
    for spec in specs:
        by_collector.setdefault(spec.collector, []).append(spec)
    for collector, group in by_collector.items():
        lines += [
            f"## Collector `{collector}`",
            "",
            "| name | type | unit | labels | stability | help |",
            "|---|---|---|---|---|---|",
        ]
        for spec in group:
            labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
            help_text = spec.help.replace("|", "\\|")
            lines.append(
                f"| `{spec.name}` | {spec.type} | {spec.unit or '-'} | {labels} | {spec.stability} "
                f"| {help_text} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the catalog as markdown, or list naming problems."""
    parser = argparse.ArgumentParser(prog="python -m exporter.catalog")
    parser.add_argument("--markdown", action="store_true", help="print docs/metrics.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown(ALL_METRICS))
        return 0
    problems = validate(ALL_METRICS)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
