"""Mutation testing of chosen modules with cosmic-ray, against the tests that exercise them: those that
import them or are named after them (test_<name>.py and test_<name>_*.py), and those during which a
function of the module runs, found by running the scanned tests once under a call tracer
(scripts/mutation_probe.py), so that a module reached only through the engine or a harness is
measured against the tests that really drive it.

Usage: scripts/mutation MODULE [MODULE ...] [--jobs N] [--tests PATH ...] [--select traced|static]
                        [--scan PATH ...] [--scan-marker EXPR] [--keep]

MODULE is a path (remediation/loops.py) or a dotted name (remediation.loops). Each module is mutated
in throw-away copies of the checkout (tracked files and untracked ones git does not ignore), never in
the working tree, so an interrupted run leaves nothing mutated behind. For each module it prints the
mutants, killed, survived and timed out, and every survivor as file:line with the operator and the
mutated line. Mutants inside annotations of a module with postponed evaluation (`from __future__
import annotations`) are not run: Python never evaluates those, so they cannot change behaviour.
Survivors listed in scripts/mutation-equivalent.txt (judged not to change behaviour,
with the reason) are counted apart, so the score is over the mutants that change behaviour.
The tracer does not see code run in a subprocess, and a scanned test that fails unmutated is left
out (and named).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = ROOT / "scripts" / "mutation-equivalent.txt"
PYTHON = sys.executable


@dataclass(frozen=True)
class Mutant:
    """One mutation and what the tests made of it."""

    path: str
    line: int
    operator: str
    definition: str
    source_line: str
    outcome: str  # killed | survived | incompetent (timeout, crash) | annotation (not run) | pending

    def key(self) -> tuple[str, str, str]:
        return (self.path, self.operator, self.source_line)


def module_path(name: str) -> str:
    """remediation.loops or remediation/loops.py -> remediation/loops.py (checked to exist)."""
    rel = name if name.endswith(".py") else name.replace(".", "/") + ".py"
    if not (ROOT / rel).is_file():
        raise SystemExit(f"mutation: no module {name!r} (looked for {rel})")
    return rel


def dotted(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def _imported_names(path: Path) -> Iterator[str]:
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for alias in node.names:
                yield f"{node.module}.{alias.name}"


def tests_for(module: str) -> list[str]:
    """Test files that import the module itself, plus those named after it: test_<name>.py and the
    family test_<name>_*.py (test_intake_hostile.py drives intake through the webhook, importing only
    the harness)."""
    stem = module.rsplit(".", 1)[-1]
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        named = path.stem == f"test_{stem}" or path.stem.startswith(f"test_{stem}_")
        if named or any(n == module or n.startswith(module + ".") for n in _imported_names(path)):
            found.append(str(path.relative_to(ROOT)))
    return found


def traced_tests(modules: Sequence[str], scan: Sequence[str], marker: str) -> dict[str, list[str]]:
    """The ids of the scanned tests during which a function of each module ran (one pytest run for
    all modules, under scripts/mutation_probe.py); tests that fail unmutated are left out."""
    with tempfile.TemporaryDirectory(prefix="gpupulse-mutation-probe-") as tmp:
        out = Path(tmp) / "traced.json"
        probe = [PYTHON, str(ROOT / "scripts" / "mutation_probe.py"), str(out), *modules, "--"]
        pytest_args = ["-q", "-p", "no:cacheprovider", "-m", marker, *scan]
        done = subprocess.run([*probe, *pytest_args], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"mutation: the tracing run failed:\n{(done.stdout + done.stderr)[-3000:]}")
        found = json.loads(out.read_text())
    if found["failed"]:
        print(f"mutation: left out, failing unmutated: {' '.join(found['failed'])}", flush=True)
    return {rel: list(ids) for rel, ids in found["modules"].items()}


def selection(files: Sequence[str], traced: Sequence[str]) -> list[str]:
    """The test files named, then the traced test ids outside them (a file runs whole, once)."""
    whole = set(files)
    return [*files, *(t for t in traced if t.split("::", 1)[0] not in whole)]


Span = tuple[tuple[int, int], tuple[int, int]]  # (line, column) of the start and the end


def annotation_spans(path: Path) -> list[Span]:
    """Where a module's annotations lie, when Python never evaluates them (PEP 563); else none.

    Covers parameter and return annotations and annotated assignments (dataclass fields, which
    dataclasses read as strings); a type alias or a cast() is an ordinary expression and is not here.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    postponed = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )
    if not postponed:
        return []
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return [
        ((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or n.col_offset))
        for n in found
    ]


def in_spans(position: tuple[int, int], spans: Sequence[Span]) -> bool:
    return any(start <= position < end for start, end in spans)


def skip_annotation_mutants(session: Path, spans: Sequence[Span]) -> None:
    """Mark the session's mutants that lie in an annotation as skipped, so exec never runs them."""
    if not spans:
        return
    from cosmic_ray.work_db import WorkDB, use_db  # type: ignore[import-untyped]
    from cosmic_ray.work_item import WorkerOutcome, WorkResult  # type: ignore[import-untyped]

    with use_db(str(session), WorkDB.Mode.open) as db:
        jobs = [
            item.job_id
            for item in db.pending_work_items
            if any(in_spans(tuple(m.start_pos), spans) for m in item.mutations)
        ]
        if jobs:
            result = WorkResult(output="in an annotation", worker_outcome=WorkerOutcome.SKIPPED)
            db.set_multiple_results(jobs, result)


def _spec_key(mutations: Sequence[Any]) -> tuple[tuple[str, str, int, tuple[int, ...], tuple[int, ...]], ...]:
    return tuple(
        (str(m.module_path), str(m.operator_name), int(m.occurrence), tuple(m.start_pos), tuple(m.end_pos))
        for m in mutations
    )


def reuse_killed(session: Path, earlier: Path) -> int:
    """Mark as killed the session's mutants that an earlier session killed: sound only when the module
    is unchanged since and the earlier tests are a subset of these (a test that failed then fails
    now). Returns how many were carried over; the rest run as usual."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    with use_db(str(earlier), WorkDB.Mode.open) as old:
        killed = {
            _spec_key(item.mutations)
            for item, result in old.completed_work_items
            if result.test_outcome == TestOutcome.KILLED
        }
    with use_db(str(session), WorkDB.Mode.open) as db:
        jobs = [item.job_id for item in db.pending_work_items if _spec_key(item.mutations) in killed]
        if jobs:
            result = WorkResult(
                output=f"killed in {earlier}",
                worker_outcome=WorkerOutcome.NORMAL,
                test_outcome=TestOutcome.KILLED,
            )
            db.set_multiple_results(jobs, result)
    return len(jobs)


def checkout_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and os.path.lexists(ROOT / name)]


def copy_checkout(dest: Path, files: Sequence[str]) -> None:
    for name in files:
        src, dst = ROOT / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_equivalents(path: Path = EQUIVALENT_FILE) -> dict[tuple[str, str, str], str]:
    """Lines of `path | operator | mutated source line | reason`; # starts a comment.

    The source line may itself hold " | " (a union type, a set union); the reason may not.
    """
    known: dict[tuple[str, str, str], str] = {}
    if not path.exists():
        return known
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        head = raw.split(" | ", 2)
        parts = [*head[:2], *head[2].rsplit(" | ", 1)] if len(head) == 3 else head
        parts = [p.strip() for p in parts]
        if len(parts) != 4 or not all(parts):
            raise SystemExit(f"mutation: bad line in {path.name}: {raw!r}")
        known[(parts[0], parts[1], parts[2])] = parts[3]
    return known


def run_cosmic_ray(
    rel: str, tests: Sequence[str], jobs: int, keep: bool, earlier: Path | None = None
) -> list[Mutant]:
    work = Path(tempfile.mkdtemp(prefix="gpupulse-mutation-"))
    files = checkout_files()
    copies = [work / f"copy{i}" for i in range(jobs)]
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for copy in copies:
            copy_checkout(copy, files)
        # the tests go in an argument file (pytest @FILE, one per line): ids may hold spaces
        args_file = work / "tests.args"
        args_file.write_text("".join(f"{t}\n" for t in tests))
        pytest = [PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        test_command = " ".join([*pytest, f"@{args_file}"])
        started = time.monotonic()
        baseline = subprocess.run(test_command.split(), cwd=copies[0], capture_output=True, text=True)
        if baseline.returncode != 0:
            raise SystemExit(f"mutation: the tests fail unmutated:\n{baseline.stdout[-3000:]}")
        timeout = max(30.0, 10 * (time.monotonic() - started))
        ports = [free_port() for _ in copies]
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        for copy, port in zip(copies, ports, strict=True):
            workers.append(
                subprocess.Popen(
                    [str(Path(PYTHON).parent / "cosmic-ray"), "http-worker", "--port", str(port)],
                    cwd=copy,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        urls = ", ".join(f"'http://127.0.0.1:{port}'" for port in ports)
        config = work / "cosmic-ray.toml"
        config.write_text(
            "[cosmic-ray]\n"
            f'module-path = "{rel}"\n'
            f"timeout = {timeout:.0f}.0\n"
            "excluded-modules = []\n"
            f'test-command = "{test_command}"\n\n'
            "[cosmic-ray.distributor]\n"
            'name = "http"\n\n'
            "[cosmic-ray.distributor.http]\n"
            f"worker-urls = [{urls}]\n"
        )
        session = work / "session.sqlite"
        cosmic_ray = str(Path(PYTHON).parent / "cosmic-ray")
        _wait_for_ports(ports)
        subprocess.run([cosmic_ray, "init", str(config), str(session)], cwd=copies[0], check=True)
        skip_annotation_mutants(session, annotation_spans(ROOT / rel))
        if earlier is not None:
            print(
                f"mutation: {reuse_killed(session, earlier)} mutant(s) killed in {earlier} carried over",
                flush=True,
            )
        subprocess.run([cosmic_ray, "exec", str(config), str(session)], cwd=copies[0], check=True)
        dump = subprocess.run(
            [cosmic_ray, "dump", str(session)], cwd=copies[0], check=True, capture_output=True, text=True
        ).stdout
        source = (ROOT / rel).read_text().splitlines()
        return [_mutant(json.loads(line), source) for line in dump.splitlines() if line.strip()]
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=10)
        if keep:
            print(f"mutation: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _wait_for_ports(ports: Sequence[int], deadline_seconds: float = 30.0) -> None:
    end = time.monotonic() + deadline_seconds
    for port in ports:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > end:
                    raise SystemExit(f"mutation: no cosmic-ray worker on port {port}") from None
                time.sleep(0.1)


def _mutant(record: list[dict[str, object]], source: Sequence[str]) -> Mutant:
    job, result = record[0], record[1] or {}
    mutation = job["mutations"][0]  # type: ignore[index]
    line = int(mutation["start_pos"][0])
    outcome = str(result.get("test_outcome") or "pending")
    if result.get("worker_outcome") == "skipped":
        outcome = "annotation"
    elif result.get("worker_outcome") not in (None, "normal"):
        outcome = "incompetent"
    return Mutant(
        path=str(mutation["module_path"]),
        line=line,
        operator=str(mutation["operator_name"]),
        definition=str(mutation.get("definition_name") or ""),
        source_line=source[line - 1].strip() if 0 < line <= len(source) else "",
        outcome=outcome,
    )


def report(rel: str, mutants: Sequence[Mutant], equivalents: dict[tuple[str, str, str], str]) -> None:
    survived = [m for m in mutants if m.outcome == "survived"]
    judged = [m for m in survived if m.key() in equivalents]
    live = [m for m in survived if m.key() not in equivalents]
    killed = sum(m.outcome == "killed" for m in mutants)
    annotations = sum(m.outcome == "annotation" for m in mutants)
    other = len(mutants) - killed - len(survived) - annotations
    behavioural = len(mutants) - other - annotations - len(judged)
    score = killed / behavioural if behavioural else 1.0
    print(f"\n== {rel}")
    print(
        f"mutants {len(mutants)}  in annotations (not run) {annotations}  killed {killed}  "
        f"survived {len(survived)} (equivalent {len(judged)})  timed out or incompetent {other}"
    )
    print(f"killed of the behaviour-changing mutants: {killed}/{behavioural} = {score:.0%}")
    stuck = [m for m in mutants if m.outcome in ("incompetent", "pending")]
    for m in sorted([*live, *stuck], key=lambda m: m.line):
        label = "survived" if m.outcome == "survived" else "timed out or incompetent"
        print(f"  {label} {m.path}:{m.line} {m.operator} in {m.definition or '<module>'}: {m.source_line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/mutation", description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", metavar="MODULE")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel workers")
    parser.add_argument("--tests", nargs="+", help="test files or ids to run instead of the selection")
    parser.add_argument(
        "--select",
        choices=("traced", "static"),
        default="traced",
        help="traced: importers, namesakes and the tests during which the module runs; static: the first two",
    )
    parser.add_argument("--scan", nargs="+", default=["tests"], help="tests the tracer runs (default: tests)")
    parser.add_argument(
        "--scan-marker", default="not gpu and not image", help="pytest -m expression for the tracing run"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (session, copies)")
    parser.add_argument(
        "--reuse-killed",
        type=Path,
        metavar="SESSION",
        help="count as killed what this earlier session (--keep) of the one MODULE killed, unchanged since, "
        "with a subset of these tests; run the rest",
    )
    args = parser.parse_args(argv)
    if args.reuse_killed is not None and len(args.modules) != 1:
        parser.error("--reuse-killed takes one MODULE")
    equivalents = load_equivalents()
    rels = [module_path(name) for name in args.modules]
    traced: dict[str, list[str]] = {}
    if not args.tests and args.select == "traced":
        print(f"mutation: tracing which of {' '.join(args.scan)} exercise {' '.join(rels)}", flush=True)
        traced = traced_tests(rels, args.scan, args.scan_marker)
    for rel in rels:
        files = tests_for(dotted(rel))
        tests = args.tests or selection(files, traced.get(rel, []))
        if not tests:
            print(f"\n== {rel}\nno test imports or exercises {dotted(rel)}: nothing to measure (use --tests)")
            continue
        extra = len(tests) - len(files)
        what = (
            f"{len(tests)} test file(s) or id(s)"
            if args.tests
            else f"{len(files)} test file(s) and {extra} traced test(s)"
        )
        more = " ..." if len(tests) > 12 else ""
        print(f"\n{rel}: running {what}: {' '.join(tests[:12])}{more}", flush=True)
        report(rel, run_cosmic_ray(rel, tests, max(1, args.jobs), args.keep, args.reuse_killed), equivalents)
    return 0


if __name__ == "__main__":
    sys.exit(main())
