"""The one build of every generated file: `scripts/generate [--check]`.

It writes, from their sources:
- alerts/*.rules.yaml               from alerts/config.yaml and alerts/rules/ (alerts.generate);
- dashboards/json/*.json            from dashboards/boards/ (dashboards.build);
- helm/gpupulse/files/rules/*       the rules with a token per install-time tunable,
  helm/gpupulse/files/dashboards/*  copies of the dashboards,
  the generated block of helm/gpupulse/values.yaml and the prometheusRule part of
  values.schema.json                (scripts/generate_chart.py);
- docs/metrics.md                   from the metric catalog;
- docs/runbooks/*.md                the marked blocks of each hand-written runbook (dashboards,
                                    escalation, what gpupulse did, the manual path) from the rules, the
                                    dashboards and the signature library (scripts/generate_runbooks.py).
A file in a folder that holds only generated files (the rule files of alerts/, dashboards/json/, the
chart's files/rules/ and files/dashboards/) that the build does not produce is stale too: writing
removes it.

`--check` writes nothing: it names every file that differs from what the build would write, is missing
or is stray, and exits 1 if there is one. tests/test_generated.py runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
# Run as a file (scripts/generate) or loaded by a test: the checkout and this folder are importable.
for _path in (ROOT, ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from generate_chart import GENERATED_FOLDERS, SCHEMA, VALUES, ChartFileError, chart_files  # noqa: E402
from generate_runbooks import RunbookError, runbook_files  # noqa: E402

from alerts.generate import render_rules  # noqa: E402
from dashboards.build import render_dashboards  # noqa: E402
from gpupulse.metrics.catalog import ALL_SPECS as METRIC_SPECS  # noqa: E402
from gpupulse.metrics.catalog import markdown as metrics_markdown  # noqa: E402
from remediation.signatures import load_library  # noqa: E402

ALERTS = PurePosixPath("alerts")
DASHBOARDS = PurePosixPath("dashboards/json")
METRICS_PAGE = PurePosixPath("docs/metrics.md")
# (folder, pattern) whose every match is generated; anything else matching there is stray.
OWNED = ((ALERTS, "*.rules.yaml"), (DASHBOARDS, "*.json"), *((f, "*") for f in GENERATED_FOLDERS))


class GenerateError(Exception):
    """A source or a hand-written file the build edits cannot be read; nothing is written."""


def metrics_page() -> str:
    """docs/metrics.md, the reference page of every metric (when the catalog moves, only its import
    above changes)."""
    return metrics_markdown(METRIC_SPECS)


def _read(root: Path, path: PurePosixPath) -> str:
    try:
        return (root / path).read_text()
    except FileNotFoundError:
        raise GenerateError(f"{path}: missing; it is written by hand around its generated part") from None


def expected(root: Path = ROOT) -> dict[PurePosixPath, str]:
    """Every generated path (relative to root) and the text it must hold.

    values.yaml and values.schema.json are partly hand-written, so what they must hold depends on
    root's copy of them now.
    """
    dashboards = render_dashboards()
    rules = render_rules()
    want = {ALERTS / name: text for name, text in rules.items()}
    want.update({DASHBOARDS / name: text for name, text in dashboards.items()})
    try:
        want.update(chart_files(dashboards, _read(root, VALUES), _read(root, SCHEMA)))
    except ChartFileError as e:
        raise GenerateError(str(e)) from None
    want[METRICS_PAGE] = metrics_page()
    try:
        want.update(runbook_files(rules, dashboards, load_library(), lambda path: _read(root, path)))
    except RunbookError as e:
        raise GenerateError(str(e)) from None
    return want


def strays(root: Path, want: dict[PurePosixPath, str]) -> list[PurePosixPath]:
    """Files in the generated-only folders that the build does not produce."""
    out = []
    for folder, pattern in OWNED:
        for path in sorted((root / folder).glob(pattern)):
            rel = PurePosixPath(path.relative_to(root).as_posix())
            if path.is_file() and rel not in want:
                out.append(rel)
    return out


def drift(root: Path = ROOT, want: dict[PurePosixPath, str] | None = None) -> dict[PurePosixPath, str]:
    """Drifted path -> why ("out of date", "missing", "stray"), in path order."""
    want = expected(root) if want is None else want
    out: dict[PurePosixPath, str] = {}
    for path, text in want.items():
        file = root / path
        if not file.is_file():
            out[path] = "missing"
        elif file.read_text() != text:
            out[path] = "out of date"
    out.update({path: "stray" for path in strays(root, want)})
    return dict(sorted(out.items()))


def write(root: Path = ROOT) -> dict[PurePosixPath, str]:
    """Bring root up to date; returns what changed, as drift() names it. Unchanged files are not touched."""
    want = expected(root)
    changed = drift(root, want)
    for path, why in changed.items():
        file = root / path
        if why == "stray":
            file.unlink()
        else:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(want[path])
    return changed


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    """CLI entry point (scripts/generate); root is the tree written or checked."""
    parser = argparse.ArgumentParser(prog="scripts/generate", description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; name drifted files, exit 1")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = drift(root)
            for path, why in stale.items():
                print(f"{why}: {path}")
            if stale:
                print(
                    f"{len(stale)} generated file(s) drifted from their sources: run scripts/generate",
                    file=sys.stderr,
                )
            return 1 if stale else 0
        changed = write(root)
    except GenerateError as e:
        print(f"scripts/generate: {e}", file=sys.stderr)
        return 2
    for path, why in changed.items():
        print(f"{'removed' if why == 'stray' else 'wrote'}: {path}")
    print(f"{len(changed)} file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
