"""Build the Grafana dashboards as JSON text; scripts/generate writes them to dashboards/json/."""

from __future__ import annotations

import json
from pathlib import Path

from alerts.config import load_config
from dashboards.boards import all_dashboards

JSON_DIR = Path(__file__).resolve().parent / "json"


def render_dashboards() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    config = load_config()
    return {
        f"{d.uid}.json": json.dumps(d.render(), indent=2, ensure_ascii=False) + "\n"
        for d in all_dashboards(config)
    }
