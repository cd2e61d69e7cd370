"""CHANGELOG.md is for users: Keep a Changelog sections only, and every series it names is one we
ship (a claim such as "not exported yet" goes stale the day the series lands)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpupulse.metrics.catalog import ALL_SPECS

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "CHANGELOG.md").read_text()
SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security", "Internal")
# scenario fields and flags that look like series names
NOT_SERIES = {"gpu_models"}


def _shipped() -> set[str]:
    names = {spec.name for spec in ALL_SPECS}
    for path in (ROOT / "alerts").glob("*.rules.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r.get("record") or r["alert"] for r in group["rules"]}
    return names


def test_versions_hold_only_keep_a_changelog_sections() -> None:
    assert re.findall(r"^## .+$", TEXT, flags=re.MULTILINE), "no version"
    for heading in re.findall(r"^### (.+)$", TEXT, flags=re.MULTILINE):
        assert heading in SECTIONS, heading
    assert not re.search(r"^- \[(FEATURE|ENHANCEMENT|CHANGE|BUGFIX)\]", TEXT, flags=re.MULTILINE)
    # internal work stays under its own heading
    user_facing = TEXT.split("### Internal", 1)[0]
    assert "Contributors:" not in user_facing and "for contributors" not in user_facing


def test_every_series_the_changelog_names_is_shipped() -> None:
    shipped = _shipped()
    named = set(re.findall(r"`((?:gpu|gpupulse|inference|model_weights)_[a-z0-9_]+)", TEXT)) - NOT_SERIES
    # a histogram's _bucket/_sum/_count and a family named by its prefix count as shipped
    unknown = {n for n in named if not any(n == s or n.startswith(s + "_") for s in shipped)}
    assert not unknown, unknown
    assert "not export" not in TEXT, "a series the changelog says is not exported: it is, or drop it"
