"""GPU node detail: per GPU and per process, throttling, XIDs and health, page-cache residency."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.recording import SM_ACTIVITY
from dashboards.boards.annotations import ACTIONS, DIAGNOSES
from dashboards.boards.filters import NAMESPACE, NODE, POD, UIDS, gpu_filters
from dashboards.grafana import Dashboard, Panel, Row, Target, Threshold

GPU = "{{node}} GPU {{gpu}}"
PROC = "{{namespace}}/{{pod}} pid {{pid}}"
SEL = f"{NODE}, {NAMESPACE}, {POD}"


def dashboard(c: RulesConfig) -> Dashboard:
    """The per-node detail dashboard."""
    n = f"{{{NODE}}}"
    gpus = Row(
        "GPUs",
        (
            Panel(
                "SM activity",
                "timeseries",
                "percentunit",
                (Target(f"{SM_ACTIVITY}{n}", GPU + " ({{source}})"),),
                min_value=0,
                max_value=1,
            ),
            Panel(
                "Temperature",
                "timeseries",
                "celsius",
                (
                    Target(f"gpu_temperature_celsius{n}", GPU),
                    Target(f"gpu_memory_temperature_celsius{n}", GPU + " memory"),
                ),
                description="The dashed line is where GPUTemperatureHigh starts counting.",
                thresholds=(Threshold(c.thresholds.temperature_celsius),),
            ),
            Panel(
                "Memory used",
                "timeseries",
                "bytes",
                (
                    Target(f"gpu_memory_used_bytes{n}", GPU + " used"),
                    Target(f"gpu_memory_total_bytes{n}", GPU + " total"),
                ),
            ),
            Panel(
                "Power",
                "timeseries",
                "watt",
                (
                    Target(f"gpu_power_watts{n}", GPU),
                    Target(f"gpu_power_limit_watts{n}", GPU + " limit"),
                ),
            ),
            Panel("SM clock", "timeseries", "hertz", (Target(f"gpu_sm_clock_hertz{n}", GPU),)),
            Panel(
                "Clock events (throttling)",
                "state-timeline",
                "none",
                (Target(f'gpu_clock_event_active{{{NODE}, reason!="gpu_idle"}} == 1', GPU + " {{reason}}"),),
                description="Why the driver holds clocks down; thermal and power-brake reasons slow work.",
            ),
        ),
    )
    processes = Row(
        "Processes",
        (
            Panel(
                "GPU memory per process",
                "timeseries",
                "bytes",
                (
                    Target(
                        f"gpu_process_memory_used_bytes{{{NODE}, {NAMESPACE}, {POD}}}", PROC + " GPU {{gpu}}"
                    ),
                ),
                stacked=True,
            ),
            Panel(
                "SM utilization per process",
                "timeseries",
                "percentunit",
                (
                    Target(
                        f"gpu_process_sm_utilization_ratio{{{NODE}, {NAMESPACE}, {POD}}}",
                        PROC + " GPU {{gpu}}",
                    ),
                ),
                min_value=0,
                max_value=1,
            ),
            Panel(
                "Host CPU per process",
                "timeseries",
                "short",
                (
                    Target(
                        f"rate(gpu_process_host_cpu_seconds_total{{{SEL}}}[$__rate_interval])",
                        PROC,
                    ),
                ),
                description="CPU cores; one saturated core under an idle GPU is the starved-GPU picture.",
            ),
            Panel(
                "Workload memory against its limits",
                "timeseries",
                "bytes",
                (
                    Target(
                        f"namespace_workload_pod:gpu_process_memory_used_bytes:sum{{{SEL}}}",
                        "{{namespace}}/{{pod}}",
                    ),
                    Target(
                        f"namespace_workload:gpu_process_memory_soft_limit_bytes:quantile{{{NAMESPACE}}}",
                        "{{namespace}}/{{workload}} soft limit",
                    ),
                    Target(
                        f"namespace_workload:gpu_process_memory_hard_limit_bytes:quantile{{{NAMESPACE}}}",
                        "{{namespace}}/{{workload}} hard limit",
                    ),
                ),
            ),
        ),
    )
    health = Row(
        "Health",
        (
            Panel("GPU up", "state-timeline", "none", (Target(f"gpu_up{n}", GPU),), width=8),
            Panel(
                "XID events",
                "timeseries",
                "none",
                (
                    Target(
                        f"sum by (node, gpu, xid) (increase(gpu_xid_errors_total{n}[$__rate_interval]))",
                        GPU + " XID {{xid}}",
                    ),
                ),
                width=8,
            ),
            Panel(
                "ECC errors",
                "timeseries",
                "none",
                (
                    Target(
                        f"sum by (node, gpu, type) (increase(gpu_ecc_errors_total{n}[$__rate_interval]))",
                        GPU + " {{type}}",
                    ),
                ),
                width=8,
            ),
            Panel(
                "Row remapping",
                "table",
                "none",
                (
                    Target(f"gpu_remapped_rows_pending{n}", GPU + " pending"),
                    Target(f"gpu_remapped_rows_failed{n}", GPU + " failed"),
                ),
                width=8,
            ),
            Panel(
                "PCIe link (current / max)",
                "timeseries",
                "percentunit",
                (
                    Target(f"gpu_pcie_link_width{n} / gpu_pcie_link_width_max{n}", GPU + " width"),
                    Target(
                        f"gpu_pcie_link_generation{n} / gpu_pcie_link_generation_max{n}", GPU + " generation"
                    ),
                ),
                width=8,
                min_value=0,
                max_value=1,
            ),
            Panel(
                "NVLink links down",
                "stat",
                "none",
                (Target(f"count(gpu_nvlink_up{n} == 0) or vector(0)"),),
                width=8,
                thresholds=(Threshold(1),),
            ),
        ),
    )
    page_cache = Row(
        "Model weights in the page cache",
        (
            Panel(
                "Resident share of model weights",
                "timeseries",
                "percentunit",
                (
                    Target(
                        f"model_weights_page_cache_resident_ratio{{{NODE}, {NAMESPACE}, {POD}}}",
                        "{{namespace}}/{{pod}} {{model}}",
                    ),
                ),
                min_value=0,
                max_value=1,
                description="Weights evicted from the page cache are re-read from disk: P99 spikes.",
            ),
            Panel(
                "Resident bytes and size",
                "timeseries",
                "bytes",
                (
                    Target(
                        f"model_weights_resident_bytes{{{NODE}, {NAMESPACE}, {POD}}}",
                        "{{pod}} {{model}} resident",
                    ),
                    Target(
                        f"model_weights_size_bytes{{{NODE}, {NAMESPACE}, {POD}}}", "{{pod}} {{model}} size"
                    ),
                ),
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["node"],
        title="gpupulse / GPU node detail",
        description="Per GPU and process: activity, memory, throttling, XIDs, health, page cache.",
        rows=(gpus, processes, health, page_cache),
        variables=gpu_filters(),
        links=tuple(UIDS.values()),
        annotations=(DIAGNOSES, ACTIONS),
    )
