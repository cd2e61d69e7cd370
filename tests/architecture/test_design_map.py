"""docs/design.md's map stays true: every path it names exists and every link it makes resolves,
so a move that forgets the map fails here instead of sending a newcomer to nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"


def _map_section() -> str:
    text = DESIGN.read_text()
    start = text.index("## The map")
    return text[start : text.index("\n## ", start + 1)]


def test_every_path_the_map_names_exists() -> None:
    named = {
        m
        for m in re.findall(r"`([\w./-]+)`", _map_section())
        if "/" in m and "<" not in m and not m.startswith(("--", "http"))
    }
    assert len(named) >= 15, named  # the map names files, not just prose
    missing = sorted(p for p in named if not any(ROOT.glob(p.rstrip("/"))))
    assert not missing, f"docs/design.md's map names paths that do not exist: {missing}"


def test_every_link_in_the_map_resolves() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", _map_section())
    assert links
    broken = sorted(link for link in links if not (DESIGN.parent / link).exists())
    assert not broken, f"docs/design.md's map links to nothing: {broken}"
