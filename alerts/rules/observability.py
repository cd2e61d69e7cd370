"""Alerts on the monitoring pipeline itself: exporter down, stale samples, failing collectors."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.common import alert, held
from alerts.rules.model import Group, RuleFile
from alerts.rules.promql import num

_TARGET = "node, instance, job"


def observability_file(c: RulesConfig) -> RuleFile:
    """alerts/observability.rules.yaml."""
    sel = c.exporter_selector
    collectors = f"gpupulse_collector_success{{{sel}}}"
    stale = num(c.thresholds.exporter_stale_seconds)
    rules = (
        alert(
            c,
            "GPUExporterDown",
            # absent() covers "no exporter was ever discovered", which up == 0 cannot see; GPU
            # alerts that have no data would otherwise read as healthy. Only once Prometheus has
            # scraped something (any `up`): before its first scrape nothing is known, not missing.
            expr=f"(absent(up{{{sel}}}) and on() count(up) > 0) or max by ({_TARGET}) (up{{{sel}}}) == 0",
            severity="critical",
            layer="observability",
            fault_class="observability",
            target_kind="exporter",
            summary="The GPU exporter is down or not scraped.",
            description=(
                "{{ if $labels.instance }}Prometheus cannot scrape gpupulse-exporter {{ $labels.instance }} "
                "on node {{ $labels.node }}.{{ else }}Prometheus has no gpupulse-exporter target at all."
                "{{ end }} GPU alerts are blind where the exporter is missing."
            ),
        ),
        alert(
            c,
            "GPUExporterStale",
            expr=f"""
                time() - max by ({_TARGET}) (gpupulse_last_sample_timestamp_seconds{{{sel}}}) > {stale}
                or
                max by ({_TARGET}, uuid, gpu) (gpupulse_gpu_stale{{{sel}}}) == 1
                """,
            severity="warning",
            layer="observability",
            fault_class="observability",
            target_kind="exporter",
            summary="The GPU exporter serves old samples.",
            description=(
                "gpupulse-exporter {{ $labels.instance }} on node {{ $labels.node }} answers scrapes, but "
                "{{ if $labels.uuid }}GPU {{ $labels.uuid }} stopped updating{{ else }}"
                f"its samples are older than {stale}s{{{{ end }}}}: "
                "the sampling loop or an NVML call is stuck."
            ),
        ),
        alert(
            c,
            "GPUCollectorFailing",
            expr=f"max by ({_TARGET}, collector) ({held(c, collectors)}) == 0",
            severity="warning",
            layer="observability",
            fault_class="observability",
            target_kind="exporter",
            summary="A collector of the GPU exporter fails.",
            description=(
                "Collector {{ $labels.collector }} of gpupulse-exporter {{ $labels.instance }} on node "
                "{{ $labels.node }} has failed every sample; its metrics are missing or stale."
            ),
        ),
    )
    # GPUExporterDown's absent(up) asks whether the Prometheus evaluating it scrapes any exporter: on a
    # shard, whether the shard does, which is the shard's own question
    group = Group("gpupulse.observability", rules, scope="node", per_prometheus=("GPUExporterDown",))
    return RuleFile("observability", (group,))
