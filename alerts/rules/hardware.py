"""Hardware alerts: temperature and throttling, XIDs, ECC and row remapping, PCIe link."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.common import alert, held
from alerts.rules.model import Group, RuleFile
from alerts.rules.promql import num
from alerts.rules.recording import ALLOCATION_SOLE
from gpupulse.xid import XidClass, xid_class

GPU_BY = "node, uuid, gpu"
# GPUs that held a rank of a training job within the event window: a lost or reset-class GPU under a
# rank is the job's incident (TrainingJobNodeFault restarts the gang), not the GPU's (which would evict
# one rank's pod). last_over_time: a lost GPU's processes can no longer be listed.
RANK_INFO = "gpu_training_rank_info"


def training_gpus(lookback: str) -> str:
    """The GPUs that held a rank of a training job within `lookback`."""
    return f"max by (uuid) (last_over_time({RANK_INFO}[{lookback}]))"


THERMAL_EVENTS = 'gpu_clock_event_active{reason=~"sw_thermal_slowdown|hw_thermal_slowdown"}'
IDLE_EVENT = 'gpu_clock_event_active{reason="gpu_idle"}'
_GPU_TEXT = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.node }}"
# An event count from increase() is extrapolated to the window's edges, so one event reads 1 on 2.42 and
# 1.25 on 3.x (a range is left-open there: one sample fewer in the window, docs/alerts.md). The events
# are whole; their count is shown rounded.
_EVENT_COUNT = '{{ $value | printf "%.0f" }}'


def events(metric: str, matchers: str, window: str, by: str) -> str:
    """Counter series that increased within `window`, or appeared within it.

    increase() cannot see a series' first event (it has no earlier sample), and the exporter creates
    an XID series only when that XID first happens; a series that exists now but not `window` ago is
    therefore an event too, provided the node's GPUs were already scraped then (otherwise a freshly
    started Prometheus would take every old counter for a new event).
    """
    selector = f"{metric}{{{matchers}}}"
    return (
        f"(max by ({by}) (increase({selector}[{window}])) > 0)\n"
        f"or on({by})\n"
        f"(\n  max by ({by}) ({selector})\n"
        f"  unless on({by}) max by ({by}) ({selector} offset {window})\n"
        f"  and on(node) max by (node) (gpu_up offset {window})\n)"
    )


def _xid_matcher(cls: XidClass) -> str:
    # the XID classes live in gpupulse/xid.py, which the fault signatures read too
    return f'xid=~"{cls.regex}"'


def hardware_file(c: RulesConfig) -> RuleFile:
    """alerts/hardware.rules.yaml."""
    t, w = c.thresholds, c.windows
    app, reset, bus = xid_class("restart_app"), xid_class("reset_gpu"), xid_class("fell_off_bus")
    app_events = events("gpu_xid_errors_total", _xid_matcher(app), w.event, f"{GPU_BY}, xid")
    reset_events = events("gpu_xid_errors_total", _xid_matcher(reset), w.event, f"{GPU_BY}, xid")
    bus_events = events("gpu_xid_errors_total", _xid_matcher(bus), w.event, f"{GPU_BY}, xid")
    ecc_events = events("gpu_ecc_errors_total", 'type="uncorrected"', w.event, GPU_BY)
    rules = (
        alert(
            c,
            "GPUTemperatureHigh",
            expr=f"max by ({GPU_BY}) ({held(c, 'gpu_temperature_celsius')}) > {num(t.temperature_celsius)}",
            severity="warning",
            layer="hardware",
            fault_class="thermal",
            target_kind="gpu",
            summary="GPU temperature is high.",
            description=(
                f"{_GPU_TEXT} is at {{{{ $value }}}} °C, above {num(t.temperature_celsius)} °C "
                f"for {c.for_('GPUTemperatureHigh')}."
            ),
        ),
        alert(
            c,
            "GPUThermalThrottling",
            expr=(f"max by ({GPU_BY}) ({held(c, THERMAL_EVENTS)}) == 1"),
            severity="warning",
            layer="hardware",
            fault_class="thermal",
            target_kind="gpu",
            summary="GPU clocks are held down for temperature.",
            description=(
                f"{_GPU_TEXT} has been slowed down by a thermal clock event for "
                f"{c.for_('GPUThermalThrottling')}; its work runs slower than the hardware allows."
            ),
        ),
        alert(
            c,
            app.alertname,
            # The pod is named only when exactly one container holds the GPU: an XID does not say
            # which process faulted, and restarting every tenant of a shared GPU is not ours to do.
            expr=(
                f"(\n{app_events}\n)\n* on(uuid) group_left(namespace, pod, container) {ALLOCATION_SOLE}\n"
                f"or on(uuid, xid)\n(\n{app_events}\n)"
            ),
            severity="warning",
            layer="hardware",
            fault_class=app.fault_class,
            target_kind="pod",
            summary="An application on a GPU hit an XID that needs an application restart.",
            description=(
                f"{_GPU_TEXT} reported XID {{{{ $labels.xid }}}} ({_EVENT_COUNT} in the last {w.event}), "
                "{{ if $labels.pod }}held by pod {{ $labels.namespace }}/{{ $labels.pod }}{{ else }}"
                "not held by exactly one pod, so no pod is named{{ end }}. NVIDIA's answer is RESTART_APP; "
                "the GPU itself stays usable."
            ),
            keep_firing_for=w.stale_hold,
        ),
        alert(
            c,
            reset.alertname,
            expr=f"(\n{reset_events}\n)\nunless on(uuid) {training_gpus(w.event)}",
            severity="critical",
            layer="hardware",
            fault_class=reset.fault_class,
            target_kind="gpu",
            summary="A GPU hit an XID that needs a GPU reset.",
            description=(
                f"{_GPU_TEXT} reported XID {{{{ $labels.xid }}}}; NVIDIA's answer is RESET_GPU. "
                "Restarting the workload on the same GPU will not help: move it, then reset the GPU."
            ),
            keep_firing_for=w.stale_hold,
        ),
        alert(
            c,
            bus.alertname,
            # A GPU whose NVML calls hang is stale, not lost (gpu_up is 0 for both): GPUExporterStale.
            expr=(
                f"(\nmax by ({GPU_BY}) (\n{bus_events}\n)\nor on(uuid)\n(max by ({GPU_BY}) (gpu_up) == 0)\n"
                "unless on(uuid) (max by (uuid) (gpupulse_gpu_stale) == 1)\n)\n"
                f"unless on(uuid) {training_gpus(w.event)}"
            ),
            severity="critical",
            layer="hardware",
            fault_class=bus.fault_class,
            target_kind="gpu",
            summary="A GPU fell off the bus or stopped answering.",
            description=(
                f"{_GPU_TEXT} reported XID 79 or cannot be read (gpu_up is 0). NVIDIA's answer is a "
                "node reboot (RESTART_BM); the GPU is lost to its workloads until then."
            ),
            keep_firing_for=w.stale_hold,
        ),
        alert(
            c,
            "GPUEccUncorrectable",
            expr=ecc_events,
            severity="critical",
            layer="hardware",
            fault_class="gpu_hardware",
            target_kind="gpu",
            summary="A GPU reported uncorrectable ECC errors.",
            description=(
                f"{_GPU_TEXT} counted {_EVENT_COUNT} uncorrectable ECC errors in the last {w.event}. "
                "Data in GPU memory may be corrupt."
            ),
            keep_firing_for=w.stale_hold,
        ),
        alert(
            c,
            "GPURowRemapPending",
            expr=f"max by ({GPU_BY}) ({held(c, 'gpu_remapped_rows_pending')}) == 1",
            severity="warning",
            layer="hardware",
            fault_class="xid_reset",
            target_kind="gpu",
            summary="A GPU has a memory row remap waiting for a GPU reset.",
            description=(
                f"{_GPU_TEXT} has a pending row remap; it takes effect only at the next GPU reset. "
                "Running applications can continue."
            ),
        ),
        alert(
            c,
            "GPURowRemapFailure",
            expr=f"max by ({GPU_BY}) ({held(c, 'gpu_remapped_rows_failed')}) == 1",
            severity="critical",
            layer="hardware",
            fault_class="gpu_hardware",
            target_kind="gpu",
            summary="A GPU failed to remap a memory row.",
            description=(
                f"{_GPU_TEXT} reports a row remapping failure, NVIDIA's stated RMA criterion. "
                "Take the GPU out of service."
            ),
        ),
        alert(
            c,
            "GPUPcieLinkDegraded",
            # Links train down when idle to save power; only a busy GPU below its maximum is degraded.
            expr=f"""
                max by ({GPU_BY}) (
                  ({held(c, "gpu_pcie_link_width")} < {held(c, "gpu_pcie_link_width_max")})
                  or on(uuid)
                  ({held(c, "gpu_pcie_link_generation")} < {held(c, "gpu_pcie_link_generation_max")})
                )
                and on(uuid)
                (max by (uuid) ({held(c, IDLE_EVENT)}) == 0)
                """,
            severity="warning",
            layer="hardware",
            fault_class="gpu_hardware",
            target_kind="gpu",
            summary="A busy GPU's PCIe link runs below its maximum generation or width.",
            description=(
                f"{_GPU_TEXT} is not idle but its PCIe link is below its maximum "
                "(now {{ $value }}); host-to-GPU transfers are slower than they should be."
            ),
        ),
    )
    return RuleFile("hardware", (Group("gpupulse.hardware", rules, scope="node"),))
