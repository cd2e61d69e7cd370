"""Serving alerts: latency spikes, KV-cache drops, growing queues, host starvation, page-cache eviction."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.common import alert, held
from alerts.rules.model import Group, RuleFile
from alerts.rules.promql import num
from alerts.rules.recording import KV_HIT_RATIO_POD, SM_ACTIVITY, latency_quantile_name

_POD_TEXT = "Pod {{ $labels.namespace }}/{{ $labels.pod }}"
_MODEL_TEXT = _POD_TEXT + " (model {{ $labels.model }})"


def serving_file(c: RulesConfig) -> RuleFile:
    """alerts/serving.rules.yaml."""
    t, w = c.thresholds, c.windows
    p99 = latency_quantile_name("namespace_pod_model", c.latency_histogram, "p99")
    p50 = latency_quantile_name("namespace_pod_model", c.latency_histogram, "p50")

    def baseline(series: str) -> str:
        return f"avg_over_time({series}[{w.baseline}] offset {w.baseline_offset})"

    waiting = "inference_requests_waiting"
    rules = (
        alert(
            c,
            "InferenceLatencyP99Spike",
            # The seed's signature: the tail jumps while the median does not, so the cause is an
            # occasional stall (weights re-read from disk, a GC, a noisy neighbour), not load.
            expr=f"""
                {p99} > {num(t.latency_min_seconds)}
                and
                {p99} > {num(t.latency_spike_factor)} * {baseline(p99)}
                and on(namespace, pod, model)
                {p50} < {num(t.latency_median_tolerance_factor)} * {baseline(p50)}
                """,
            severity="warning",
            layer="serving",
            fault_class="serving_latency",
            target_kind="pod",
            summary="Inference P99 latency spiked while the median stayed normal.",
            description=(
                f"{_MODEL_TEXT} has a P99 request latency of {{{{ $value | humanizeDuration }}}}, more than "
                f"{num(t.latency_spike_factor)}x its average over the {w.baseline} before, while its "
                "median is unchanged. Look for stalls outside the GPU: page cache, disk, host CPU."
            ),
            # its recorded quantiles read rate() windows, which a missed scrape does not empty; an
            # engine or exporter restart's first evaluations may still lack them
            keep_firing_for=w.stale_hold,
        ),
        alert(
            c,
            "KVCacheHitRateDrop",
            expr=f"""
                {held(c, KV_HIT_RATIO_POD)}
                < (1 - {num(t.kv_cache_drop_fraction)}) * {baseline(KV_HIT_RATIO_POD)}
                and
                {baseline(KV_HIT_RATIO_POD)} > {num(t.kv_cache_baseline_min_ratio)}
                """,
            severity="warning",
            layer="serving",
            fault_class="kv_cache",
            target_kind="pod",
            summary="The KV-cache hit ratio of an inference engine dropped.",
            description=(
                f"{_MODEL_TEXT} hits its KV cache for {{{{ $value | humanizePercentage }}}} of lookups, "
                f"{{{{ {num(t.kv_cache_drop_fraction)} | humanizePercentage }}}} or more below its "
                f"average over the {w.baseline} before. Prefill work and time to first token go up."
            ),
        ),
        alert(
            c,
            "InferenceQueueGrowing",
            expr=f"""
                max by (node, namespace, pod, model) ({held(c, waiting)}) > {num(t.queue_waiting_requests)}
                and on(namespace, pod, model)
                max by (namespace, pod, model) (deriv({waiting}[{w.queue_trend}])) > 0
                """,
            severity="warning",
            layer="serving",
            fault_class="serving_latency",
            target_kind="pod",
            summary="Requests queue up in an inference engine.",
            description=(
                f"{_MODEL_TEXT} has {{{{ $value }}}} requests waiting and the queue kept growing over "
                f"{w.queue_trend}. The engine cannot keep up with its traffic."
            ),
        ),
        alert(
            c,
            "GPUStarvedByHost",
            # Seed 2.1: the GPU idles and latency climbs because the serving process is stuck on one
            # host core (single-threaded preprocessing). The value is that process's CPU, in cores.
            expr=f"""
                max by (node, namespace, pod, uuid, gpu) (
                  rate(gpu_process_host_cpu_seconds_total{{pod!=""}}[{w.rate}])
                ) >= {num(t.starved_host_cpu_cores)}
                and on(uuid)
                ({held(c, SM_ACTIVITY)} < {num(t.starved_sm_activity_ratio)})
                and on(namespace, pod)
                (
                  max by (namespace, pod) ({held(c, waiting)}) >= {num(t.starved_queue_waiting_requests)}
                  or on(namespace, pod)
                  max by (namespace, pod) ({p99} > {num(t.starved_latency_factor)} * {baseline(p99)})
                )
                """,
            severity="warning",
            layer="serving",
            fault_class="host_starvation",
            target_kind="pod",
            summary="A GPU is starved by its serving process's host CPU.",
            description=(
                f'{_POD_TEXT} keeps a host CPU core busy ({{{{ $value | printf "%.2f" }}}} cores) while '
                "its GPU {{ $labels.gpu }} on node {{ $labels.node }} is mostly idle and requests wait "
                "or slow down. The bottleneck is on the host (preprocessing, tokenisation, GIL), not the GPU."
            ),
        ),
        alert(
            c,
            "ModelWeightsEvictedFromPageCache",
            expr=f"""
                min by (node, namespace, pod, model) (
                  min_over_time(model_weights_page_cache_resident_ratio[{w.residency_dip}])
                ) < {num(t.page_cache_resident_low_ratio)}
                and on(namespace, pod, model)
                max by (namespace, pod, model) (
                  max_over_time(model_weights_page_cache_resident_ratio[{w.residency_lookback}])
                ) >= {num(t.page_cache_resident_high_ratio)}
                """,
            severity="warning",
            layer="serving",
            fault_class="page_cache_eviction",
            target_kind="pod",
            summary="Model weights were evicted from the page cache.",
            description=(
                f"Only {{{{ $value | humanizePercentage }}}} of the weights of model {{{{ $labels.model }}}} "
                "(pod {{ $labels.namespace }}/{{ $labels.pod }}) on node {{ $labels.node }} stayed in the "
                "page cache, down from at least "
                f"{{{{ {num(t.page_cache_resident_high_ratio)} | humanizePercentage }}}} within "
                f"{w.residency_lookback}. Reloads read from disk and show up as P99 latency spikes."
            ),
        ),
    )
    return RuleFile("serving", (Group("gpupulse.serving", rules, scope="node"),))
