"""Specs of the engines collector: inference engines normalized per model and GPU."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, counter, gauge, histogram, info

# Identity of one engine: engine kind, served model, owning pod and the GPU(s) it runs on
# (sorted comma-joined lists for a multi-GPU engine).
ENGINE_LABELS: tuple[str, ...] = ("engine", "model", "namespace", "pod", "gpu", "uuid")
# One scrape target; `endpoint` is scheme://host:port/path so static entries without a pod stay apart.
ENDPOINT_LABELS: tuple[str, ...] = ("engine", "namespace", "pod", "endpoint")

_C = "engines"

ENGINE_UP = gauge(
    "inference_engine_up",
    "",
    "1 when the last scrape of this inference-engine endpoint succeeded and parsed, else 0.",
    _C,
    (*ENGINE_LABELS, "endpoint"),
)
ENGINE_GPU_INFO = info(
    "inference_engine_gpu_info",
    "One row per GPU an inference engine runs on (gpu/uuid hold a single GPU here), for joins.",
    _C,
    ENGINE_LABELS,
)
ENGINE_SCRAPE_FAILURES_TOTAL = counter(
    "inference_engine_scrape_failures_total",
    "",
    "Failed scrapes of an engine endpoint by reason (timeout, refused, network, http_status, "
    "too_large, parse, unknown_engine, no_metrics, normalize).",
    _C,
    (*ENDPOINT_LABELS, "reason"),
)
ENGINE_DOWN_REASON = gauge(
    "inference_engine_down_reason",
    "",
    "1 while the last scrape of an engine endpoint failed, with why (the reasons of "
    "inference_engine_scrape_failures_total); absent while it succeeds.",
    _C,
    (*ENDPOINT_LABELS, "reason"),
)
ENGINE_SCRAPE_PARTIAL_TOTAL = counter(
    "inference_engine_scrape_partial_total",
    "",
    "Scrapes of an engine endpoint that used only part of the page: too_large (reading stopped at "
    "--engines.max-response-bytes), too_many_samples (parsing stopped at "
    "--engines.max-samples-per-endpoint), malformed (families dropped for a malformed line).",
    _C,
    (*ENDPOINT_LABELS, "reason"),
)
ENGINE_SCRAPE_DURATION_SECONDS = gauge(
    "inference_engine_scrape_duration_seconds",
    "seconds",
    "Wall time of the last scrape of an engine endpoint, fetch and parse.",
    _C,
    ENDPOINT_LABELS,
)
KV_CACHE_HITS_TOTAL = counter(
    "inference_kv_cache_hits_total",
    "",
    "Prefix/KV-cache hits in `unit` (tokens or blocks) as counted by the engine.",
    _C,
    (*ENGINE_LABELS, "unit"),
)
KV_CACHE_QUERIES_TOTAL = counter(
    "inference_kv_cache_queries_total",
    "",
    "Prefix/KV-cache lookups in `unit` (tokens or blocks); hit ratio = rate(hits)/rate(queries).",
    _C,
    (*ENGINE_LABELS, "unit"),
)
PROMPT_TOKENS_TOTAL = counter(
    "inference_prompt_tokens_total",
    "",
    "Prompt (prefill input) tokens the engine processed, cached or computed; counted at the engine's "
    "own point (vLLM per step, SGLang/trtllm-serve per finished request, TGI at validation, Triton "
    "TRT-LLM per response).",
    _C,
    ENGINE_LABELS,
)
GENERATION_TOKENS_TOTAL = counter(
    "inference_generation_tokens_total",
    "",
    "Tokens the engine generated (output tokens); the denominator of energy and cost per token.",
    _C,
    ENGINE_LABELS,
)
KV_CACHE_HIT_RATIO = gauge(
    "inference_kv_cache_hit_ratio",
    "ratio",
    "KV-cache hit ratio passed through from engines that only expose a ratio gauge (0-1).",
    _C,
    ENGINE_LABELS,
)
KV_CACHE_USAGE_RATIO = gauge(
    "inference_kv_cache_usage_ratio",
    "ratio",
    "Share of the engine's KV-cache capacity in use (0-1).",
    _C,
    ENGINE_LABELS,
)
BATCH_LATENCY_SECONDS = histogram(
    "inference_batch_latency_seconds",
    "seconds",
    "Engine step (batch) latency by phase (prefill, decode, or mixed where the engine does not split "
    "steps); inference_batch_latency_source_info names the source metric and whether it is a proxy.",
    _C,
    (*ENGINE_LABELS, "phase"),
)
BATCH_SIZE_TOKENS = histogram(
    "inference_batch_size_tokens",
    "",
    "Tokens scheduled per engine step (vLLM's iteration_tokens_total).",
    _C,
    ENGINE_LABELS,
)
BATCH_LATENCY_SOURCE_INFO = info(
    "inference_batch_latency_source_info",
    "Which engine metric feeds inference_batch_latency_seconds and whether it is a proxy.",
    _C,
    ("engine", "source", "proxy"),
)
REQUESTS_RUNNING = gauge(
    "inference_requests_running",
    "",
    "Requests in the engine's running batch.",
    _C,
    ENGINE_LABELS,
)
REQUESTS_WAITING = gauge(
    "inference_requests_waiting",
    "",
    "Requests queued in the engine, not yet scheduled.",
    _C,
    ENGINE_LABELS,
)
TIME_TO_FIRST_TOKEN_SECONDS = histogram(
    "inference_time_to_first_token_seconds",
    "seconds",
    "Time from request arrival to the first output token.",
    _C,
    ENGINE_LABELS,
)
INTER_TOKEN_LATENCY_SECONDS = histogram(
    "inference_inter_token_latency_seconds",
    "seconds",
    "Time between consecutive output tokens of a request.",
    _C,
    ENGINE_LABELS,
)
REQUEST_LATENCY_SECONDS = histogram(
    "inference_request_latency_seconds",
    "seconds",
    "End-to-end request latency as measured by the engine.",
    _C,
    ENGINE_LABELS,
)
REQUEST_QUEUE_TIME_SECONDS = histogram(
    "inference_request_queue_time_seconds",
    "seconds",
    "Time a request waited in the engine's queue before it was first scheduled.",
    _C,
    ENGINE_LABELS,
)
COLD_START_SECONDS = gauge(
    "inference_cold_start_seconds",
    "seconds",
    "Time from the engine process start to its first successful scrape.",
    _C,
    ("engine", "model", "namespace", "pod"),
)

ENGINE_METRICS: tuple[MetricSpec, ...] = (
    ENGINE_UP,
    ENGINE_GPU_INFO,
    ENGINE_SCRAPE_FAILURES_TOTAL,
    ENGINE_DOWN_REASON,
    ENGINE_SCRAPE_PARTIAL_TOTAL,
    ENGINE_SCRAPE_DURATION_SECONDS,
    KV_CACHE_HITS_TOTAL,
    KV_CACHE_QUERIES_TOTAL,
    KV_CACHE_HIT_RATIO,
    PROMPT_TOKENS_TOTAL,
    GENERATION_TOKENS_TOTAL,
    KV_CACHE_USAGE_RATIO,
    BATCH_LATENCY_SECONDS,
    BATCH_SIZE_TOKENS,
    BATCH_LATENCY_SOURCE_INFO,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    TIME_TO_FIRST_TOKEN_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS,
    REQUEST_LATENCY_SECONDS,
    REQUEST_QUEUE_TIME_SECONDS,
    COLD_START_SECONDS,
)
