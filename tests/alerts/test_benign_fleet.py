"""A benign fleet raises no page and at most one warning per 1,000 GPU-days (issue 40's targets).

The short benign fleet (benign-short.fleet.yaml: 16 GPUs for 10 h, every benign event of the bench's
72-hour fleets once) is played through the exporter's collectors on the simulated NVML in virtual
time and the shipped rules run on every scrape in promtool 3.16 (bench/benign_fleet.py). At 6.7
GPU-days a single warning is already over the target: the assertion is "none". The bench's full
fleets and their table are in docs/alerts.md, "Benign fleets"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.benign.fleet import load_fleet
from bench.benign.report import Row, totals
from bench.benign_fleet import Result, run_fleet

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # 10 s of exporter rounds and 30 s of promtool alone; minutes at load 8 on two shared cores
    pytest.mark.timeout(900),
]

FLEET = Path(__file__).resolve().parent / "benign-short.fleet.yaml"
INTERVAL_SECONDS = 60.0


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Result:
    return run_fleet(load_fleet(str(FLEET)), INTERVAL_SECONDS, tmp_path_factory.mktemp("benign"))


def _describe(table: list[Row]) -> str:
    return "; ".join(f"{r.alertname} ({r.severity}, {r.kind}) x{r.firings}" for r in table) or "nothing fired"


def test_the_rules_saw_every_pod_and_job_of_the_benign_fleet(replay: Result) -> None:
    # quiet because nothing fired, not because the rules never saw the workloads
    assert replay.seen["allocated GPUs"] == 16
    assert replay.seen["training jobs"] == 1
    assert replay.seen["GPUs with SM activity"] == 16


def test_a_benign_fleet_pages_nobody_and_warns_at_most_once_per_1000_gpu_days(replay: Result) -> None:
    got = totals(replay.table, replay.gpu_days)
    assert got["page"] == 0, _describe(replay.table)
    assert got["warning"] <= 1.0, _describe(replay.table)
