"""Alerts on the remediation controller itself: a tripped breaker, a forgotten pause, an inbox that
cannot commit, no replica leading, diagnoses that cannot read Prometheus.

They carry target_kind=controller, which the chart's AlertmanagerConfig does not route to the
controller: a controller that is stuck cannot be the one to say so, so these reach the Alertmanager
route the rest of your alerts take. The series are the controller's own (gpupulse_remediation_*), so
no job selector is needed; every rule keeps `namespace` and `job`, which tell releases apart.
"""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.common import alert, held
from alerts.rules.model import Group, RuleFile
from alerts.rules.promql import num

_BY = "namespace, job"

PAUSED_SINCE = "gpupulse_remediation_paused_since_timestamp_seconds"


def controller_file(c: RulesConfig) -> RuleFile:
    """alerts/controller.rules.yaml."""
    paused_max = num(c.thresholds.controller_paused_max_seconds)
    seen, window = c.windows.controller_seen, c.windows.controller_diagnosis
    rules = (
        alert(
            c,
            "GPUPulseControllerBreakerOpen",
            expr=f"max by ({_BY}) ({held(c, 'gpupulse_remediation_breaker_open')}) == 1",
            severity="critical",
            layer="observability",
            fault_class="controller",
            target_kind="controller",
            summary="The remediation controller's safety breaker is open: it acts on nothing.",
            description=(
                "The breaker of {{ $labels.job }} in {{ $labels.namespace }} opened (an action budget was "
                "exceeded). Every incident pages instead of acting until a human resets it with "
                "`gpupulse-remediation breaker reset`."
            ),
        ),
        alert(
            c,
            "GPUPulseControllerPausedTooLong",
            expr=(f"time() - max by ({_BY}) ({held(c, PAUSED_SINCE)} > 0) > {paused_max}"),
            severity="warning",
            layer="observability",
            fault_class="controller",
            target_kind="controller",
            summary="The remediation controller has been paused for long.",
            description=(
                "{{ $labels.job }} in {{ $labels.namespace }} has been paused for "
                "{{ $value | humanizeDuration }} (over "
                f"{paused_max} s): incidents page instead of acting. Resume it, or say why it stays "
                "paused (`gpupulse-remediation status` names who paused it)."
            ),
        ),
        alert(
            c,
            "GPUPulseControllerInboxNotWritable",
            expr=f"min by ({_BY}, instance) ({held(c, 'gpupulse_remediation_inbox_writable')}) == 0",
            severity="critical",
            layer="observability",
            fault_class="controller",
            target_kind="controller",
            summary="The remediation controller cannot commit alerts to its inbox.",
            description=(
                "Replica {{ $labels.instance }} of {{ $labels.job }} in {{ $labels.namespace }} fails to "
                "write its inbox (disk full or broken): its webhook answers 503 and Alertmanager retries; "
                "no new alert is acted on."
            ),
        ),
        alert(
            c,
            "GPUPulseControllerLeaderMissing",
            # no replica leads; or every replica seen within `seen` is gone, so none is left to read 0
            expr=f"""
                max by ({_BY}) (gpupulse_remediation_leader) == 0
                or
                (
                  group by ({_BY}) (max_over_time(gpupulse_remediation_leader[{seen}]))
                  unless on ({_BY})
                  group by ({_BY}) (gpupulse_remediation_leader)
                )
                """,
            severity="critical",
            layer="observability",
            fault_class="controller",
            target_kind="controller",
            summary="No replica of the remediation controller leads: nothing acts on incidents.",
            description=(
                "{{ $labels.job }} in {{ $labels.namespace }} has no leader, or none of its replicas is "
                "scraped any more. Alerts are still accepted where a replica runs, but no incident is "
                "acted on or paged by it."
            ),
        ),
        alert(
            c,
            "GPUPulseControllerDiagnosisFailing",
            expr=f"""
                sum by ({_BY}) (increase(gpupulse_remediation_diagnosis_failures_total[{window}])) >= 2
                and
                sum by ({_BY}) (increase(gpupulse_remediation_diagnosis_failures_total[{window}]))
                  > 0.5 * sum by ({_BY}) (increase(gpupulse_remediation_diagnoses_total[{window}]))
                """,
            severity="warning",
            layer="observability",
            fault_class="controller",
            target_kind="controller",
            summary="The remediation controller's diagnoses cannot read Prometheus.",
            description=(
                "Most diagnoses of {{ $labels.job }} in {{ $labels.namespace }} over the last "
                f"{window} could not read Prometheus: incidents are acted on and paged without a named "
                "cause, and verifies may not pass. Check --diagnosis.prometheus-url."
            ),
        ),
    )
    return RuleFile("controller", (Group("gpupulse.controller", rules, scope="fleet"),))
