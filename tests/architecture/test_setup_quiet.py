"""scripts/setup (which scripts/run calls) prints nothing when all goes well: pip 25+ passes the build
backend's warnings through -q, and setuptools' "Editable installation." banner opened every run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what setuptools 77+ warns while it builds the editable wheel (setuptools/command/editable_wheel.py)
BANNER = (
    "Editable installation.\n!!\n\n        ****\n        Please be careful with folders in your working "
    "directory with the same\n        name as your package as they may take precedence during imports.\n"
)


def _editable_install_filters() -> list[str]:
    line = next(ln for ln in (ROOT / "scripts" / "setup").read_text().splitlines() if "install -q -e" in ln)
    return re.findall(r"-W\s+'([^']+)'", line)


def _warn(filters: list[str], message: str) -> str:
    """stderr of a Python that warns `message` as a build backend warning, as pip re-emits it."""
    code = (
        "import warnings\nfrom pip._vendor.pyproject_hooks import BuildBackendWarning\n"
        f"warnings.warn({message!r}, BuildBackendWarning)\n"
    )
    args = [sys.executable, *(f"-W{f}" for f in filters), "-c", code]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stderr


def test_the_editable_install_drops_the_setuptools_banner_and_no_other_warning() -> None:
    filters = _editable_install_filters()
    assert filters, "scripts/setup's editable install has no -W filter"
    assert "Editable installation." in _warn([], BANNER)  # what it would print
    assert _warn(filters, BANNER) == ""
    assert "deprecated" in _warn(filters, "a real problem: this option is deprecated")
