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
    # A module no test names or imports gets none (the tool then says so instead of running nothing).
    assert script.tests_for("remediation.__main__") == []


def test_module_names_resolve_as_paths_or_dotted_names() -> None:
    script = _script()
    assert script.module_path("remediation.safety") == "remediation/safety.py"
    assert script.module_path("remediation/safety.py") == "remediation/safety.py"
    with pytest.raises(SystemExit, match="no module"):
        script.module_path("remediation.nope")


def test_every_judged_equivalent_mutant_still_names_a_source_line() -> None:
    script = _script()
    for (path, operator, line), reason in script.load_equivalents().items():
        assert operator.startswith("core/"), operator
        assert reason, (path, line)
        lines = {text.strip() for text in (ROOT / path).read_text().splitlines()}
        assert line in lines, f"{path}: no line {line!r} any more; update scripts/mutation-equivalent.txt"
