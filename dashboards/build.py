"""Regenerate every generated file: alerts/*.rules.yaml and dashboards/json/*.json.

`python -m dashboards.build` writes them; `--check` only reports files that differ (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from alerts.config import load_config
from alerts.generate import ALERTS_DIR, render_rules
from dashboards.boards import all_dashboards

REPO_ROOT = Path(__file__).resolve().parent.parent
JSON_DIR = Path(__file__).resolve().parent / "json"


def render_dashboards() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    config = load_config()
    return {
        f"{d.uid}.json": json.dumps(d.render(), indent=2, ensure_ascii=False) + "\n"
        for d in all_dashboards(config)
    }


def generated() -> dict[Path, str]:
    """Every generated path and the text it must hold."""
    out = {ALERTS_DIR / name: text for name, text in render_rules().items()}
    out.update({JSON_DIR / name: text for name, text in render_dashboards().items()})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    args = parser.parse_args(argv)
    stale = [p for p, text in generated().items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(REPO_ROOT)}")
        return 1 if stale else 0
    for path, text in generated().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(generated())} files ({len(stale)} changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
