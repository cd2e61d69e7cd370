"""Find the Prometheus and Alertmanager the demo runs: the current line's (demo/neighbours.py: 3.x and
0.3x, built by scripts/neighbours, which is run when they are missing and allowed), or Debian's 2.42 line
(installed with apt-get when missing and allowed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from demo.neighbours import CURRENT, DEBIAN, DEBIAN_BIN, Line, MissingNeighbourError, line

APT_PACKAGES = ("prometheus", "prometheus-alertmanager")
APT_TIMEOUT_SECONDS = 600.0
NEIGHBOURS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "neighbours"
BUILD_TIMEOUT_SECONDS = 1800.0  # the first build of both modules takes minutes (docs/testing.md)


class MissingBinaryError(Exception):
    """Prometheus or Alertmanager is not installed and could not be installed."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the two servers the demo runs."""

    prometheus: str
    alertmanager: str


def find_binaries(bin_dir: Path = DEBIAN_BIN) -> Binaries | None:
    """Debian's two servers (the DEBIAN line of demo/neighbours.py, in `bin_dir`); None if one is missing."""
    try:
        debian = Line(DEBIAN, debian_bin=bin_dir)
        return Binaries(prometheus=str(debian.prometheus), alertmanager=str(debian.alertmanager))
    except MissingNeighbourError:
        return None


def _apt_command() -> Sequence[str] | None:
    """apt-get as root, or through passwordless sudo; None when neither is possible."""
    if shutil.which("apt-get") is None:
        return None
    if os.geteuid() == 0:
        return ("apt-get",)
    if shutil.which("sudo") and subprocess.run(("sudo", "-n", "true"), capture_output=True).returncode == 0:
        return ("sudo", "-n", "apt-get")
    return None


def current_binaries() -> Binaries | None:
    """The current line's two servers, or None when either is not built."""
    try:
        current = line(CURRENT)
        return Binaries(prometheus=str(current.prometheus), alertmanager=str(current.alertmanager))
    except MissingNeighbourError:
        return None


def ensure_binaries(install: bool, say: Callable[[str], None], line_name: str = CURRENT) -> Binaries:
    """The servers of line `line_name`, built (current line) or installed (Debian's) first when missing
    and `install` is set."""
    if line_name == CURRENT:
        return _ensure_current(install, say)
    if line_name != DEBIAN:
        raise MissingBinaryError(f"unknown line {line_name!r}: {CURRENT} or {DEBIAN}")
    return _ensure_debian(install, say)


def _ensure_current(install: bool, say: Callable[[str], None]) -> Binaries:
    found = current_binaries()
    if found is not None:
        return found
    if install and shutil.which("go") is not None and os.access(NEIGHBOURS_SCRIPT, os.X_OK):
        say("building Prometheus 3.x and Alertmanager 0.3x with scripts/neighbours (this happens once) ...")
        subprocess.run([str(NEIGHBOURS_SCRIPT)], capture_output=True, timeout=BUILD_TIMEOUT_SECONDS)
        found = current_binaries()
        if found is not None:
            return found
    raise MissingBinaryError(
        "gpupulse-demo runs Prometheus 3.x and Alertmanager 0.3x, which are not built here"
        + ("" if install else " (--no-install)")
        + ": run scripts/setup (it builds them with Go 1.26+ into ~/.cache/gpupulse/neighbours), or run "
        f"gpupulse-demo --neighbours {DEBIAN} for Debian's Prometheus 2.42 and Alertmanager 0.25."
    )


def _ensure_debian(install: bool, say: Callable[[str], None]) -> Binaries:
    found = find_binaries()
    if found is not None:
        return found
    apt = _apt_command() if install else None
    if apt is not None:
        say(f"installing {' '.join(APT_PACKAGES)} with apt-get (this happens once) ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run([*apt, "update", "-q"], env=env, capture_output=True, timeout=APT_TIMEOUT_SECONDS)
        subprocess.run(
            [*apt, "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES],
            env=env,
            capture_output=True,
            timeout=APT_TIMEOUT_SECONDS,
        )
        found = find_binaries()
        if found is not None:
            return found
    raise MissingBinaryError(
        "gpupulse-demo needs Prometheus and Alertmanager: /usr/bin/prometheus and "
        "/usr/bin/prometheus-alertmanager were not found"
        + ("" if apt is not None or not install else " and apt-get cannot run here (not root, no sudo)")
        + ". Install them with `sudo apt-get install prometheus prometheus-alertmanager` "
        "(or run scripts/setup), then run gpupulse-demo again."
    )
