"""Shared helpers of the engine tests (no tests here): a scripted backend, event builders, a rig."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from remediation.engine import RemediationEngine, build_engine
from remediation.metrics import RemediationMetrics
from remediation.model import ActionResult, AlertEvent, Target
from remediation.settings import EngineSettings, ScopeSettings
from remediation.signatures import SignatureLibrary
from tests.fakes.clock import FakeClock
from tests.fakes.pager_sink import RecordingPager

LEAK = {
    "alertname": "GPUProcessMemoryAboveHardLimit",
    "severity": "critical",
    "layer": "serving",
    "fault_class": "memory_leak",
    "target_kind": "pod",
    "namespace": "llm",
    "pod": "vllm-7d9f8b6c5d-x2x4z",
    "node": "node-a",
    "uuid": "GPU-aaaa",
}
CORRUPT_MODEL = {
    "alertname": "InferenceModelLoadFailed",
    "severity": "critical",
    "layer": "serving",
    "fault_class": "model_artifact",
    "target_kind": "pod",
    "namespace": "llm",
    "pod": "tgi-5f6d7c8b9d-q2w4r",
    "node": "node-a",
}
XID_RESET = {
    "alertname": "GPUXidResetRequired",
    "severity": "critical",
    "layer": "hardware",
    "fault_class": "xid_reset",
    "xid": "48",
    "target_kind": "gpu",
    "node": "node-b",
    "uuid": "GPU-bbbb",
    "gpu": "1",
}

_fp = itertools.count(1)

# the namespace the builders' pod alerts name; an empty scope acts on no pod, so the rigs name it
NAMESPACE = "llm"
SCOPE = ScopeSettings(namespaces=(NAMESPACE,))


def engine_settings(**fields: Any) -> EngineSettings:
    """EngineSettings whose scope is the builders' namespace unless `scope` is given."""
    fields.setdefault("scope", SCOPE)
    return EngineSettings(**fields)


def pod(labels: Mapping[str, str], name: str, namespace: str = NAMESPACE) -> dict[str, str]:
    """The same alert about another pod."""
    return {**labels, "pod": name, "namespace": namespace}


class ScriptedBackend:
    """ActionBackend that records calls, can raise scripted errors and can block until released."""

    name = "scripted"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Target]] = []
        self.errors: dict[str, list[Exception]] = {}
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()  # set when any action starts (await it instead of sleeping)

    @property
    def rungs(self) -> list[str]:
        return [rung for rung, _ in self.calls]

    async def restart(self, target: Target, reason: str) -> ActionResult:
        return await self._act("restart", target)

    async def migrate(self, target: Target, reason: str) -> ActionResult:
        return await self._act("migrate", target)

    async def _act(self, rung: str, target: Target) -> ActionResult:
        self.calls.append((rung, target))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        queued = self.errors.get(rung)
        if queued:
            raise queued.pop(0)
        return ActionResult(done=True, summary=f"{rung} done", details={"target": target.key})


@dataclass
class Rig:
    """One engine on a temp database with a fake clock, scripted backend, recording pager and spans."""

    tmp_path: Path
    settings: EngineSettings
    clock: FakeClock = field(default_factory=FakeClock)
    backend: ScriptedBackend = field(default_factory=ScriptedBackend)
    pager: RecordingPager = field(default_factory=RecordingPager)
    metrics: RemediationMetrics = field(default_factory=RemediationMetrics)
    spans: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    library: SignatureLibrary | None = None
    engine: RemediationEngine = field(init=False)

    @property
    def db_path(self) -> Path:
        return self.tmp_path / "gpupulse.db"

    def build(self) -> RemediationEngine:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.engine = cast(
            RemediationEngine,
            build_engine(
                self.settings,
                self.db_path,
                self.metrics,
                clock=self.clock,
                backend=self.backend,
                pager=self.pager,
                tracer_provider=provider,
                library=self.library,
            ),
        )
        return self.engine

    async def restart_controller(self, backend: ScriptedBackend | None = None) -> RemediationEngine:
        """Drop the engine (in-flight work is abandoned, as in a crash) and build a new one on the same DB."""
        await self.engine.aclose(grace_seconds=0)
        self.backend = backend or ScriptedBackend()
        self.metrics = RemediationMetrics()
        return self.build()

    def event(
        self,
        labels: Mapping[str, str],
        status: str = "firing",
        *,
        fingerprint: str = "",
        starts_at: float = 0.0,
        annotations: Mapping[str, str] | None = None,
    ) -> AlertEvent:
        now = self.clock.utcnow()
        return AlertEvent(
            fingerprint=fingerprint or f"fp{next(_fp)}",
            status=cast(Any, status),
            labels=dict(labels),
            annotations=dict(annotations or {}),
            starts_at=datetime.fromtimestamp(starts_at, tz=UTC) if starts_at else now,
            ends_at=None,
            generator_url="http://prometheus/graph",
            receiver="gpupulse",
            group_key="{}:{}",
            received_at=now,
        )

    async def fire(self, labels: Mapping[str, str], **kw: Any) -> AlertEvent:
        ev = self.event(labels, **kw)
        await self.engine.handle(ev)
        await self.engine.wait_idle()
        return ev

    async def resolve(self, ev: AlertEvent) -> AlertEvent:
        res = replace(ev, status="resolved", received_at=self.clock.utcnow())
        await self.engine.handle(res)
        await self.engine.wait_idle()
        return res

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.engine.tick()
        await self.engine.wait_idle()

    def incidents(self, state: str | None = None) -> list[Mapping[str, Any]]:
        return list(self.engine.list_incidents(state))

    def only_incident(self) -> Mapping[str, Any]:
        found = self.incidents()
        assert len(found) == 1, found
        inc = self.engine.get_incident(int(found[0]["id"]))
        assert inc is not None
        return inc

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def finished_spans(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())


def statuses(incident: Mapping[str, Any], kind: str = "action") -> list[tuple[str, str]]:
    """(rung, status) of the incident's ledger entries of one kind."""
    return [(h["rung"], h["status"]) for h in incident["history"] if h["kind"] == kind]


def events(incident: Mapping[str, Any]) -> list[str]:
    return [h["status"] for h in incident["history"] if h["kind"] == "event"]
