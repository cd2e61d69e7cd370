"""Specs of the attribution collector: kubelet allocations, host CPU of GPU processes, dropped series."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, counter, gauge, info

_C = "attribution"

GPU_ALLOCATION_INFO = info(
    "gpu_allocation_info",
    "A GPU or MIG device the kubelet allocated to a pod container (present even when idle); "
    "one row per pod when several pods share a GPU.",
    _C,
    ("uuid", "gpu", "mig_uuid", "namespace", "pod", "container", "resource"),
)

GPU_PROCESS_HOST_CPU_SECONDS_TOTAL = counter(
    "gpu_process_host_cpu_seconds_total",
    "seconds",
    "Host CPU time (user + system) consumed by a process that uses the GPU, from /proc/<pid>/stat.",
    _C,
    ("uuid", "gpu", "pid", "namespace", "pod", "container"),
)

_PROCESS_LABELS = ("uuid", "gpu", "pid", "namespace", "pod", "container")

GPU_PROCESS_IO_READ_BYTES_TOTAL = counter(
    "gpu_process_io_read_bytes_total",
    "bytes",
    "Bytes read through system calls (files on any filesystem, network filesystems, pipes, sockets) by "
    "a process that uses the GPU: rchar of /proc/<pid>/io, all threads; absent where io is unreadable.",
    _C,
    _PROCESS_LABELS,
)

GPU_PROCESS_IO_WRITE_BYTES_TOTAL = counter(
    "gpu_process_io_write_bytes_total",
    "bytes",
    "Bytes written through system calls (a checkpoint to local disk, NFS or an object store alike) by a "
    "process that uses the GPU: wchar of /proc/<pid>/io, all threads; absent where io is unreadable.",
    _C,
    _PROCESS_LABELS,
)

# the bounded values of gpu_process_state{state} (/proc/<pid>/stat's letter by name; exporter/host/procfs.py)
PROCESS_STATE_NAMES: tuple[str, ...] = (
    "running",
    "sleeping",
    "disk_sleep",
    "stopped",
    "zombie",
    "idle",
    "other",
)

GPU_PROCESS_STATE = gauge(
    "gpu_process_state",
    "",
    "1 for the scheduler state a process that uses the GPU is in (/proc/<pid>/stat field 3), 0 for the "
    "others: running, sleeping, disk_sleep (uninterruptible, e.g. a hung mount), stopped, zombie, idle, "
    "other.",
    _C,
    (*_PROCESS_LABELS, "state"),
)

GPU_TRAINING_RANK_INFO = info(
    "gpu_training_rank_info",
    "A GPU held by one rank of a training job: the job from the pod's controller or JobSet/LWS label "
    "(training_job_kind is Kind.group, or `torchrun` with the job named MASTER_ADDR:MASTER_PORT for a "
    "process without a pod), the rank from the process's RANK/LOCAL_RANK/WORLD_SIZE or the pod's index "
    "label; one series per rank and GPU.",
    _C,
    (
        "uuid",
        "gpu",
        "namespace",
        "pod",
        "training_job_kind",
        "training_job",
        "rank",
        "local_rank",
        "world_size",
    ),
)

# Written by every collector with a cardinality cap (attribution and engines); listed here, where
# it was first declared, so docs/metrics.md keeps its place.
SERIES_DROPPED_TOTAL = counter(
    "gpupulse_series_dropped_total",
    "",
    "Series a collector did not export because a cardinality cap was reached.",
    _C,
    ("collector",),
)

ATTRIBUTION_METRICS: tuple[MetricSpec, ...] = (
    GPU_ALLOCATION_INFO,
    GPU_PROCESS_HOST_CPU_SECONDS_TOTAL,
    GPU_PROCESS_IO_READ_BYTES_TOTAL,
    GPU_PROCESS_IO_WRITE_BYTES_TOTAL,
    GPU_PROCESS_STATE,
    GPU_TRAINING_RANK_INFO,
    SERIES_DROPPED_TOTAL,
)
