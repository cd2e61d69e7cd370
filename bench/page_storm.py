"""Page storm: how many pages a storm of N alerts sends, with the page budget and without it.

Three payload shapes, each N alerts spread over `--seconds` (simulated time, ticked every second) and
an hour of quiet after, through the real engine (in process, its own SQLite file) with a pager that
records:
  1. XID 79 in Alertmanager's plain shape, from rules that are not ours: no target_kind, no fault_class
     (the controller cannot name a target, so every incident pages);
  2. a page-only serving alert of ours (InferenceLatencyP99Spike) on N pods;
  3. our own GPUFellOffBus on N nodes (gpu targets: migrate; the node budget opens the breaker).
The baseline is the same run with the page budget out of reach (what the controller did before).

    .venv/bin/python -m bench.page_storm [--alerts 1000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from gpupulse.clock import Clock
from remediation.engine import RemediationEngine, build_engine
from remediation.metrics import RemediationMetrics
from remediation.model import ActionResult, AlertEvent, Page, Target
from remediation.settings import EngineSettings, ScopeSettings


class SimClock(Clock):
    """Simulated clock: the storm's minutes pass in milliseconds (the loop below moves `t`)."""

    def __init__(self) -> None:
        self.t = 1_780_000_000.0

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)
        await asyncio.sleep(0)


class CountingPager:
    """Records every page send (first sends, updates and resolves)."""

    name = "counting"

    def __init__(self) -> None:
        self.pages: list[Page] = []

    async def send(self, page: Page) -> None:
        self.pages.append(page)


class DoneBackend:
    """Every action succeeds at once."""

    name = "done"

    async def restart(self, target: Target, reason: str) -> ActionResult:
        return ActionResult(True, "restarted")

    async def migrate(self, target: Target, reason: str) -> ActionResult:
        return ActionResult(True, "migrated")


def plain_xid79(i: int) -> dict[str, str]:
    return {"alertname": "GpuXidError", "severity": "critical", "xid": "79", "gpu": "0", "node": f"n{i:05d}"}


def serving_latency(i: int) -> dict[str, str]:
    return {
        "alertname": "InferenceLatencyP99Spike",
        "severity": "warning",
        "layer": "serving",
        "fault_class": "serving_latency",
        "target_kind": "pod",
        "namespace": "llm",
        "pod": f"vllm-{i:05d}",
        "model": "llama",
    }


def our_fell_off_bus(i: int) -> dict[str, str]:
    return {
        "alertname": "GPUFellOffBus",
        "severity": "critical",
        "layer": "hardware",
        "fault_class": "gpu_lost",
        "target_kind": "gpu",
        "node": f"n{i:05d}",
        "uuid": f"GPU-{i:05d}",
        "gpu": "0",
    }


SHAPES: Mapping[str, Callable[[int], dict[str, str]]] = {
    "XID 79, plain shape (foreign rule)": plain_xid79,
    "page-only serving alert on pods": serving_latency,
    "GPUFellOffBus (ours, gpu target)": our_fell_off_bus,
}


@dataclass
class StormPages:
    """What one storm sent."""

    incidents: int
    sends: int  # every call to the pager
    incident_pages: int  # distinct incidents paged on their own
    summary_keys: int  # distinct summary pages
    breaker_keys: int  # distinct breaker group pages
    actions: int


async def storm(
    shape: Callable[[int], dict[str, str]], alerts: int, seconds: float, budget: bool
) -> StormPages:
    clock = SimClock()
    pager = CountingPager()
    metrics = RemediationMetrics()
    # the storms' pod alerts spread over many namespaces: every one is in scope
    settings = EngineSettings(scope=ScopeSettings(namespaces=("*",)))
    if not budget:
        settings = dataclasses.replace(
            settings,
            budgets=dataclasses.replace(
                settings.budgets, max_pages_per_window=10**9, max_pages_per_signature=10**9
            ),
        )
    with tempfile.TemporaryDirectory(prefix="gpupulse-page-storm-") as tmp:
        engine = cast(
            RemediationEngine,
            build_engine(settings, Path(tmp) / "gpupulse.db", metrics, clock, DoneBackend(), pager),
        )
        step = seconds / alerts
        next_tick = clock.t + 1.0
        for i in range(alerts):
            now = clock.utcnow()
            await engine.handle(AlertEvent(f"fp{i}", "firing", shape(i), {}, now, None, "", "am", "{}", now))
            clock.t += step
            if clock.t >= next_tick:
                await engine.tick()
                next_tick += 1.0
        for _ in range(3600):  # an hour after the storm: updates and retries have their chance
            clock.t += 1.0
            await engine.tick()
        await engine.wait_idle()
        incidents = len(engine.list_incidents(limit=10_000))
        await engine.aclose()
    keys = {p.dedup_key for p in pager.pages}
    actions = sum(
        metrics.registry.get_sample_value(
            "gpupulse_remediation_actions_total", {"rung": rung, "outcome": "success"}
        )
        or 0.0
        for rung in ("restart", "migrate")
    )
    return StormPages(
        incidents=incidents,
        sends=len(pager.pages),
        incident_pages=len({k for k in keys if k.startswith("gpupulse-incident-")}),
        summary_keys=len({k for k in keys if k.startswith("gpupulse-summary-")}),
        breaker_keys=len({k for k in keys if k.startswith("gpupulse-breaker-")}),
        actions=int(actions),
    )


async def main_async(alerts: int, seconds: float) -> None:
    print(f"\nPage storm: {alerts} alerts over {seconds:.0f} s (simulated), default budgets")
    print(
        "| shape | budget | incidents | pages sent | incidents paged alone | summary pages | breaker pages "
        "| actions | sent vs baseline |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, shape in SHAPES.items():
        base = await storm(shape, alerts, seconds, budget=False)
        with_budget = await storm(shape, alerts, seconds, budget=True)
        for label, r in (("none (baseline)", base), ("on", with_budget)):
            ratio = r.sends / base.sends if base.sends else 0.0
            print(
                f"| {name} | {label} | {r.incidents} | {r.sends} | {r.incident_pages} | {r.summary_keys} "
                f"| {r.breaker_keys} | {r.actions} | {ratio:.3f} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--alerts", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    logging.disable(logging.ERROR)  # the breaker's log lines would interleave with the table
    asyncio.run(main_async(args.alerts, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
