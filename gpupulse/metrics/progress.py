"""Specs of the progress collector: the step counter a training job already prints or serves."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, counter, gauge

_C = "progress"

# one series per container of a rank pod that gave a step (the job's rank 0 is often the only one)
PROGRESS_LABELS: tuple[str, ...] = (
    "namespace",
    "pod",
    "container",
    "training_job_kind",
    "training_job",
    "rank",
    "source",
)

GPU_TRAINING_PROGRESS_STEPS_TOTAL = counter(
    "gpu_training_progress_steps_total",
    "",
    "The last training step a job's container gave: its log's step lines (source `log`: Megatron-LM, "
    "DeepSpeed, torchtitan, tqdm bars of Lightning and HF Trainer) or the counter its pod's "
    "gpupulse.io/progress-metric annotation names (source `metric`); a restarted rank starts lower "
    "(a counter reset).",
    _C,
    PROGRESS_LABELS,
)

GPU_TRAINING_PROGRESS_LAST_STEP_TIMESTAMP_SECONDS = gauge(
    "gpu_training_progress_last_step_timestamp_seconds",
    "seconds",
    "Unix time at which the step last changed: the container runtime's timestamp of the log line, or "
    "the scrape that first saw the metric's new value (the exporter's start for a value it never saw "
    "change).",
    _C,
    PROGRESS_LABELS,
)

GPU_TRAINING_PROGRESS_UPDATE_INTERVAL_SECONDS = gauge(
    "gpu_training_progress_update_interval_seconds",
    "seconds",
    "Median time between the last changes of the step (at most 9): how often this job shows progress "
    "(a step time, or log_every_n_steps of them); absent until the step changed twice.",
    _C,
    PROGRESS_LABELS,
)

PROGRESS_READ_ERRORS_TOTAL = counter(
    "gpupulse_progress_read_errors_total",
    "",
    "Progress reads that failed, by source and reason (log: missing, unreadable, timeout, oversized; "
    "metric: timeout, refused, http_status, network, parse, no_metric).",
    _C,
    ("source", "reason"),
)

PROGRESS_METRICS: tuple[MetricSpec, ...] = (
    GPU_TRAINING_PROGRESS_STEPS_TOTAL,
    GPU_TRAINING_PROGRESS_LAST_STEP_TIMESTAMP_SECONDS,
    GPU_TRAINING_PROGRESS_UPDATE_INTERVAL_SECONDS,
    PROGRESS_READ_ERRORS_TOTAL,
)
