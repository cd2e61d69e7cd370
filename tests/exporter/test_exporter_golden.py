"""Golden /metrics per scenario at fixed scenario times, and `promtool check metrics` on each.

Regenerate after an intended change: GPUPULSE_UPDATE_GOLDEN=1 pytest tests/exporter -k golden
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

from demo.neighbours import line as neighbour_line
from tests.exporter.harness import normalise, simulated_exporter

GOLDEN = Path(__file__).parent / "golden"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exporter"
UPDATE = os.environ.get("GPUPULSE_UPDATE_GOLDEN") == "1"

# (golden name, scenario name or path, scenario times of the ticks; the last one is the snapshot)
CASES = [
    ("basic", "basic", (29.0, 30.0)),
    ("mixed-fleet", "mixed-fleet", (29.0, 30.0)),
    ("mig", "mig", (29.0, 30.0)),
    ("faults", "faults", (14.0, 19.0, 24.0, 25.0)),  # XIDs at 15-16, GPU 1 lost at 20, GPU 2 hung from 10
    ("thermal", "thermal", (59.0, 60.0)),
    ("fixture-failures", str(FIXTURES / "failures.yaml"), (4.0, 21.0, 25.0)),
    ("fixture-mig", str(FIXTURES / "mig.yaml"), (9.0, 10.0)),
]


async def _render(scenario: str, times: tuple[float, ...]) -> str:
    async with simulated_exporter(scenario, start_seconds=times[0]) as h:
        await h.tick(0)  # GPM baseline
        for previous, t in itertools.pairwise(times):
            await h.tick(t - previous)
        return normalise(h.text())


@pytest.mark.parametrize(("golden", "scenario", "times"), CASES, ids=[c[0] for c in CASES])
async def test_metrics_match_golden_file(golden: str, scenario: str, times: tuple[float, ...]) -> None:
    text = await _render(scenario, times)
    path = GOLDEN / f"{golden}.prom"
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"{path} missing: run with GPUPULSE_UPDATE_GOLDEN=1 to create it")
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} drifted; rerun with GPUPULSE_UPDATE_GOLDEN=1 if intended"


@pytest.mark.integration
@pytest.mark.parametrize("golden", [c[0] for c in CASES])
def test_golden_file_passes_promtool(golden: str) -> None:
    text = (GOLDEN / f"{golden}.prom").read_text()
    # promtool needs numbers where the golden files hold placeholders
    text = text.replace("<duration>", "0.001").replace("<timestamp>", "1.8e+09")
    result = subprocess.run(
        [neighbour_line().promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
