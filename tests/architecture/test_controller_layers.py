"""The controller's layer contracts in pyproject.toml ([tool.importlinter]) hold, run by the real
import-linter; naming the contracts means a deleted one fails here instead of passing silently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER_CONTRACTS = ("remediation-layers", "remediation-decide-pure")


def test_the_controller_keeps_its_layers_and_decide_stays_pure() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    args = [str(lint_imports), "pyproject.toml", "--no-cache"]
    for contract in CONTROLLER_CONTRACTS:
        args += ["--contract", contract]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(CONTROLLER_CONTRACTS)} kept, 0 broken." in done.stdout
