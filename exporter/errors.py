"""Every exception the exporter raises, in one place (the shape of httpx's `_exceptions.py`).

    ExporterError
    ├── NvmlError                  an NVML call failed (`code`: the nvmlReturn_t)
    │   ├── GpuLostError           the GPU fell off the bus: the GPU is reported lost
    │   ├── NotSupportedError      this GPU or driver lacks the feature: never asked again
    │   ├── NvmlUnknownError       NVML_ERROR_UNKNOWN (GSP timeout, lost device cgroup)
    │   └── NvmlUnavailableError   no NVML library or driver on this host
    ├── NvmlInitError              nvmlInit failed: the exporter exits so it is restarted
    ├── DeadlineExceededError      a call on one GPU did not return in time (that GPU goes stale)
    ├── GpuStaleError              a stale GPU is not asked again until its late call returns
    ├── CollectorError             one collector's round failed (reported, never fatal)
    │   └── PartialCollectorError  ... but the families it carries are still true and are served
    ├── ConfigError                the engines config file is unreadable or malformed
    ├── OtlpConfigError            a malformed --otlp.* flag (also a ValueError, as argparse wants)
    ├── WebConfigError             --web.config.file cannot be used (also a ValueError)
    ├── ScrapeError                one engine endpoint's scrape failed (`reason`: the counter label)
    ├── HttpError                  an endpoint broke HTTP/1.1 or went away mid-answer (wire/http1.py)
    │   └── HttpConnectError       no connection: refused, unreachable, TLS handshake failed
    ├── ExpositionError            an engine's payload is not a Prometheus text exposition
    ├── KubeError                  a LIST or WATCH of the API server failed (`status`: its HTTP status)
    │   ├── Expired                410 Gone: only a new LIST helps
    │   └── WatchSilentError       a watch sent no byte for too long: only a new WATCH tells
    ├── PodResourcesError          the kubelet's pod-resources API could not be asked
    ├── PodResourcesDecodeError    its answer is not a ListPodResourcesResponse
    ├── MincoreError               mmap or mincore failed for a weight file (also an OSError)
    └── simulator (exporter/sim, behind --simulate and the demo):
        ├── ScenarioError          a scenario file is missing, unreadable or invalid (ValueError)
        ├── SimSpecError           a scenario's `engines` section is invalid (ValueError)
        ├── PageCacheScenarioError its `page_cache` section is invalid (ValueError)
        ├── InterventionError      a demo intervention names no such process or GPU (ValueError)
        ├── SimAlreadyInstalledError  a second simulation in one process (RuntimeError)
        └── ReleasedError          the simulation was uninstalled while a call was blocked in it

Temporary outcomes (DeadlineExceededError, GpuStaleError, ScrapeError, KubeError, PodResourcesError,
CollectorError) are retried on the next round; permanent ones (NotSupportedError, ConfigError,
OtlpConfigError, WebConfigError, ScenarioError) are reported once and not retried.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric


class ExporterError(Exception):
    """The root of every exception the exporter defines."""


# ---- NVML ----------------------------------------------------------------------------------------
class NvmlError(ExporterError):
    """An NVML call failed; `code` is the nvmlReturn_t (0 when unknown)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class GpuLostError(NvmlError):
    """The GPU fell off the bus or is otherwise inaccessible (NVML_ERROR_GPU_IS_LOST)."""


class NotSupportedError(NvmlError):
    """The GPU, driver or OS lacks this feature; ask again never."""


class NvmlUnknownError(NvmlError):
    """NVML_ERROR_UNKNOWN: GSP timeouts, or a container that lost its device cgroup."""


class NvmlUnavailableError(NvmlError):
    """No NVML library or no loaded driver on this host."""


class NvmlInitError(ExporterError):
    """nvmlInit failed; `unknown` is True for NVML_ERROR_UNKNOWN (lost device cgroup in a container)."""

    def __init__(self, message: str, unavailable: bool, unknown: bool) -> None:
        super().__init__(message)
        self.unavailable, self.unknown = unavailable, unknown


class DeadlineExceededError(ExporterError):
    """A call on one GPU did not return within its deadline."""


class GpuStaleError(ExporterError):
    """The GPU still has a call past its deadline; it is not queried again until that returns."""


# ---- collectors ----------------------------------------------------------------------------------
class CollectorError(ExporterError):
    """A collector could not produce its families this round; it is reported, not fatal.

    `families` carries what is still true despite the failure (e.g. allocations from the last
    good kubelet answer): the sampler serves them while reporting the round as failed.
    """

    def __init__(self, message: str, families: Sequence[Metric] = ()) -> None:
        super().__init__(message)
        self.families: Sequence[Metric] = families


class PartialCollectorError(CollectorError):
    """The round failed (success 0), but these families are still true and may be served.

    The sampler serves a failed round's `families`, so a kubelet restart does not blank allocation
    rows and CPU counters.
    """

    def __init__(self, message: str, families: Sequence[Metric]) -> None:
        super().__init__(message, families)


# ---- configuration -------------------------------------------------------------------------------
class ConfigError(ExporterError):
    """The engines config file is unreadable or malformed."""


class WebConfigError(ExporterError, ValueError):
    """The --web.config.file file cannot be used; the message names the file and the key."""


class OtlpConfigError(ExporterError, ValueError):
    """A malformed --otlp.* flag."""


# ---- engines -------------------------------------------------------------------------------------
class ScrapeError(ExporterError):
    """A failed scrape; `reason` is the failure counter's label value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class HttpError(ExporterError):
    """The server broke HTTP/1.1 (a malformed status line, header or body) or went away mid-answer."""


class HttpConnectError(HttpError):
    """No connection could be made (refused, unreachable, TLS handshake failed)."""


class ExpositionError(ExporterError):
    """The payload is not a Prometheus text exposition."""


class KubeError(ExporterError):
    """A LIST or WATCH of the API server could not be made or decoded; `status` is the HTTP status
    (0 when none came), `retry_after_seconds` the server's Retry-After (0 when none)."""

    def __init__(self, message: str, status: int = 0, retry_after_seconds: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.retry_after_seconds = status, retry_after_seconds


class Expired(KubeError):
    """410: the API server no longer has the resourceVersion; only a new LIST helps."""


class WatchSilentError(KubeError):
    """A watch sent no byte (not even a BOOKMARK) for too long: a dead connection or a quiet server,
    which only a new WATCH tells apart."""


# ---- attribution and page cache ------------------------------------------------------------------
class PodResourcesError(ExporterError):
    """The kubelet could not be asked (socket missing, RPC failed, answer undecodable)."""


class PodResourcesDecodeError(ExporterError):
    """The kubelet answered with bytes that are not a ListPodResourcesResponse."""


class MincoreError(ExporterError, OSError):
    """mmap or mincore failed for a file."""


# ---- simulator -----------------------------------------------------------------------------------
class ScenarioError(ExporterError, ValueError):
    """A scenario file is missing, unreadable or invalid; the message names file and field."""

    def __init__(self, source: str, field_path: str, problem: str) -> None:
        self.source = source
        self.field_path = field_path
        self.problem = problem
        where = f"{source}: {field_path}" if field_path else source
        super().__init__(f"{where}: {problem}")


class SimSpecError(ExporterError, ValueError):
    """The engines section is malformed."""


class PageCacheScenarioError(ExporterError, ValueError):
    """The `page_cache` section is malformed."""


class InterventionError(ExporterError, ValueError):
    """The process or GPU named does not exist in the simulation."""


class SimAlreadyInstalledError(ExporterError, RuntimeError):
    """Another SimulatedNvml is installed; uninstall it first."""


class ReleasedError(ExporterError):
    """The simulation was uninstalled while a call was blocked in it."""
