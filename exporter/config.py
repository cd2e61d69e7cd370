"""Exporter settings: one place for defaults, units in names."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

DEFAULT_PORT = 9842  # free of dcgm-exporter 9400, nvidia_gpu_exporter 9835, mindprince 9445


@dataclass(frozen=True)
class ExporterSettings:
    """Everything the CLI can set; see docs/design/exporter.md for why the defaults are what they are."""

    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    sampling_interval_seconds: float = 1.0
    # Deadline for one GPU's calls of one collector in one tick; a slower call marks the GPU stale.
    gpu_call_timeout_seconds: float = 0.5
    # A collector round that exceeds this is cancelled and reported as failed (unless the collector
    # declares a longer deadline_seconds of its own, above the deadlines inside its round).
    collector_timeout_seconds: float = 2.0
    # How long a tick waits for a round of a collector on its own interval (the plug-ins); a round
    # still running then goes on beside the ticks, which serve its last families meanwhile, so one
    # slow engine endpoint or hung /proc read never delays the GPU series.
    slow_collector_wait_seconds: float = 0.1
    # /readyz fails when the last good sample is older than this many intervals.
    ready_max_age_intervals: float = 3.0
    # Fields that change slowly (ECC and remap counters, NVLink link states, power limit, PCIe link
    # and replays) are read this often; between reads the last values are served (0: every tick).
    slow_fields_interval_seconds: float = 10.0
    # Window for the first process-utilization read; later reads continue from the last sample seen.
    process_sample_window_seconds: float = 1.0
    xid_wait_timeout_ms: int = 500
    simulate: str | None = None
    simulate_speed: float = 1.0
    log_format: str = "text"
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.sampling_interval_seconds <= 0:
            raise ValueError("sampling interval must be > 0")
        if self.gpu_call_timeout_seconds <= 0:
            raise ValueError("GPU call timeout must be > 0")


def parse_listen_address(value: str) -> tuple[str, int]:
    """Split host:port (IPv6 in brackets); raises ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {value!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port {number} out of range")
    return host, number


def exporter_version() -> str:
    """The installed gpupulse version."""
    try:
        return importlib.metadata.version("gpupulse")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"
