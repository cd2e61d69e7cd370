"""scripts/mutation picks the right tests and its list of equivalent mutants does not drift."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_tests_for_a_module_are_its_importers_and_its_namesake() -> None:
    script = _script()
    tests = script.tests_for("remediation.loops")
    assert "tests/remediation/test_loops.py" in tests
    assert all(path.startswith("tests/") and "/test_" in path for path in tests)
    # The family named after a module counts even when it reaches the module through a harness.
    intake = script.tests_for("remediation.intake")
    assert {"tests/remediation/test_intake_hostile.py", "tests/remediation/test_intake_fields.py"} <= set(
        intake
    )
    assert "tests/remediation/test_auth.py" not in intake
    # A module no test names or imports gets none (the tool then says so instead of running nothing).
    assert script.tests_for("remediation.__main__") == []


def test_module_names_resolve_as_paths_or_dotted_names() -> None:
    script = _script()
    assert script.module_path("remediation.safety") == "remediation/safety.py"
    assert script.module_path("remediation/safety.py") == "remediation/safety.py"
    with pytest.raises(SystemExit, match="no module"):
        script.module_path("remediation.nope")


def test_only_annotations_python_never_evaluates_are_left_unmutated(tmp_path: Path) -> None:
    script = _script()
    source = (
        "from __future__ import annotations\n"  # 1
        "Alias = int | None\n"  # 2: evaluated at import
        "def f(a: int | None = 1 | 2) -> str | None:\n"  # 3
        "    b: int | None = a | 4\n"  # 4
        "    return cast(str | None, b)\n"  # 5
    )
    module = tmp_path / "m.py"
    module.write_text(source)
    spans = script.annotation_spans(module)
    lines = source.splitlines()

    def bar(line: int, nth: int) -> tuple[int, int]:
        col = -1
        for _ in range(nth):
            col = lines[line - 1].index("|", col + 1)
        return (line, col)

    inside = [bar(3, 1), bar(3, 3), bar(4, 1)]  # a: int | None, -> str | None, b: int | None
    outside = [bar(2, 1), bar(3, 2), bar(4, 2), bar(5, 1)]  # alias, default, value, cast()
    assert [script.in_spans(p, spans) for p in inside] == [True] * 3
    assert [script.in_spans(p, spans) for p in outside] == [False] * 4
    # without postponed evaluation annotations are evaluated: everything is mutated
    module.write_text(source.split("\n", 1)[1])
    assert script.annotation_spans(module) == []


def test_equivalent_lines_may_hold_a_bar_in_the_source_line(tmp_path: Path) -> None:
    script = _script()
    listed = tmp_path / "equivalent.txt"
    listed.write_text(
        "# comment\n\n"
        "remediation/safety.py | core/ReplaceBinaryOperator_BitOr_Add | x: Mapping[str, str] | None = None, "
        "| annotations are never evaluated\n"
    )
    assert script.load_equivalents(listed) == {
        (
            "remediation/safety.py",
            "core/ReplaceBinaryOperator_BitOr_Add",
            "x: Mapping[str, str] | None = None,",
        ): "annotations are never evaluated"
    }
    listed.write_text("remediation/safety.py | core/AddNot | if x:\n")  # no reason
    with pytest.raises(SystemExit, match="bad line"):
        script.load_equivalents(listed)


def test_every_judged_equivalent_mutant_still_names_a_source_line() -> None:
    script = _script()
    for (path, operator, line), reason in script.load_equivalents().items():
        assert operator.startswith("core/"), operator
        assert reason, (path, line)
        lines = {text.strip() for text in (ROOT / path).read_text().splitlines()}
        assert line in lines, f"{path}: no line {line!r} any more; update scripts/mutation-equivalent.txt"
