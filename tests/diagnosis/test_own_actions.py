"""The diagnosis discounts what the controller itself did (issue 40): in an XID 13 restart loop the only
process change in the window is the one our own restart made, and the page after it must not name
"serving: restart or rollout (cold start)" as the cause, as the demo did. The controller runs on a
fake clock with a scripted backend; Prometheus is a fake range client whose series follow the backend:
the pod's GPU process count rises a minute after our restart, its engine reports a cold start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import remediation.engine
import remediation.runner
from remediation.diagnosis.prom import RangeSeries
from remediation.model import ActionResult, Target
from remediation.settings import EngineSettings, ScopeSettings
from tests.fakes.clock import FakeClock
from tests.remediation.test_engine_support import Rig, ScriptedBackend

# a team's restart-then-page ladder for the XID 13 class (the shipped one migrates in between)
RESTART_THEN_PAGE = """
signatures:
  - name: xid13-restart-then-page
    description: Restart the engine on an application XID; page when it comes back.
    fault_class: xid_app
    priority: 100
    match: {alertname: [GPUXidAppError]}
    ladder: {rungs: [restart, page], attempts: {restart: 1}, verify_window_seconds: 300,
             resolution_verifies: []}
    restart_fixes: true
    reason: The team's choice.
"""
XID13 = {
    "alertname": "GPUXidAppError",
    "severity": "warning",
    "layer": "hardware",
    "fault_class": "xid_app",
    "target_kind": "pod",
    "namespace": "chat",
    "pod": "llama-0",
    "node": "gpu-node-1",
    "uuid": "GPU-d2a1",
    "gpu": "0",
    "xid": "13",
}


class TimedBackend(ScriptedBackend):
    """Records when each action ran, on the rig's clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.at: list[float] = []

    async def restart(self, target: Target, reason: str) -> ActionResult:
        self.at.append(self.clock.time())
        return await super().restart(target, reason)


class AfterOurRestart:
    """Prometheus as it looks after our restart: a new GPU process 60 s after it (two PIDs seen in
    the last 10 min), a 40 s cold start measured 90 s after it; nothing else has data."""

    def __init__(self, backend: TimedBackend) -> None:
        self.backend = backend

    async def query_range(
        self, query: str, start: float, end: float, step_seconds: float
    ) -> list[RangeSeries]:
        if not self.backend.at:
            restart = float("inf")
        else:
            restart = self.backend.at[0]
        if "count_over_time(gpu_process_memory_used_bytes" in query:
            before, after, at = 1.0, 2.0, restart + 60
        elif "inference_cold_start_seconds" in query:
            before, after, at = 0.0, 40.0, restart + 90
        else:
            return []
        points = []
        t = start
        while t <= end:
            points.append((t, after if t >= at else before))
            t += step_seconds
        return [RangeSeries({}, points)]


def _rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    sig_dir = tmp_path / "signatures"
    sig_dir.mkdir()
    (sig_dir / "user.yaml").write_text(RESTART_THEN_PAGE)
    settings = EngineSettings(
        scope=ScopeSettings(namespaces=("chat",)),
        signature_dirs=(sig_dir,),
        prometheus_url="http://prometheus.invalid",
    )
    clock = FakeClock()
    backend = TimedBackend(clock)
    monkeypatch.setattr(remediation.engine, "PrometheusRangeClient", lambda *a, **k: AfterOurRestart(backend))
    rig = Rig(tmp_path, settings, clock=clock, backend=backend)
    rig.build()
    return rig


async def _restart_loop(rig: Rig) -> dict[str, Any]:
    ev = await rig.fire(XID13)
    assert rig.backend.rungs == ["restart"]
    # the XID's event window passes, then the new process hits XID 13 again: the ladder pages
    await rig.resolve(ev)
    rig.clock.advance(120)
    await rig.fire(XID13, fingerprint=ev.fingerprint)
    assert rig.backend.rungs == ["restart"]
    inc = dict(rig.only_incident())
    assert inc["state"] == "paged", inc["state"]
    return inc


async def test_our_own_restart_is_never_the_cause_named_for_its_restart_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = _rig(tmp_path, monkeypatch)
    try:
        inc = await _restart_loop(rig)
        (page,) = rig.pager.pages
        assert "| diagnosis: serving: restart or rollout" not in page.summary
        assert page.summary.endswith(
            "| diagnosis: no diagnosis: no candidate signal changed to a fault level in line with the "
            "symptom's onset but what our own actions brought about (restart or rollout (cold start): "
            "our restart at 2026-05-28T20:26:40+00:00)"
        )
        latest = inc["diagnosis"]
        assert latest["top_cause"] is None
        (ours,) = [c for c in latest["rejected"] if c["cause"] == "serving.rollout"]
        assert ours["caused_by_us"] == "our restart at 2026-05-28T20:26:40+00:00"
        assert "not a cause" in latest["layers"]["serving"]
    finally:
        await rig.engine.aclose()


async def test_without_the_ledger_s_actions_the_same_series_name_a_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the series alone line up as a rollout; only the ledger tells it was ours."""
    monkeypatch.setattr(remediation.runner, "own_actions", lambda history: ())
    rig = _rig(tmp_path, monkeypatch)
    try:
        inc = await _restart_loop(rig)
        assert inc["diagnosis"]["top_cause"] == "serving.rollout"
        (page,) = rig.pager.pages
        assert "| diagnosis: serving: restart or rollout (cold start)" in page.summary
    finally:
        await rig.engine.aclose()
