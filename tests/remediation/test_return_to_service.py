"""The engine's return to service: a device quarantine's resolved alert starts a validation, a
temporary answer asks again on the timer, and only a pass closes the incident `returned`."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from remediation.engine import RemediationEngine, build_engine
from remediation.errors import TemporaryError
from remediation.metrics import RemediationMetrics
from remediation.model import ActionResult, AlertEvent, Target
from remediation.settings import EngineSettings
from tests.fakes.clock import FakeClock
from tests.fakes.pager_sink import RecordingPager

LABELS = {
    "alertname": "GPUXidResetRequired",
    "severity": "critical",
    "layer": "hardware",
    "fault_class": "xid_reset",
    "target_kind": "gpu",
    "node": "gpu-1",
    "uuid": "GPU-3",
    "xid": "48",
}


class QuarantiningBackend:
    """Quarantines one device on migrate; its validations answer from `verdicts`, in order."""

    name = "stub"

    def __init__(self, verdicts: list[str]) -> None:
        self.verdicts = verdicts
        self.validations: list[tuple[str, int, int]] = []

    async def restart(self, target: Target, reason: str) -> ActionResult:
        raise AssertionError("a reset-class XID is never restarted")

    async def migrate(self, target: Target, reason: str) -> ActionResult:
        return ActionResult(True, "tainted one device", {"quarantine": "device", "left": "undo: kubectl ..."})

    async def return_to_service(
        self, target: Target, fault_class: str, incident_id: int, attempt: int
    ) -> ActionResult:
        self.validations.append((fault_class, incident_id, attempt))
        verdict = self.verdicts.pop(0)
        if verdict == "temporary":
            raise TemporaryError("the API server is unavailable", 30.0)
        return ActionResult(verdict == "pass", f"validation {verdict}", {"passed": verdict == "pass"})


def _event(clock: FakeClock, status: str = "firing") -> AlertEvent:
    return AlertEvent(
        fingerprint="fp-48",
        status=status,  # type: ignore[arg-type]
        labels=dict(LABELS),
        annotations={},
        starts_at=datetime.fromtimestamp(clock.time(), tz=UTC),
        ends_at=None,
        generator_url="",
        receiver="gpupulse",
        group_key="{}:{}",
        received_at=clock.utcnow(),
    )


async def test_a_temporary_answer_is_asked_again_and_only_a_pass_returns(tmp_path: Path) -> None:
    clock = FakeClock()
    backend = QuarantiningBackend(["temporary", "pass"])
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(return_to_service=True),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=clock,
            backend=backend,
            pager=RecordingPager(),
        ),
    )
    await engine.handle(_event(clock))
    await engine.wait_idle()
    clock.advance(60)
    await engine.handle(replace(_event(clock), status="resolved"))
    await engine.wait_idle()
    (incident,) = engine.list_incidents()
    assert incident["state"] == "validating"
    assert backend.validations == [("xid_reset", int(incident["id"]), 1)]

    clock.advance(31)  # past the temporary answer's delay: the timer asks again, same attempt
    await engine.tick()
    await engine.wait_idle()
    (incident,) = engine.list_incidents()
    assert incident["state"] == "closed" and incident["resolution"] == "returned"
    assert backend.validations[-1] == ("xid_reset", int(incident["id"]), 1)
    full = engine.get_incident(int(incident["id"]))
    assert full is not None
    events = [h["status"] for h in full["history"] if h["kind"] == "event"]
    assert events.index("validation_started") < events.index("validation_retry") < events.index("returned")
    await engine.aclose()


async def test_a_node_quarantine_is_never_validated_away(tmp_path: Path) -> None:
    clock = FakeClock()
    backend = QuarantiningBackend(["pass"])

    async def cordon(target: Target, reason: str) -> ActionResult:
        return ActionResult(True, "cordoned gpu-1", {"cordoned": True, "left": "undo: kubectl uncordon"})

    backend.migrate = cordon  # type: ignore[method-assign]
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(return_to_service=True),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=clock,
            backend=backend,
            pager=RecordingPager(),
        ),
    )
    await engine.handle(_event(clock))
    await engine.wait_idle()
    clock.advance(60)
    await engine.handle(replace(_event(clock), status="resolved"))
    await engine.wait_idle()
    (incident,) = engine.list_incidents()
    assert incident["resolution"] == "human" and backend.validations == []
    await engine.aclose()
