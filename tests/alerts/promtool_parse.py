"""PromQL from the docs through the real promtool's parser, on both lines (demo/neighbours.py: the pinned
3.x build and Debian's 2.42); a missing promtool fails the test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.neighbours import LINES, line

FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def fenced_blocks(text: str, lang: str | None = None) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block of a markdown text."""
    return [(m[0], m[1].strip()) for m in FENCE.findall(text) if lang is None or m[0] == lang]


def promtools() -> list[Any]:
    """pytest params: the name of each line, whose promtool the test runs (MissingNeighbourError, a
    failure, when that line's promtool is missing)."""
    return [pytest.param(name, id=f"promtool-{name}") for name in LINES]


def check_rule_text(line_name: str, text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool check rules, with line `line_name`'s promtool, on a rule file's text."""
    promtool = line(line_name).promtool
    path = tmp_path / "docs.rules.yaml"
    path.write_text(text)
    return subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def check_queries(
    line_name: str, queries: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """promtool check rules on a file with one recording rule per query: its parser, nothing else."""
    rules = [{"record": name, "expr": expr} for name, expr in queries.items()]
    text = yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}, sort_keys=False)
    return check_rule_text(line_name, text, tmp_path)
