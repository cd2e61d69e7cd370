"""Copy the rule files of alerts/ and the dashboards of dashboards/json/ into the chart.

Helm can only read files inside the chart, so the chart carries copies; tests/helm checks they are
equal to their sources. Run: python helm/sync.py
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "gpupulse"


def rule_files() -> list[Path]:
    """Prometheus rule files under alerts/ (YAML documents with top-level `groups`)."""
    found = []
    for path in sorted((ROOT / "alerts").rglob("*.y*ml")):
        doc = yaml.safe_load(path.read_text())
        if isinstance(doc, dict) and "groups" in doc and "rule_files" not in doc:
            found.append(path)
    return found


def dashboard_files() -> list[Path]:
    return sorted((ROOT / "dashboards" / "json").glob("*.json"))


def expected() -> dict[Path, bytes]:
    """Chart path → content it must have."""
    want: dict[Path, bytes] = {}
    for src in rule_files():
        want[CHART / "files" / "rules" / src.name] = src.read_bytes()
    for src in dashboard_files():
        want[CHART / "files" / "dashboards" / src.name] = src.read_bytes()
    return want


def main() -> int:
    want = expected()
    for folder in ("rules", "dashboards"):
        target = CHART / "files" / folder
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
    for path, content in want.items():
        path.write_bytes(content)
    print(f"synced {len(want)} files into {CHART / 'files'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
