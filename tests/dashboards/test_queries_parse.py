"""Every query of the committed dashboards, panels and annotations, with Grafana's variables filled as
for "All", goes through the real promtool's parser on both Prometheus lines (a missing promtool fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.alerts.panel_queries import panel_queries
from tests.alerts.promtool_parse import check_queries, promtools
from tests.dashboards.test_dashboards_lint import committed


def _queries() -> dict[str, str]:
    out = {f"dashboard:panel:q{i}": q.expr for i, q in enumerate(panel_queries(rate_interval="1m"))}
    for board in committed().values():
        uid = board["uid"].replace("-", "_")
        for i, a in enumerate(board["annotations"]["list"]):
            out[f"dashboard:{uid}:annotation{i}"] = a["expr"].replace("$cluster", ".*")
    return out


@pytest.mark.parametrize("promtool", promtools())
def test_every_dashboard_query_parses_in_promtool(promtool: str, tmp_path: Path) -> None:
    queries = _queries()
    assert len(queries) >= 90  # every panel target and annotation of the four boards
    result = check_queries(promtool, queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


@pytest.mark.parametrize("promtool", promtools())
def test_the_parse_check_catches_a_broken_query(promtool: str, tmp_path: Path) -> None:
    # the board's join with a parenthesis lost, as a hand edit of the JSON would leave it
    broken = "1000 * max by (incident) (a * on(instance, incident) group_left(signature) b"
    result = check_queries(promtool, {"dashboard:panel:broken": broken}, tmp_path)
    assert result.returncode == 1
    assert '"dashboard:panel:broken": could not parse expression' in result.stdout + result.stderr
