"""Render alerts/*.rules.yaml from alerts/config.yaml: `python -m dashboards.alertgen [--out DIR]`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dashboards.alertconfig import DEFAULT_CONFIG_PATH, REPO_ROOT, load_config
from dashboards.rules import rule_files

ALERTS_DIR = REPO_ROOT / "alerts"


def render_rules(
    config_path: Path = DEFAULT_CONFIG_PATH, overrides: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """File name -> YAML text of every rule file."""
    config = load_config(config_path, overrides)
    return {f.filename: f.render() for f in rule_files(config)}


def write_rules(out_dir: Path, rendered: Mapping[str, str]) -> list[Path]:
    """Write rendered rule files into out_dir; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in rendered.items():
        path = out_dir / name
        path.write_text(text)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH)
    parser.add_argument("--overrides", type=Path, help="YAML deep-merged over the config (test profiles)")
    parser.add_argument("--out", type=Path, default=ALERTS_DIR)
    args = parser.parse_args(argv)
    overrides = yaml.safe_load(args.overrides.read_text()) if args.overrides else None
    for path in write_rules(args.out, render_rules(args.config, overrides)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
