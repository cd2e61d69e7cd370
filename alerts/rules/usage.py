"""Use and cost alerts: allocated GPUs idle for hours (a ticket), full GPU memory, workloads above their
memory limits."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.common import alert, held
from alerts.rules.model import Group, RuleFile
from alerts.rules.promql import num
from alerts.rules.recording import (
    ALLOCATION_SHARE,
    HARD_LIMIT,
    POD_MEMORY,
    SM_ACTIVITY,
    SOFT_LIMIT,
    with_workload,
)
from alerts.rules.training import ranks_in_incident

_POD_TEXT = "Pod {{ $labels.namespace }}/{{ $labels.pod }}"


def usage_file(c: RulesConfig) -> RuleFile:
    """alerts/usage.rules.yaml."""
    t, w = c.thresholds, c.windows
    rules = (
        alert(
            c,
            "GPUIdleWhileAllocated",
            expr=_idle_allocated(c),
            severity="warning",
            layer="scheduling",
            fault_class="idle_allocated",
            target_kind="pod",
            summary="An allocated GPU ran no kernel and served no request for hours.",
            description=(
                f"{_POD_TEXT} (workload {{{{ $labels.workload }}}}) holds GPU {{{{ $labels.gpu }}}} "
                "({{ $labels.uuid }}) on node {{ $labels.node }}, which ran no kernel (SM activity "
                "({{ $labels.source }}) at most {{ $value | humanizePercentage }}, at or under "
                f"{{{{ {num(t.idle_no_kernel_ratio)} | humanizePercentage }}}}) and whose pod served no "
                f"inference request over the last {w.idle_allocated}. The GPU is paid for and nobody else "
                "can use it: a ticket for its owner, never a page (idle capacity by namespace and pod: "
                "`gpupulse report`)."
            ),
        ),
        alert(
            c,
            "GPUMemoryNearFull",
            expr=(
                f"max by (node, uuid, gpu) ({held(c, 'gpu_memory_used_bytes')} / "
                f"{held(c, 'gpu_memory_total_bytes')}) > {num(t.memory_near_full_ratio)}"
            ),
            severity="warning",
            layer="scheduling",
            fault_class="memory_pressure",
            target_kind="gpu",
            summary="GPU memory is nearly full.",
            description=(
                "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.node }} has "
                "{{ $value | humanizePercentage }} of its memory in use; the next allocation may fail "
                "with out-of-memory."
            ),
        ),
        alert(
            c,
            "GPUProcessMemoryAboveSoftLimit",
            expr=_above(c, SOFT_LIMIT),
            severity="info",
            layer="scheduling",
            fault_class="memory_pressure",
            target_kind="pod",
            summary="A workload uses more GPU memory than it usually does.",
            description=(
                f"{_POD_TEXT} (workload {{{{ $labels.workload }}}}) uses {{{{ $value | humanize1024 }}}}B "
                f"of GPU memory, above its soft limit (P{num(t.memory_soft_limit_quantile * 100)} of the "
                f"last {c.windows.memory_history}). Shed low-priority work before the hard limit."
            ),
        ),
        alert(
            c,
            "GPUProcessMemoryAboveHardLimit",
            expr=_above(c, HARD_LIMIT),
            severity="warning",
            layer="serving",
            fault_class="memory_leak",
            target_kind="pod",
            summary="A workload's GPU memory grew past its hard limit.",
            description=(
                f"{_POD_TEXT} (workload {{{{ $labels.workload }}}}) uses {{{{ $value | humanize1024 }}}}B "
                f"of GPU memory, above its hard limit (P{num(t.memory_hard_limit_quantile * 100)} of the "
                f"last {c.windows.memory_history}, at least {num(t.memory_limit_gap_ratio * 100)}% above the "
                "soft limit). This looks like a leak; a restart frees the memory."
            ),
        ),
    )
    return RuleFile("usage", (Group("gpupulse.usage", rules, scope="fleet"),))


def _idle_allocated(c: RulesConfig) -> str:
    """One alert per container holding a GPU that ran no kernel over `idle_allocated` (the value: its
    highest SM activity over that time), held by the same pod since then, whose pod served no request
    over it. A GPU at 20% SM activity with live traffic at night is not idle: it runs kernels. Not for
    the GPUs of a training job a training alert fires for: they idle because the job is hung (or its
    node is lost), and that incident names them. Every part reads over the window, so a missed scrape
    or an exporter restart (one stale evaluation) neither empties it nor restarts its `for:`.
    """
    t, w = c.thresholds, c.windows
    window = w.idle_allocated
    # requests answered (the latency histogram's count, or tokens where Prometheus 3 keeps that
    # histogram native only: histogram_count() is not MetricsQL, and vmalert runs fleet groups), or
    # requests in the engine at some moment
    answered = (
        f"{c.latency_histogram}_count",
        "inference_prompt_tokens_total",
        "inference_generation_tokens_total",
    )
    requests = " or ".join(
        (
            *(f"rate({counter}[{window}]) > 0" for counter in answered),
            f"max_over_time(inference_requests_running[{window}]) > 0",
            f"max_over_time(inference_requests_waiting[{window}]) > 0",
        )
    )
    idle = (
        "(\n"
        f"  {held(c, ALLOCATION_SHARE)} * 0\n"
        "  + on(uuid) group_left(source)\n"
        # one series per GPU: a GPU whose source changed inside the window (NVML's utilization until
        # GPM had two samples after an exporter restart) has one per source; the busiest one speaks
        f"  (topk by (uuid) (1, max_over_time({SM_ACTIVITY}[{window}])) <= {num(t.idle_no_kernel_ratio)})\n"
        ")\n"
        f"and on(uuid, namespace, pod) ({ALLOCATION_SHARE} offset {window})\n"
        f"unless on(namespace, pod) group by (namespace, pod) (\n  {requests}\n)\n"
        f"unless on(uuid) {ranks_in_incident(c)}"
    )
    return with_workload(f"(\n{idle}\n)")


def _above(c: RulesConfig, limit: str) -> str:
    """A pod above its workload's learned limit; the limit (written every memory_history_interval by
    another group) read over memory_limit_hold, never at the edge of one interval."""
    return (
        f"{held(c, POD_MEMORY)}\n> on(namespace, workload) group_left()\n"
        f"last_over_time({limit}[{c.windows.memory_limit_hold}])"
    )
