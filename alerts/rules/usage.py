"""Use and cost alerts: idle allocated GPUs, full GPU memory, workloads above their memory limits."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.common import alert
from alerts.rules.model import Group, RuleFile
from alerts.rules.promql import num
from alerts.rules.recording import ALLOCATION_SHARE, HARD_LIMIT, POD_MEMORY, SM_ACTIVITY, SOFT_LIMIT
from alerts.rules.training import ranks_in_incident

_POD_TEXT = "Pod {{ $labels.namespace }}/{{ $labels.pod }}"


def usage_file(c: RulesConfig) -> RuleFile:
    """alerts/usage.rules.yaml."""
    t = c.thresholds
    idle = num(t.idle_sm_activity_ratio)
    rules = (
        alert(
            c,
            "GPUIdleWhileAllocated",
            # One alert per container holding the GPU; the value is the GPU's SM activity. Not for the
            # GPUs of a training job a training alert fires for: they idle because the job is hung (or
            # its node is lost), and that incident names them; 64 warnings more would add nothing.
            expr=f"""
                {ALLOCATION_SHARE} * 0
                + on(uuid) group_left(source)
                ({SM_ACTIVITY} < {idle})
                unless on(uuid) {ranks_in_incident(c)}
                """,
            severity="warning",
            layer="scheduling",
            fault_class="idle_allocated",
            target_kind="pod",
            summary="An allocated GPU is mostly idle.",
            description=(
                f"{_POD_TEXT} holds GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on node "
                "{{ $labels.node }}, whose SM activity ({{ $labels.source }}) is "
                f"{{{{ $value | humanizePercentage }}}}, under {{{{ {idle} | humanizePercentage }}}} "
                f"for {c.for_('GPUIdleWhileAllocated')}. The GPU is paid for and nobody else can use it."
            ),
        ),
        alert(
            c,
            "GPUMemoryNearFull",
            expr=(
                "max by (node, uuid, gpu) (gpu_memory_used_bytes / gpu_memory_total_bytes) "
                f"> {num(t.memory_near_full_ratio)}"
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


def _above(c: RulesConfig, limit: str) -> str:
    """A pod above its workload's learned limit; the limit (written every memory_history_interval by
    another group) read over memory_limit_hold, never at the edge of one interval."""
    return (
        f"{POD_MEMORY}\n> on(namespace, workload) group_left()\n"
        f"last_over_time({limit}[{c.windows.memory_limit_hold}])"
    )
