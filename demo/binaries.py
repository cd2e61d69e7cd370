"""Find Debian's prometheus and alertmanager, installing them with apt-get when missing and allowed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PACKAGES = {"prometheus": ("prometheus",), "alertmanager": ("prometheus-alertmanager", "alertmanager")}
APT_PACKAGES = ("prometheus", "prometheus-alertmanager")
APT_TIMEOUT_SECONDS = 600.0


class MissingBinaryError(Exception):
    """Prometheus or Alertmanager is not installed and could not be installed."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the two servers the demo runs."""

    prometheus: str
    alertmanager: str


def find_binaries(which: Callable[[str], str | None] = shutil.which) -> Binaries | None:
    """Both paths, or None when either is missing."""
    found: dict[str, str] = {}
    for key, names in PACKAGES.items():
        for name in names:
            path = which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
            if path:
                found[key] = path
                break
    if len(found) != len(PACKAGES):
        return None
    return Binaries(prometheus=found["prometheus"], alertmanager=found["alertmanager"])


def _apt_command() -> Sequence[str] | None:
    """apt-get as root, or through passwordless sudo; None when neither is possible."""
    if shutil.which("apt-get") is None:
        return None
    if os.geteuid() == 0:
        return ("apt-get",)
    if shutil.which("sudo") and subprocess.run(("sudo", "-n", "true"), capture_output=True).returncode == 0:
        return ("sudo", "-n", "apt-get")
    return None


def ensure_binaries(install: bool, say: Callable[[str], None]) -> Binaries:
    """Find the binaries, installing the Debian packages first when missing and `install` is set."""
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
