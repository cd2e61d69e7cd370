"""Serving: KV-cache hit ratio, batch latency, TTFT, inter-token latency, queue, tokens, energy and cost
per token, per model and GPU."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.promql import histogram_quantile_of
from alerts.rules.recording import (
    MODEL_COST_PER_MILLION_TOKENS,
    MODEL_ENERGY_PER_TOKEN,
    MODEL_GPUS,
    SM_ACTIVITY,
)
from dashboards.boards.annotations import ACTIONS, DIAGNOSES
from dashboards.boards.filters import NAMESPACE, NODE, POD, UIDS, serving_filters
from dashboards.grafana import Dashboard, Panel, Row, Target

SEL = f'{NODE}, {NAMESPACE}, {POD}, model=~"$model"'
MODEL = "{{namespace}}/{{model}}"
# the per-model recording rules keep namespace and model only
MODEL_SEL = f'{NAMESPACE}, model=~"$model"'


def quantile(histogram: str, q: float, by: str = "namespace, model") -> str:
    """histogram_quantile over the dashboard's filters, rated over $__rate_interval: from the classic
    buckets, or from the native histogram a converting Prometheus 3 stores instead."""
    return histogram_quantile_of(q, histogram, by, "$__rate_interval", SEL)


def _sum_rate(counter: str) -> str:
    return f"sum by (namespace, model) (rate({counter}{{{SEL}}}[$__rate_interval]))"


def _latency_panel(title: str, histogram: str, description: str = "") -> Panel:
    return Panel(
        title,
        "timeseries",
        "s",
        (
            Target(quantile(histogram, 0.5), MODEL + " p50"),
            Target(quantile(histogram, 0.99), MODEL + " p99"),
        ),
        description=description,
    )


def dashboard(c: RulesConfig) -> Dashboard:
    """The inference serving dashboard."""
    kv = Row(
        "KV cache",
        (
            Panel(
                "KV-cache hit ratio per model",
                "timeseries",
                "percentunit",
                (
                    Target(
                        _sum_rate("inference_kv_cache_hits_total")
                        + " / "
                        + _sum_rate("inference_kv_cache_queries_total"),
                        MODEL,
                    ),
                    Target(
                        f"avg by (namespace, model) (inference_kv_cache_hit_ratio{{{SEL}}})",
                        MODEL + " (engine ratio)",
                    ),
                ),
                min_value=0,
                max_value=1,
            ),
            Panel(
                "KV-cache hit ratio per pod",
                "timeseries",
                "percentunit",
                (
                    Target(
                        f"namespace_pod_model:inference_kv_cache_hit_ratio:rate{{{SEL}}}",
                        "{{pod}} {{model}} ({{source}})",
                    ),
                ),
                min_value=0,
                max_value=1,
            ),
            Panel(
                "KV-cache usage",
                "timeseries",
                "percentunit",
                (Target(f"inference_kv_cache_usage_ratio{{{SEL}}}", "{{pod}} {{model}}"),),
                min_value=0,
                max_value=1,
            ),
        ),
    )
    latency = Row(
        "Latency",
        (
            _latency_panel("Request latency", c.latency_histogram),
            _latency_panel(
                "Batch latency",
                "inference_batch_latency_seconds",
                "What 'batch' means differs per engine; see inference_batch_latency_source_info.",
            ),
            _latency_panel("Time to first token", "inference_time_to_first_token_seconds"),
            _latency_panel("Inter-token latency", "inference_inter_token_latency_seconds"),
        ),
    )
    # what the diagnosis reads first when latency rises with flat traffic (docs/design/diagnosis.md)
    explains = Row(
        "What explains latency",
        (
            Panel(
                "Host CPU of the GPU processes",
                "timeseries",
                "short",
                (
                    Target(
                        "sum by (namespace, pod) (rate(gpu_process_host_cpu_seconds_total"
                        f"{{{NODE}, {NAMESPACE}, {POD}}}[$__rate_interval]))",
                        "{{namespace}}/{{pod}}",
                    ),
                ),
                description="CPU cores. A model server pinned at one core while its GPU idles is starved "
                "by its host (GPUStarvedByHost).",
            ),
            Panel(
                "Model weights in the page cache",
                "timeseries",
                "percentunit",
                (Target(f"model_weights_page_cache_resident_ratio{{{SEL}}}", MODEL + " {{pod}}"),),
                min_value=0,
                max_value=1,
                description="Weights evicted from the page cache are read from disk again: the P99 spikes.",
            ),
        ),
    )
    queue = Row(
        "Queue and GPUs",
        (
            Panel(
                "Requests waiting and running",
                "timeseries",
                "none",
                (
                    Target(f"inference_requests_waiting{{{SEL}}}", "{{pod}} waiting"),
                    Target(f"inference_requests_running{{{SEL}}}", "{{pod}} running"),
                ),
            ),
            Panel(
                "SM activity of the engines' GPUs",
                "timeseries",
                "percentunit",
                (
                    Target(
                        f"{SM_ACTIVITY} * on(uuid) group_left(namespace, pod, model) "
                        f"group by (uuid, namespace, pod, model) (inference_engine_gpu_info{{{SEL}}})",
                        "{{pod}} GPU {{gpu}}",
                    ),
                ),
                min_value=0,
                max_value=1,
            ),
            Panel(
                "Engines up",
                "state-timeline",
                "none",
                (Target(f"inference_engine_up{{{SEL}}}", "{{namespace}}/{{pod}} {{engine}}"),),
            ),
            Panel(
                "Cold start", "table", "s", (Target(f"inference_cold_start_seconds{{{NAMESPACE}, {POD}}}"),)
            ),
        ),
    )
    tokens = Row(
        "Tokens, energy and cost",
        (
            Panel(
                "Tokens per second",
                "timeseries",
                "short",
                (
                    Target(_sum_rate("inference_generation_tokens_total"), MODEL + " generated"),
                    Target(_sum_rate("inference_prompt_tokens_total"), MODEL + " prompt"),
                ),
                description="inference_*_tokens_total per model; engines without token counters are absent.",
            ),
            Panel(
                "Energy per generated token",
                "timeseries",
                "joule",
                (Target(f"{MODEL_ENERGY_PER_TOKEN}{{{MODEL_SEL}}}", MODEL),),
                description="GPU energy of the model's GPUs (split by its pods' shares) per generated token.",
            ),
            Panel(
                f"GPU cost per million generated tokens ({c.cost.currency})",
                "timeseries",
                "currencyUSD" if c.cost.currency == "USD" else "short",
                (Target(f"{MODEL_COST_PER_MILLION_TOKENS}{{{MODEL_SEL}}}", MODEL),),
                description="GPU-hours the model holds at the rules' price over its generated tokens; "
                "a tensor-parallel engine counts all of its GPUs.",
            ),
            Panel(
                "GPUs per model",
                "timeseries",
                "short",
                (Target(f"{MODEL_GPUS}{{{MODEL_SEL}}}", MODEL),),
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["serving"],
        title="gpupulse / Inference serving",
        description="KV cache, latency, queue, GPU activity, tokens and cost per token of inference engines.",
        rows=(kv, latency, explains, queue, tokens),
        variables=serving_filters(),
        links=tuple(UIDS.values()),
        annotations=(DIAGNOSES, ACTIONS),
    )
