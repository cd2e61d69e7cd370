"""Settings of the engines collector: one place where defaults live, units in field names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EngineSettings:
    """Scrape behaviour of the engines collector."""

    interval_seconds: float = 5.0
    scrape_timeout_seconds: float = 2.0
    max_response_bytes: int = 4 * 1024 * 1024
    max_series: int = 10_000  # all endpoints together
    max_series_per_endpoint: int = 2_000
    # Samples of mapped families kept from one page; parsing stops past it (a page of 80k series
    # would otherwise cost tens of MiB). A vLLM with ten models keeps about 3,000.
    max_samples_per_endpoint: int = 10_000
    procfs_path: Path = Path("/proc")
    # Resolving an engine's PID from its port scans /proc; after a miss, wait this long to retry.
    pid_retry_seconds: float = 60.0
    clock_ticks_per_second: int | None = None  # /proc/<pid>/stat time unit; None = sysconf(SC_CLK_TCK)
    procfs_timeout_seconds: float = 1.0  # one round's /proc lookups together
    procfs_item_timeout_seconds: float = 0.25  # one endpoint's lookup; a hung one is set aside
    source_timeout_seconds: float = 0.5  # a target source still answering keeps its last list

    @property
    def round_deadline_seconds(self) -> float:
        """Above every deadline inside a round: targets, then scrapes beside the /proc lookups."""
        inner = max(self.scrape_timeout_seconds, self.procfs_timeout_seconds)
        return self.source_timeout_seconds + inner + 1.0
