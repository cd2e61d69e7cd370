"""A fast copy of our alert rules for the demo, generated from alerts/config.yaml at start.

Only what the four scripted incidents and the cost summary (demo/costs.py) need is shortened; every
other alert keeps its production `for:` (one minute or more), so it cannot fire by accident during a
three-minute demo. alerts/ is never written: the copy goes into the demo's temporary directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alerts.generate import render_rules, write_rules

# Deep-merged over alerts/config.yaml (alerts.config.load_config).
DEMO_RULE_OVERRIDES: Mapping[str, Any] = {
    "windows": {
        # the latency, KV-cache and token recording rules: rate() divides by the whole window, so a
        # 5m window over a demo's first minutes reads a fraction of the real tokens/s and the summary's
        # cost per token would be several times too high; the alerts on these rules keep their
        # production `for:` and cannot fire in the demo either way
        "rate": "1m",
        # an XID keeps its alert active this long; the scripted faults repeat every 3 s
        "event": "6s",
        # the leak must outgrow the workload's own recent history, not a week of it
        "memory_history": "5m",
        "memory_history_offset": "10s",
        "memory_history_interval": "1s",
        "memory_limit_hold": "1m",
        # a few of the demo's scrapes: held over a missed one, a deleted pod or lost GPU let go at once
        "stale_hold": "3s",
    },
    "for": {
        "GPUProcessMemoryAboveHardLimit": "5s",
        "GPUXidResetRequired": "3s",
        # longer than the event window: the pod-less variant of the alert that lives on for one
        # window after a pod leaves its GPU never lasts long enough to fire
        "GPUXidAppError": "8s",
        # every rank busy-idle this long: the hang after a rank dies fires within seconds, not a minute
        "TrainingJobHung": "5s",
    },
}


def demo_rules(overrides: Mapping[str, Any] = DEMO_RULE_OVERRIDES) -> dict[str, str]:
    """File name -> YAML text of every rule file, with the demo's shortened windows."""
    return render_rules(overrides=overrides)


def write_demo_rules(out_dir: Path) -> list[Path]:
    """Write the demo rule files into out_dir; returns their paths."""
    return write_rules(out_dir, demo_rules())
