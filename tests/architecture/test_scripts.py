"""Scripts and code never kill processes by name: the machine is shared, and only PIDs we started are ours."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KILL_BY_NAME = re.compile(r"\b(pkill|killall|pgrep\s.*\|\s*xargs\s+kill)\b")


def _sources() -> list[Path]:
    found = [p for p in (ROOT / "scripts").iterdir() if p.is_file()]
    found += [ROOT / ".ci" / "run"]
    for package in ("exporter", "remediation", "alerts", "dashboards", "demo", "bench", "tests"):
        found += sorted((ROOT / package).rglob("*.py"))
    return found


def test_nothing_kills_processes_by_name() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources()
        if p != Path(__file__).resolve() and KILL_BY_NAME.search(p.read_text(errors="replace"))
    ]
    assert offenders == []
