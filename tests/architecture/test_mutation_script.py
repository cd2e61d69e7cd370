"""scripts/mutation picks the right tests and its list of equivalent mutants does not drift."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def _probe(project: Path, modules: list[str], tests: list[str]) -> dict[str, Any]:
    out = project / "traced.json"
    probe = [sys.executable, str(ROOT / "scripts" / "mutation_probe.py"), str(out), *modules, "--"]
    # the project's own pytest options (pyproject.toml) do not reach a project in tmp: these are them
    options = [
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:cloudcoil",
        "-o",
        "pythonpath=.",
        "--rootdir",
        str(project),
    ]
    done = subprocess.run(
        [*probe, *options, *tests],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, Any] = json.loads(out.read_text())
    return found


def test_the_tracer_finds_the_tests_that_run_a_module_they_do_not_import(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "pages.py").write_text("LIMIT = 3\n\ndef page(n):\n    return n < LIMIT\n")
    (tmp_path / "pkg" / "engine.py").write_text(
        "import asyncio\nfrom pkg.pages import page\n\n"
        "def handle(n):\n    return page(n)\n\n"
        "async def handle_async(n):\n    return await asyncio.to_thread(page, n)\n"
    )
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_engine.py").write_text(
        "import asyncio\nfrom pkg.engine import handle, handle_async\n\n"
        "def test_through_the_engine():\n    assert handle(1)\n\n"
        "def test_in_a_thread():\n    assert asyncio.run(handle_async(1))\n\n"
        "def test_not_paging():\n    assert 1\n\n"
        "def test_failing():\n    assert not handle(1)\n"
    )
    # importing the module (its top level runs) is not exercising it
    (tests / "test_import.py").write_text(
        "import pkg.pages\n\ndef test_constant():\n    assert pkg.pages.LIMIT\n"
    )
    found = _probe(tmp_path, ["pkg/pages.py", "pkg/engine.py"], ["tests"])
    assert found["modules"]["pkg/pages.py"] == [
        "tests/test_engine.py::test_in_a_thread",
        "tests/test_engine.py::test_through_the_engine",
    ]
    assert found["modules"]["pkg/engine.py"] == found["modules"]["pkg/pages.py"]
    # a test failing unmutated is named apart and never selected (a mutation run needs green tests)
    assert found["failed"] == ["tests/test_engine.py::test_failing"]


def test_the_selection_runs_named_files_whole_then_the_traced_tests_outside_them() -> None:
    script = _script()
    traced = [
        "tests/a/test_x.py::test_one",
        "tests/b/test_y.py::test_two[with space]",
        "tests/b/test_z.py::t",
    ]
    assert script.selection(["tests/a/test_x.py", "tests/b/test_z.py"], traced) == [
        "tests/a/test_x.py",
        "tests/b/test_z.py",
        "tests/b/test_y.py::test_two[with space]",
    ]


def test_killed_mutants_of_an_earlier_session_are_carried_over_and_no_others(tmp_path: Path) -> None:
    from cosmic_ray.work_db import WorkDB, use_db  # type: ignore[import-untyped]
    from cosmic_ray.work_item import (  # type: ignore[import-untyped]
        MutationSpec,
        TestOutcome,
        WorkerOutcome,
        WorkItem,
        WorkResult,
    )

    script = _script()

    def session(path: Path, rows: int) -> None:
        with use_db(str(path), WorkDB.Mode.create) as db:
            for n in range(rows):
                spec = MutationSpec("m.py", "core/NumberReplacer", n, (n + 1, 0), (n + 1, 1))
                db.add_work_item(WorkItem(job_id=f"{path.stem}-{n}", mutations=[spec]))

    earlier, now = tmp_path / "earlier.sqlite", tmp_path / "now.sqlite"
    session(earlier, 3)
    with use_db(str(earlier), WorkDB.Mode.open) as db:
        db.set_result("earlier-0", WorkResult(WorkerOutcome.NORMAL, "", TestOutcome.KILLED))
        db.set_result("earlier-1", WorkResult(WorkerOutcome.NORMAL, "", TestOutcome.SURVIVED))
    session(now, 3)
    assert script.reuse_killed(now, earlier) == 1
    with use_db(str(now), WorkDB.Mode.open) as db:
        assert sorted(item.job_id for item in db.pending_work_items) == ["now-1", "now-2"]
