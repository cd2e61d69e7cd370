"""Copies of the shipped fault signatures with the demo's short timers.

The rungs, matches and reasons stay as shipped; only how long the ladder waits changes (and the
restart attempts of the application-XID class, so that loop detection, not the attempt count,
stops the restarts). A user signature with a shipped name replaces it (remediation-engine.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from remediation.signatures import load_builtin

VERIFY_WINDOW_SECONDS = 10.0
COOLDOWN_SECONDS = 15.0

# signature name -> ladder fields replaced
DEMO_LADDERS: Mapping[str, Mapping[str, Any]] = {
    "gpu-memory-leak": {},
    "xid-reset-gpu": {},
    "gpu-reset-required": {},
    "xid-restart-app": {"attempts": {"restart": 3, "migrate": 1}},
    "xid-app-class": {"attempts": {"restart": 3, "migrate": 1}},
    # the gang ladder: restart the whole job once, then page
    "training-job-hung": {},
}


def _shipped() -> dict[str, dict[str, Any]]:
    return {sig.name: dict(sig.to_dict()) for sig in load_builtin()}


def demo_signatures(
    verify_window_seconds: float = VERIFY_WINDOW_SECONDS, cooldown_seconds: float = COOLDOWN_SECONDS
) -> list[dict[str, Any]]:
    """The overriding signatures, as YAML-ready dicts."""
    shipped = _shipped()
    missing = sorted(set(DEMO_LADDERS) - set(shipped))
    if missing:
        raise ValueError(f"shipped signatures not found: {', '.join(missing)}")
    out = []
    for name, changes in DEMO_LADDERS.items():
        sig = dict(shipped[name])
        ladder = dict(sig.get("ladder") or {})
        ladder.update(changes)
        ladder["verify_window_seconds"] = verify_window_seconds
        ladder["cooldown_seconds"] = cooldown_seconds
        sig["ladder"] = ladder
        sig["source"] = f"gpupulse-demo: shipped {name} with demo timers"
        out.append(sig)
    return out


def write_demo_signatures(out_dir: Path) -> Path:
    """Write demo-signatures.yaml into out_dir (a directory for --signatures)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "demo-signatures.yaml"
    path.write_text(yaml.safe_dump({"signatures": demo_signatures()}, sort_keys=False))
    return path
