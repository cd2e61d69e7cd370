"""Specs of the engines collector: inference engines normalized per model and GPU."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec

# Identity of one engine: engine kind, served model, owning pod and the GPU(s) it runs on
# (sorted comma-joined lists for a multi-GPU engine).
ENGINE_LABELS: tuple[str, ...] = ("engine", "model", "namespace", "pod", "gpu", "uuid")
# One scrape target; `endpoint` is scheme://host:port/path so static entries without a pod stay apart.
ENDPOINT_LABELS: tuple[str, ...] = ("engine", "namespace", "pod", "endpoint")

_C = "engines"

ENGINE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "inference_engine_up",
        "gauge",
        "",
        (*ENGINE_LABELS, "endpoint"),
        "1 when the last scrape of this inference-engine endpoint succeeded and parsed, else 0.",
        _C,
    ),
    MetricSpec(
        "inference_engine_gpu_info",
        "info",
        "",
        ENGINE_LABELS,
        "One row per GPU an inference engine runs on (gpu/uuid hold a single GPU here), for joins.",
        _C,
    ),
    MetricSpec(
        "inference_engine_scrape_failures_total",
        "counter",
        "",
        (*ENDPOINT_LABELS, "reason"),
        "Failed scrapes of an engine endpoint by reason (timeout, refused, network, http_status, "
        "too_large, parse, unknown_engine, no_metrics, normalize).",
        _C,
    ),
    MetricSpec(
        "inference_engine_down_reason",
        "gauge",
        "",
        (*ENDPOINT_LABELS, "reason"),
        "1 while the last scrape of an engine endpoint failed, with why (the reasons of "
        "inference_engine_scrape_failures_total); absent while it succeeds.",
        _C,
    ),
    MetricSpec(
        "inference_engine_scrape_partial_total",
        "counter",
        "",
        (*ENDPOINT_LABELS, "reason"),
        "Scrapes of an engine endpoint that used only part of the page: too_large (reading stopped at "
        "--engines.max-response-bytes), too_many_samples (parsing stopped at "
        "--engines.max-samples-per-endpoint), malformed (families dropped for a malformed line).",
        _C,
    ),
    MetricSpec(
        "inference_engine_scrape_duration_seconds",
        "gauge",
        "seconds",
        ENDPOINT_LABELS,
        "Wall time of the last scrape of an engine endpoint, fetch and parse.",
        _C,
    ),
    MetricSpec(
        "inference_kv_cache_hits_total",
        "counter",
        "",
        (*ENGINE_LABELS, "unit"),
        "Prefix/KV-cache hits in `unit` (tokens or blocks) as counted by the engine.",
        _C,
    ),
    MetricSpec(
        "inference_kv_cache_queries_total",
        "counter",
        "",
        (*ENGINE_LABELS, "unit"),
        "Prefix/KV-cache lookups in `unit` (tokens or blocks); hit ratio = rate(hits)/rate(queries).",
        _C,
    ),
    MetricSpec(
        "inference_kv_cache_hit_ratio",
        "gauge",
        "ratio",
        ENGINE_LABELS,
        "KV-cache hit ratio passed through from engines that only expose a ratio gauge (0-1).",
        _C,
    ),
    MetricSpec(
        "inference_kv_cache_usage_ratio",
        "gauge",
        "ratio",
        ENGINE_LABELS,
        "Share of the engine's KV-cache capacity in use (0-1).",
        _C,
    ),
    MetricSpec(
        "inference_batch_latency_seconds",
        "histogram",
        "seconds",
        (*ENGINE_LABELS, "phase"),
        "Engine step (batch) latency by phase (prefill, decode, or mixed where the engine does not "
        "split steps); inference_batch_latency_source_info names the source metric and whether it "
        "is a proxy.",
        _C,
    ),
    MetricSpec(
        "inference_batch_size_tokens",
        "histogram",
        "",
        ENGINE_LABELS,
        "Tokens scheduled per engine step (vLLM's iteration_tokens_total).",
        _C,
    ),
    MetricSpec(
        "inference_batch_latency_source_info",
        "info",
        "",
        ("engine", "source", "proxy"),
        "Which engine metric feeds inference_batch_latency_seconds and whether it is a proxy.",
        _C,
    ),
    MetricSpec(
        "inference_requests_running",
        "gauge",
        "",
        ENGINE_LABELS,
        "Requests in the engine's running batch.",
        _C,
    ),
    MetricSpec(
        "inference_requests_waiting",
        "gauge",
        "",
        ENGINE_LABELS,
        "Requests queued in the engine, not yet scheduled.",
        _C,
    ),
    MetricSpec(
        "inference_time_to_first_token_seconds",
        "histogram",
        "seconds",
        ENGINE_LABELS,
        "Time from request arrival to the first output token.",
        _C,
    ),
    MetricSpec(
        "inference_inter_token_latency_seconds",
        "histogram",
        "seconds",
        ENGINE_LABELS,
        "Time between consecutive output tokens of a request.",
        _C,
    ),
    MetricSpec(
        "inference_request_latency_seconds",
        "histogram",
        "seconds",
        ENGINE_LABELS,
        "End-to-end request latency as measured by the engine.",
        _C,
    ),
    MetricSpec(
        "inference_request_queue_time_seconds",
        "histogram",
        "seconds",
        ENGINE_LABELS,
        "Time a request waited in the engine's queue before it was first scheduled.",
        _C,
    ),
    MetricSpec(
        "inference_cold_start_seconds",
        "gauge",
        "seconds",
        ("engine", "model", "namespace", "pod"),
        "Time from the engine process start to its first successful scrape.",
        _C,
    ),
)
