"""docs/dcgm-migration.md: every DCGM field a migrating user asks about has a row, every side-by-side
query parses in the real promtool, every gpupulse series it names exists, and its comparison rules
load; and the page holds field by field against dcgm-exporter's own counters files (vendored in
tests/fixtures/dcgm-exporter/): every field of them has a row, the page says on, commented out or not
listed as the file does, names are spelt as there and units are those of the help texts."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
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


# dcgm-exporter's counters files, as released (README.md there: source, tag, commit, blob hashes)
COUNTERS = ROOT / "tests" / "fixtures" / "dcgm-exporter" / "4.5.3-4.8.2"
# a whole field name, not a family such as `DCGM_FI_PROF_*`
FIELD = re.compile(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")
# Fields the page maps that the 4.8.2 files do not list, each a field of DCGM's dcgm_fields.h. Kept
# exact both ways: a name here must be on the page and absent from the files.
NOT_LISTED = frozenset(
    {
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "DCGM_FI_DEV_SHUTDOWN_TEMP",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_PSTATE",
        "DCGM_FI_DEV_FAN_SPEED",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    }
)
# Pre-4.x names (dcgm-exporter 3.3.9-3.6.1 reads the first, 4.0.0-4.0.1 the second): the page may give
# one only as the old name of the current one
OLD_NAMES = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
# the page's second column: True uncommented in default-counters.csv, False commented out, None absent
DEFAULT = {"on": True, "commented out": False, "not listed": None}
# a help text's "(in X)" as the page writes the unit, and the conversion into ours the DCGM query makes
UNITS = {"MHz": "MHz", "C": "°C", "W": "W", "mJ": "mJ", "%": "%", "MiB": "MiB", "ns": "ns"}
CONVERSION = {"MHz": "* 1e6", "mJ": "/ 1000", "%": "/ 100", "MiB": "* 1048576", "ns": "/ 1e9"}


@dataclass(frozen=True)
class Counter:
    on: bool
    kind: str
    help: str


def _counters(name: str) -> dict[str, Counter]:
    """The fields of a counters file: on (an uncommented line) or commented out, with the metric type
    and help text of the line that counts (the uncommented one where a field has both)."""
    out: dict[str, Counter] = {}
    for raw in (COUNTERS / name).read_text().splitlines():
        line = raw.strip()
        found = re.fullmatch(r"#?\s*(DCGM_(?:FI|EXP)_[A-Z0-9_]+)\s*,\s*([a-z]+)\s*,\s*(.*)", line)
        if not found:
            continue
        on = not line.startswith("#")
        if found[1] in out and (out[found[1]].on or not on):
            continue
        out[found[1]] = Counter(on, found[2], found[3].strip())
    return out


def _fields(cell: str) -> list[str]:
    """Every DCGM name of a cell."""
    return FIELD.findall(cell)


def _named(cell: str) -> list[str]:
    """The fields a row is about: the names of its first cell before the unit's parenthesis."""
    return _fields(cell.split("(", 1)[0])


def _unit(cell: str) -> str:
    """The page's unit of a row: its first cell's parenthesis, '' without one."""
    found = re.search(r"\((.*)\)\s*$", cell)
    return found[1] if found else ""


def _help_unit(counter: Counter) -> str | None:
    """The unit a help text gives, as the page writes it."""
    found = re.search(r"\(in ([^)]+)\)", counter.help)
    if found:
        return UNITS[found[1]]
    if "in bytes per second" in counter.help:
        return "bytes/s"
    if re.match(r"(The )?[Rr]atio\b", counter.help):
        return "ratio"
    return "label" if counter.kind == "label" else None


def _rows() -> list[list[str]]:
    """The cells of the mapping table (DCGM field, default-counters.csv, DCGM query, gpupulse query,
    notes)."""
    section = PAGE.read_text().split("## Fields and series", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `DCGM_"):
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
        for side, cell in (("dcgm", row[2]), ("gpupulse", row[3])):
            if cell != "none":
                out[f"dcgm_migration:row{i}:{side}"] = _code(cell)
    for i, (_, body) in enumerate(fenced_blocks(PAGE.read_text(), "promql"), 1):
        out[f"dcgm_migration:block{i}:query"] = body
    return out


def test_every_field_a_migration_asks_about_has_a_row() -> None:
    fields = {f for row in _rows() for f in _fields(row[0])}
    assert set(ASKED) <= fields, set(ASKED) - fields
    for row in _rows():
        assert len(row) == 5, row
        assert _code(row[2]), f"{row[0]}: no DCGM query"
        assert _code(row[3]) or row[3] == "none", f"{row[0]}: neither a query nor 'none'"


def test_the_gpupulse_side_names_only_series_we_export() -> None:
    known = known_metrics()
    for row in _rows():
        query = _code(row[3])
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


def test_the_readme_comparison_names_what_default_counters_comments_out() -> None:
    counters = _counters("default-counters.csv")
    (line,) = [
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| SM activity")
    ]
    claim = line.split(" | ")[0]
    assert "commented out of the default counters" in claim
    named = _fields(claim)
    assert named and all(not counters[f].on for f in named), named
    profiling = {f for f in counters if f.startswith("DCGM_FI_PROF_")}
    on = {f.removeprefix("DCGM_FI_PROF_") for f in profiling if counters[f].on}
    assert on == {
        "GR_ENGINE_ACTIVE",
        "PIPE_TENSOR_ACTIVE",
        "DRAM_ACTIVE",
        "PCIE_TX_BYTES",
        "PCIE_RX_BYTES",
    }, on


def test_the_vendored_counters_files_are_the_released_ones() -> None:
    readme = (COUNTERS / "README.md").read_text()
    assert "691c92762eb551313c825f6efe4ceeee20982801" in readme
    for name in ("default-counters.csv", "dcp-metrics-included.csv", "LICENSE"):
        data = (COUNTERS / name).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        assert f"| {name} |" in readme and blob in readme, f"{name}: git blob {blob} not in README.md"
    assert "Apache License" in (COUNTERS / "LICENSE").read_text()


def test_every_field_of_the_counters_files_has_a_row() -> None:
    named = {f for row in _rows() for f in _named(row[0])}
    for name in ("default-counters.csv", "dcp-metrics-included.csv"):
        fields = set(_counters(name))
        assert len(fields) > 50, name
        assert fields <= named, f"{name}: no row for {sorted(fields - named)}"


def test_the_page_says_on_commented_out_or_not_listed_as_default_counters_does() -> None:
    counters = _counters("default-counters.csv")
    for row in _rows():
        assert row[1] in DEFAULT, f"{row[0]}: {row[1]!r} is none of {list(DEFAULT)}"
        for field in _named(row[0]):
            found = counters.get(field)
            assert (None if found is None else found.on) is DEFAULT[row[1]], (
                f"{field}: the page says {row[1]!r}, default-counters.csv "
                + ("does not list it" if found is None else "has it on" if found.on else "comments it out")
            )
    # on by default: the profiling fields named in issue 38, and the ones that are not
    for field in ("GR_ENGINE_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE", "PCIE_TX_BYTES", "PCIE_RX_BYTES"):
        assert counters[f"DCGM_FI_PROF_{field}"].on
    assert not counters["DCGM_FI_PROF_SM_ACTIVE"].on and not counters["DCGM_FI_PROF_SM_OCCUPANCY"].on


def test_no_other_cell_states_a_default() -> None:
    """The second column is the page's only statement of what is on by default."""
    for row in _rows():
        for cell in (row[0], *row[2:]):
            assert "default" not in cell, f"{row[0]}: {cell}"
    assert "default set" not in PAGE.read_text()


def test_the_dcp_profile_turns_on_the_same_fields() -> None:
    """What the table's introduction says of etc/dcp-metrics-included.csv."""
    default, dcp = _counters("default-counters.csv"), _counters("dcp-metrics-included.csv")
    exporter_own = {f for f in default if f.startswith("DCGM_EXP_")}
    assert exporter_own and not any(default[f].on for f in exporter_own)
    assert set(dcp) == set(default) - exporter_own
    assert all(dcp[f].on == default[f].on for f in dcp)
    assert "lacks only the\ncommented-out `DCGM_EXP_*` lines" in PAGE.read_text()


def test_units_and_conversions_are_those_of_the_help_texts() -> None:
    counters = _counters("default-counters.csv")
    checked = 0
    for row in _rows():
        unit = _unit(row[0])
        for field in _named(row[0]):
            if field not in counters:
                continue
            counter, expected = counters[field], _help_unit(counters[field])
            if re.search(r"\b(counter|gauge)\b", unit):
                assert counter.kind in unit, f"{field}: the page says {unit!r}, the file {counter.kind}"
            if expected is None:
                continue
            checked += 1
            assert unit.split(",")[0].split(" ")[0].rstrip("s") == expected.rstrip("s"), (
                f"{field}: the page's unit {unit!r}, the help text's {expected!r} ({counter.help})"
            )
            if expected in CONVERSION:
                assert CONVERSION[expected] in row[2], f"{field}: {row[2]} does not convert {expected}"
            elif expected != "label":
                assert not re.search(r"[*/]\s*[0-9]", row[2]), f"{field} ({expected}): {row[2]} converts"
    assert checked > 30
    violation = counters["DCGM_FI_DEV_THERMAL_VIOLATION"].help
    assert violation.endswith("(in ns)."), violation


def test_names_are_spelt_as_in_the_counters_files() -> None:
    text = PAGE.read_text()
    counters = _counters("default-counters.csv")
    on_page = set(_fields(text))
    unknown = on_page - set(counters) - NOT_LISTED - set(OLD_NAMES)
    assert not unknown, f"not in dcgm-exporter's files nor NOT_LISTED: {sorted(unknown)}"
    assert NOT_LISTED <= on_page and not NOT_LISTED & set(counters)
    for old, new in OLD_NAMES.items():
        assert old not in counters and new not in counters
        # only in the first cell of the current name's row, said to be the old name; in no query
        for line in text.splitlines():
            cells = re.split(r"(?<!\\)\|", line)[1:-1] if line.startswith("| `DCGM_") else [line]
            for i, cell in enumerate(cells):
                if old in cell:
                    assert i == 0 and new in cell and f"`{old}` is its old name" in cell, cell
