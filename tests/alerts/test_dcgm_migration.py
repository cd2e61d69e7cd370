"""docs/dcgm-migration.md: every DCGM field a migrating user asks about has a row, every side-by-side
query parses in the real promtool, every gpupulse series it names exists, and its comparison rules
load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alerts.rules.promql import base_metric, metric_names
from demo.neighbours import DEBIAN
from tests.alerts.promtool_parse import check_queries, check_rule_text, fenced_blocks, promtools
from tests.alerts.ruleset import ROOT, known_metrics

PAGE = ROOT / "docs" / "dcgm-migration.md"
# dcgm-exporter's default counters and the fields migrating users ask for first
ASKED = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
)


def _rows() -> list[list[str]]:
    """The cells of the mapping table (DCGM field, DCGM query, gpupulse query, notes)."""
    section = PAGE.read_text().split("## Fields and series", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `DCGM_FI_"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append([c.replace("\\|", "|") for c in cells])
    return rows


def _code(cell: str) -> str:
    """The query of a cell, '' when the cell says there is none."""
    found = re.fullmatch(r"`([^`]+)`", cell)
    return found[1] if found else ""


def _queries() -> dict[str, str]:
    out = {}
    for i, row in enumerate(_rows(), 1):
        for side, cell in (("dcgm", row[1]), ("gpupulse", row[2])):
            if cell != "none":
                out[f"dcgm_migration:row{i}:{side}"] = _code(cell)
    for i, (_, body) in enumerate(fenced_blocks(PAGE.read_text(), "promql"), 1):
        out[f"dcgm_migration:block{i}:query"] = body
    return out


def test_every_field_a_migration_asks_about_has_a_row() -> None:
    fields = {f for row in _rows() for f in re.findall(r"DCGM_FI_[A-Z0-9_]+", row[0])}
    assert set(ASKED) <= fields, set(ASKED) - fields
    for row in _rows():
        assert len(row) == 4, row
        assert _code(row[1]), f"{row[0]}: no DCGM query"
        assert _code(row[2]) or row[2] == "none", f"{row[0]}: neither a query nor 'none'"


def test_the_gpupulse_side_names_only_series_we_export() -> None:
    known = known_metrics()
    for row in _rows():
        query = _code(row[2])
        if not query:
            continue
        used = {n if n in known else base_metric(n) for n in metric_names(query)}
        assert used and used <= known, f"{row[0]}: {query} names {used - known}"


@pytest.mark.parametrize("promtool", promtools())
def test_every_side_by_side_query_parses(promtool: str, tmp_path: Path) -> None:
    queries = _queries()
    assert len(queries) > 2 * len(ASKED)
    assert all(queries.values())
    result = check_queries(promtool, queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("promtool", promtools())
def test_the_comparison_rules_load(promtool: str, tmp_path: Path) -> None:
    (rules,) = [body for _, body in fenced_blocks(PAGE.read_text(), "yaml") if "groups:" in body]
    result = check_rule_text(promtool, rules + "\n", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout


def test_a_broken_side_by_side_query_is_caught(tmp_path: Path) -> None:
    result = check_queries(DEBIAN, {"x:y:z": "floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / 32 % 2"}, tmp_path)
    assert result.returncode == 1


def test_the_readme_links_the_page() -> None:
    assert "(docs/dcgm-migration.md)" in (ROOT / "README.md").read_text()
