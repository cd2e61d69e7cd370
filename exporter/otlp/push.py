"""Optional OTLP/HTTP push of every snapshot, through opentelemetry-sdk's exporter, off the scrape path."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import MetricExportResult
from opentelemetry.sdk.resources import Resource
from prometheus_client.core import Metric

from exporter.config import exporter_version
from exporter.errors import OtlpConfigError
from exporter.otlp.convert import UCUM, to_metrics_data
from gpupulse.clock import Clock, SystemClock
from gpupulse.durations import duration_flag
from gpupulse.metrics.catalog import EXPORTER_SPECS
from gpupulse.metrics.spec import MetricSpec

log = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
# OpenTelemetry's namespace for UUIDv5 service.instance.id values (semantic conventions, service).
SERVICE_INSTANCE_NAMESPACE = uuid.UUID("4d63009a-8d0f-11ee-aad7-4c796ed8e320")


def catalog_units(specs: Sequence[MetricSpec]) -> dict[str, str]:
    """Family name (as prometheus_client names it: counters without _total) -> UCUM unit."""
    return {spec.name.removesuffix("_total"): UCUM[spec.unit] for spec in specs if spec.unit in UCUM}


@dataclass(frozen=True)
class OtlpSettings:
    endpoint: str  # base URL (…:4318) or the full …/v1/metrics URL
    interval_seconds: float = 30.0  # at most one push per interval; 0 pushes every snapshot
    headers: tuple[tuple[str, str], ...] = ()
    timeout_seconds: float = 10.0
    service_name: str = "gpupulse-exporter"
    node_name: str = ""  # the Kubernetes node (NODE_NAME); empty off Kubernetes
    pod_name: str = ""  # this exporter's pod and namespace (POD_NAME, POD_NAMESPACE), when known
    pod_namespace: str = ""

    @property
    def metrics_url(self) -> str:
        """The URL the exporter POSTs to."""
        base = self.endpoint.rstrip("/")
        return base if base.endswith(METRICS_PATH) else base + METRICS_PATH


@dataclass
class PushStats:
    pushes: int = 0
    failures: int = 0
    skipped_in_flight: int = 0


def resource_attributes(settings: OtlpSettings, hostname: str | None = None) -> dict[str, str]:
    """Who is pushing: service, host and Kubernetes node, and an instance id that stays the same
    across restarts of the exporter on one node (a UUIDv5 of service and node, as the semantic
    conventions recommend), so a backend joins every push of a node into one series."""
    host = settings.node_name or hostname or socket.gethostname()
    attributes = {
        "service.name": settings.service_name,
        "service.version": exporter_version(),
        "service.instance.id": str(uuid.uuid5(SERVICE_INSTANCE_NAMESPACE, f"{settings.service_name}@{host}")),
        "host.name": host,
    }
    if settings.node_name:
        attributes["k8s.node.name"] = settings.node_name
    if settings.pod_name:
        attributes["k8s.pod.name"] = settings.pod_name
    if settings.pod_namespace:
        attributes["k8s.namespace.name"] = settings.pod_namespace
    return attributes


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """`k=v,k2=v2` as in OTEL_EXPORTER_OTLP_HEADERS."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OtlpConfigError(f"--otlp.headers entry {item!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return tuple(out)


class OtlpPusher:
    """Converts the latest families and exports them in a thread; never blocks or stacks pushes."""

    def __init__(
        self, settings: OtlpSettings, clock: Clock | None = None, exporter: OTLPMetricExporter | None = None
    ) -> None:
        self.settings = settings
        self.stats = PushStats()
        self._clock = clock or SystemClock()
        self._exporter = exporter or OTLPMetricExporter(
            endpoint=settings.metrics_url, headers=dict(settings.headers), timeout=settings.timeout_seconds
        )
        # OTEL_RESOURCE_ATTRIBUTES (e.g. k8s.cluster.name=east) adds to these; ours win on a clash
        self._resource = Resource.create(dict(resource_attributes(settings)))
        self._units = catalog_units(EXPORTER_SPECS)
        self._start_ns = time.time_ns()  # start of every cumulative series that has no _created
        self._last_push: float | None = None
        self._in_flight = False

    async def push(self, families: Sequence[Metric]) -> None:
        """Export one snapshot unless the interval has not passed or a push is still running."""
        now = self._clock.monotonic()
        if self._last_push is not None and now - self._last_push < self.settings.interval_seconds:
            return
        if self._in_flight:
            self.stats.skipped_in_flight += 1
            return
        self._last_push = now
        data, convert_stats = to_metrics_data(
            families, self._resource, self._start_ns, time.time_ns(), self._units
        )
        if convert_stats.skipped:
            log.debug("OTLP: no mapping for %s", ", ".join(convert_stats.skipped))
        timeout_ms = self.settings.timeout_seconds * 1000

        def export() -> MetricExportResult:
            try:
                return self._exporter.export(data, timeout_millis=timeout_ms)
            finally:
                self._in_flight = False

        self._in_flight = True
        try:
            result = await asyncio.wait_for(asyncio.to_thread(export), self.settings.timeout_seconds + 5.0)
        except TimeoutError:
            result = MetricExportResult.FAILURE
        self.stats.pushes += 1
        if result is not MetricExportResult.SUCCESS:
            self.stats.failures += 1
            log.warning("OTLP push to %s failed", self.settings.metrics_url)

    async def close(self) -> None:
        """Shut the exporter's HTTP session down."""
        await asyncio.to_thread(self._exporter.shutdown)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the --otlp.* flags on exporter-core's parser."""
    d = OtlpSettings(endpoint="")
    group = parser.add_argument_group("OTLP push (optional)")
    group.add_argument(
        "--otlp.endpoint",
        dest="otlp_endpoint",
        default="",
        help="OTLP/HTTP receiver, e.g. http://otel-collector:4318; empty turns push off",
    )
    group.add_argument(
        "--otlp.interval",
        dest="otlp_interval",
        type=duration_flag,
        default=d.interval_seconds,
        help="minimum seconds between pushes (default: %(default)s)",
    )
    group.add_argument(
        "--otlp.headers",
        dest="otlp_headers",
        default="",
        help="extra HTTP headers, k=v,k2=v2 (e.g. authorization)",
    )
    group.add_argument(
        "--otlp.node-name",
        dest="otlp_node_name",
        default=os.environ.get("NODE_NAME", ""),
        help="Kubernetes node, for the k8s.node.name and host.name resource attributes (default: $NODE_NAME)",
    )
    group.add_argument(
        "--otlp.timeout",
        dest="otlp_timeout",
        type=duration_flag,
        default=d.timeout_seconds,
        help="seconds per push, retries included (default: %(default)s)",
    )


def from_args(args: argparse.Namespace) -> OtlpPusher | None:
    """Build the pusher; None unless --otlp.endpoint is set."""
    if not args.otlp_endpoint:
        return None
    settings = OtlpSettings(
        endpoint=args.otlp_endpoint,
        interval_seconds=args.otlp_interval,
        headers=parse_headers(args.otlp_headers),
        timeout_seconds=args.otlp_timeout,
        node_name=args.otlp_node_name,
        pod_name=_env("POD_NAME"),
        pod_namespace=_env("POD_NAMESPACE"),
    )
    return OtlpPusher(settings)


def _env(name: str, environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(name, "").strip()
