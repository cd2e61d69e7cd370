"""One OpenTelemetry trace per incident: a root span for the incident and a child span per rung.

The root span lives in memory from open to close; its ids are stored with the incident, so rung
spans (created when a rung concludes, with the rung's recorded start time) stay in the same trace
even after a controller restart. A root span open during a restart is lost; its children remain.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

AttrValue = str | int | float | bool


def make_provider(service_name: str, otlp_traces_endpoint: str) -> TracerProvider:
    """A provider with OTLP/HTTP export when an endpoint is configured, otherwise recording nowhere."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp_traces_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_traces_endpoint)))
    return provider


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class IncidentTracer:
    """Creates the incident and rung spans; thread-safe (the engine decides on a worker thread)."""

    def __init__(self, provider: TracerProvider, owned: bool = False) -> None:
        self.provider = provider
        self.owned = owned  # created by build_engine: flushed and shut down with the engine
        self._tracer = provider.get_tracer("gpupulse.remediation")
        self._roots: dict[int, trace.Span] = {}
        self._lock = threading.Lock()

    def open_incident(self, incident_id: int, at: float, attrs: Mapping[str, AttrValue]) -> tuple[str, str]:
        """Start the root span; returns (trace_id, span_id) as hex for the ledger."""
        span = self._tracer.start_span(
            f"incident {attrs.get('signature', '')}", start_time=_ns(at), attributes=dict(attrs)
        )
        with self._lock:
            self._roots[incident_id] = span
        ctx = span.get_span_context()
        return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")

    def rung(
        self,
        trace_id: str,
        span_id: str,
        name: str,
        start: float,
        end: float,
        attrs: Mapping[str, AttrValue],
    ) -> None:
        """Record one finished rung as a child of the incident's root span."""
        if not trace_id:
            return
        parent = SpanContext(
            trace_id=int(trace_id, 16),
            span_id=int(span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        ctx = trace.set_span_in_context(NonRecordingSpan(parent))
        span = self._tracer.start_span(name, context=ctx, start_time=_ns(start), attributes=dict(attrs))
        span.end(end_time=_ns(max(start, end)))

    def shutdown(self) -> None:
        """Flush and stop the provider if this tracer created it."""
        if self.owned:
            self.provider.shutdown()

    def close_incident(self, incident_id: int, at: float, attrs: Mapping[str, AttrValue]) -> None:
        """End the root span, if this process still holds it."""
        with self._lock:
            span = self._roots.pop(incident_id, None)
        if span is not None:
            span.set_attributes(dict(attrs))
            span.end(end_time=_ns(at))
