"""Fleet overview: utilization, idle-but-allocated GPUs, GPU-hours and cost per namespace, health."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.promql import num
from alerts.rules.recording import ALLOCATION_SHARE, SM_ACTIVITY
from dashboards.boards.filters import NAMESPACE, NODE, POD, UIDS, gpu_filters
from dashboards.grafana import Dashboard, Link, Panel, Row, Target, Threshold

# a click on a node's series opens that node's detail board for the same time range
TO_NODE = Link("Node detail", f"/d/{UIDS['node']}?var-node=${{__field.labels.node}}&${{__url_time_range}}")

RANGE_HOURS = "$__range_s / 3600"


def _idle_allocated(c: RulesConfig) -> str:
    # the cost view of idleness (namespace:gpu_idle_allocated:sum per container, `gpupulse report`): under
    # idle_sm_activity_ratio now, traffic or not. GPUIdleWhileAllocated is narrower: no kernel, no request
    # for hours.
    return (
        f"{ALLOCATION_SHARE}{{{NODE}, {NAMESPACE}, {POD}}} * 0 + on(uuid) group_left(source) "
        f"({SM_ACTIVITY} < {num(c.thresholds.idle_sm_activity_ratio)})"
    )


def _in_range(series: str) -> str:
    """Average over the dashboard range times its hours: GPU-hours (or money) spent in the range."""
    return f"sum by (namespace) (avg_over_time({series}{{{NAMESPACE}}}[$__range])) * {RANGE_HOURS}"


def dashboard(c: RulesConfig) -> Dashboard:
    """The fleet overview."""
    money = f"currency{c.cost.currency}"
    idle_percent = num(c.thresholds.idle_sm_activity_ratio * 100)
    gang = num(c.thresholds.gang_size_gpus)
    utilization = Row(
        "Utilization",
        (
            Panel("GPUs", "stat", "none", (Target(f"count(gpu_info{{{NODE}}})"),), width=4, height=4),
            Panel(
                "Allocated GPUs",
                "stat",
                "none",
                (Target(f"sum({ALLOCATION_SHARE}{{{NODE}, {NAMESPACE}, {POD}}})"),),
                width=4,
                height=4,
            ),
            Panel(
                "Idle but allocated",
                "stat",
                "none",
                (Target(f"count({_idle_allocated(c)}) or vector(0)"),),
                description=f"Allocated GPUs under {idle_percent}% SM activity now.",
                width=4,
                height=4,
            ),
            Panel(
                "Free GPUs",
                "stat",
                "none",
                (Target(f"sum(node:gpu_free:count{{{NODE}}})"),),
                description="Healthy GPUs nobody holds.",
                width=4,
                height=4,
            ),
            Panel(
                f"Free {num(c.thresholds.gang_size_gpus)}-GPU slots",
                "stat",
                "none",
                (Target(":gpu_gang_slots:sum"),),
                description=(
                    f"Jobs of {gang} GPUs on one node that fit now; many free GPUs "
                    "with no slot means the fleet is fragmented."
                ),
                width=4,
                height=4,
            ),
            Panel(
                "Free GPUs on nodes that fit a gang",
                "stat",
                "none",
                (Target(":gpu_free_on_gang_nodes:sum"),),
                width=4,
                height=4,
            ),
            Panel(
                "SM activity by namespace",
                "timeseries",
                "percentunit",
                (Target(f"namespace:gpu_sm_activity:avg{{{NAMESPACE}}}", "{{namespace}} ({{source}})"),),
                description=(
                    "gpm: GPM SM activity; nvml_utilization: NVML's coarser 'a kernel was running' share."
                ),
                min_value=0,
                max_value=1,
            ),
            Panel(
                "SM activity per GPU",
                "timeseries",
                "percentunit",
                (Target(f"{SM_ACTIVITY}{{{NODE}}}", "{{node}} GPU {{gpu}} ({{source}})"),),
                min_value=0,
                max_value=1,
                links=(TO_NODE,),
            ),
        ),
    )
    idle = Row(
        "Idle but allocated",
        (
            Panel(
                "Allocated GPUs under the idle threshold",
                "table",
                "percentunit",
                (Target(_idle_allocated(c)),),
                description="One row per container holding a mostly idle GPU; the value is its SM activity.",
                width=24,
            ),
        ),
    )
    cost = Row(
        "GPU-hours and cost",
        (
            Panel(
                "GPUs allocated per namespace",
                "timeseries",
                "none",
                (Target(f"namespace:gpu_allocated:sum{{{NAMESPACE}}}", "{{namespace}}"),),
                stacked=True,
            ),
            Panel(
                "Idle allocated GPUs per namespace",
                "timeseries",
                "none",
                (Target(f"namespace:gpu_idle_allocated:sum{{{NAMESPACE}}}", "{{namespace}}"),),
                stacked=True,
            ),
            Panel(
                "GPU-hours in range",
                "bargauge",
                "h",
                (Target(_in_range("namespace:gpu_allocated:sum"), "{{namespace}}", instant=True),),
                width=8,
            ),
            Panel(
                "Cost in range",
                "bargauge",
                money,
                (
                    Target(
                        _in_range("namespace:gpu_allocated_cost_per_hour:sum"), "{{namespace}}", instant=True
                    ),
                ),
                description=f"At {num(c.cost.price_per_gpu_hour)} {c.cost.currency} per GPU-hour.",
                width=8,
            ),
            Panel(
                "Cost of idle GPUs in range",
                "bargauge",
                money,
                (Target(_in_range("namespace:gpu_idle_cost_per_hour:sum"), "{{namespace}}", instant=True),),
                width=8,
            ),
        ),
    )
    health = Row(
        "Health",
        (
            Panel(
                "Firing gpupulse alerts",
                "table",
                "none",
                (
                    Target(
                        "count by (alertname, severity, fault_class) "
                        '(ALERTS{alertstate="firing", fault_class!=""})'
                    ),
                ),
                width=8,
            ),
            Panel(
                "GPUs lost",
                "stat",
                "none",
                (Target(f"count(gpu_up{{{NODE}}} == 0) or vector(0)"),),
                width=4,
                thresholds=(Threshold(1),),
            ),
            Panel(
                "Exporters up",
                "stat",
                "none",
                (Target(f"sum(up{{{c.exporter_selector}}}) or vector(0)"),),
                width=4,
            ),
            Panel(
                "Hottest GPU per node",
                "timeseries",
                "celsius",
                (Target(f"max by (node) (gpu_temperature_celsius{{{NODE}}})", "{{node}}"),),
                width=8,
                thresholds=(Threshold(c.thresholds.temperature_celsius),),
                links=(TO_NODE,),
            ),
            Panel(
                "XID events",
                "timeseries",
                "none",
                (
                    Target(
                        f"sum by (node, xid) (increase(gpu_xid_errors_total{{{NODE}}}[$__rate_interval]))",
                        "{{node}} XID {{xid}}",
                    ),
                ),
                width=24,
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["fleet"],
        title="gpupulse / Fleet overview",
        description="GPU utilization, idle-but-allocated GPUs, GPU-hours and cost per namespace, and health.",
        rows=(utilization, idle, cost, health),
        variables=gpu_filters(),
        links=tuple(UIDS.values()),
    )
