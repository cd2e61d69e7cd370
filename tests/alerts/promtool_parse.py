"""PromQL from the docs through the real promtool's parser: the Debian 2.42 and the pinned 3.16 build."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.neighbours import MissingNeighbourError, neighbour_binary
from tests.alerts.ruleset import PROMTOOL

FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def fenced_blocks(text: str, lang: str | None = None) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block of a markdown text."""
    return [(m[0], m[1].strip()) for m in FENCE.findall(text) if lang is None or m[0] == lang]


def promtools() -> list[Any]:
    """pytest params: each promtool this machine has, a skip naming the one it lacks."""
    params = [
        pytest.param(
            Path(PROMTOOL),
            id="promtool-2.42",
            marks=pytest.mark.skipif(shutil.which(PROMTOOL) is None, reason="Debian promtool missing"),
        )
    ]
    try:
        params.append(pytest.param(neighbour_binary("prometheus", "promtool"), id="promtool-3.16"))
    except MissingNeighbourError as e:
        params.append(pytest.param(None, id="promtool-3.16", marks=pytest.mark.skip(reason=str(e))))
    return params


def check_rule_text(promtool: Path, text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool check rules on a rule file's text."""
    path = tmp_path / "docs.rules.yaml"
    path.write_text(text)
    return subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def check_queries(
    promtool: Path, queries: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """promtool check rules on a file with one recording rule per query: its parser, nothing else."""
    rules = [{"record": name, "expr": expr} for name, expr in queries.items()]
    text = yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}, sort_keys=False)
    return check_rule_text(promtool, text, tmp_path)
