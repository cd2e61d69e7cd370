"""Every generated file is what scripts/generate writes from its source (the one drift test), and the
check behind it notices each kind of drift: an edited copy, a missing one, a stray one."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_script", ROOT / "scripts" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = _script()
chart = sys.modules["generate_chart"]  # imported by the script
HAND_WRITTEN_AROUND = {chart.VALUES, chart.SCHEMA}  # what they must hold depends on them now


def test_every_generated_file_matches_its_source() -> None:
    # The command a contributor runs, from the checkout, so its imports and exit code are tested too.
    result = subprocess.run(
        [sys.executable, "scripts/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, f"run scripts/generate:\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def want() -> dict[PurePosixPath, str]:
    return dict(generate.expected(ROOT))


@pytest.fixture
def tree(tmp_path: Path, want: dict[PurePosixPath, str]) -> Path:
    """A copy of this checkout's generated files (and the hand-written files around them)."""
    for path in want:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, tmp_path / path)
    return tmp_path


def test_the_build_covers_every_kind_of_generated_file(want: dict[PurePosixPath, str]) -> None:
    paths = {str(p) for p in want}
    assert {"docs/metrics.md", "helm/gpupulse/values.yaml", "helm/gpupulse/values.schema.json"} <= paths
    for folder, count in [
        ("alerts", 5),
        ("dashboards/json", 4),
        ("helm/gpupulse/files/rules", 5),
        ("helm/gpupulse/files/dashboards", 4),
        ("docs/runbooks", 25),
    ]:
        assert sum(str(p.parent) == folder for p in want) >= count, folder


def test_a_copy_of_the_checkout_has_no_drift(tree: Path, want: dict[PurePosixPath, str]) -> None:
    assert generate.drift(tree, want) == {}


def test_an_edit_to_any_generated_file_is_named(tree: Path, want: dict[PurePosixPath, str]) -> None:
    for path in set(want) - HAND_WRITTEN_AROUND:
        file = tree / path
        original = file.read_text()
        file.write_text(original.replace("\n", "\n ", 1))  # one space: the smallest edit
        assert generate.drift(tree, want) == {path: "out of date"}, path
        file.write_text(original)


def test_values_drift_inside_the_generated_block_only(tree: Path) -> None:
    values = tree / chart.VALUES
    text = values.read_text()
    block = text.index(chart.BEGIN)
    values.write_text(text[:block] + "# a note of the chart's author\n" + text[block:])
    assert generate.drift(tree) == {}
    values.write_text(text.replace("  windows:\n", "  windows:\n    bogus: 1m\n", 1))
    assert generate.drift(tree) == {chart.VALUES: "out of date"}


def test_check_exits_1_names_the_files_and_writes_nothing(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tree / "alerts" / "hardware.rules.yaml"
    rules.write_text(rules.read_text().replace("for: ", "for: 1", 1))
    (tree / "dashboards" / "json" / "gpupulse-fleet.json").unlink()
    stray = tree / "helm" / "gpupulse" / "files" / "dashboards" / "retired.json"
    stray.write_text("{}\n")
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}

    assert generate.main(["--check"], root=tree) == 1

    out = capsys.readouterr()
    assert out.out.splitlines() == [
        "out of date: alerts/hardware.rules.yaml",
        "missing: dashboards/json/gpupulse-fleet.json",
        "stray: helm/gpupulse/files/dashboards/retired.json",
    ]
    assert "run scripts/generate" in out.err
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before


def test_writing_repairs_every_drift_and_keeps_the_hand_written_parts(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tree / "helm" / "gpupulse" / "values.yaml"
    text = values.read_text()
    block_start = text.index(chart.BEGIN)
    # An edit outside the generated block is the author's and stays; one inside is undone.
    hand = text[:block_start] + "# a note of the chart's author\n" + text[block_start:]
    values.write_text(hand.replace("  thresholds:\n", "  thresholds:\n    bogus: 1\n", 1))
    (tree / "docs" / "metrics.md").write_text("stale\n")
    stray = tree / "alerts" / "retired.rules.yaml"
    stray.write_text("groups: []\n")

    assert generate.main([], root=tree) == 0

    assert generate.drift(tree) == {}
    assert values.read_text() == hand
    assert not stray.exists()
    assert "removed: alerts/retired.rules.yaml" in capsys.readouterr().out


def test_values_without_their_markers_is_an_error_not_a_traceback(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tree / "helm" / "gpupulse" / "values.yaml"
    values.write_text(values.read_text().replace(chart.END, "  # end"))
    (tree / "docs" / "metrics.md").write_text("stale\n")
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}

    assert generate.main([], root=tree) == 2
    assert generate.main(["--check"], root=tree) == 2

    err = capsys.readouterr().err
    assert "helm/gpupulse/values.yaml: the BEGIN/END markers" in err
    assert "Traceback" not in err
    # Nothing is written when one part cannot be built: no half-updated tree.
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "content",
    [None, "{not json", "[]", '{"properties": {}}', '{"properties": {"prometheusRule": {"properties": 1}}}'],
)
def test_a_missing_or_corrupt_schema_is_an_error(
    tree: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    schema = tree / "helm" / "gpupulse" / "values.schema.json"
    if content is None:
        schema.unlink()
    else:
        schema.write_text(content)
    assert generate.main(["--check"], root=tree) == 2
    assert "helm/gpupulse/values.schema.json" in capsys.readouterr().err
    if content is not None:
        assert schema.read_text() == content


def test_the_schema_keeps_its_hand_written_properties(tree: Path) -> None:
    schema = tree / "helm" / "gpupulse" / "values.schema.json"
    doc = json.loads(schema.read_text())
    doc["properties"]["exporter"]["description"] = "an author's note"
    del doc["properties"]["prometheusRule"]["properties"]["windows"]
    schema.write_text(json.dumps(doc, indent=2) + "\n")

    assert generate.drift(tree) == {PurePosixPath("helm/gpupulse/values.schema.json"): "out of date"}
    generate.write(tree)

    repaired = json.loads(schema.read_text())
    assert repaired["properties"]["exporter"]["description"] == "an author's note"
    assert "windows" in repaired["properties"]["prometheusRule"]["properties"]


def test_the_wrapper_runs_the_module() -> None:
    wrapper = ROOT / "scripts" / "generate"
    assert wrapper.stat().st_mode & 0o111, "scripts/generate is not executable"
    assert "scripts/generate.py" in wrapper.read_text()
