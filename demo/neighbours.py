"""The real neighbours tests, replays and the demo run on: the one place that names them.

Two lines: CURRENT (Prometheus 3.x + Alertmanager 0.3x, what kube-prometheus-stack ships), built by
scripts/neighbours from their Go modules, and DEBIAN (Prometheus 2.42 + Alertmanager 0.25 from /usr/bin).

One folder per pin, `<cache>/<name>-<version>/bin/<binary>`, the cache being $GPUPULSE_NEIGHBOURS or
~/.cache/gpupulse/neighbours; the pins live in scripts/neighbours.pins, read here so that a test and the
build agree on the version without a second copy of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PINS = Path(__file__).resolve().parents[1] / "scripts" / "neighbours.pins"


class MissingNeighbourError(Exception):
    """A pinned neighbour has not been built on this machine."""


@dataclass(frozen=True)
class Pin:
    """One line of scripts/neighbours.pins."""

    name: str
    module: str
    version: str
    packages: tuple[str, ...]


def pins(path: Path = PINS) -> dict[str, Pin]:
    """Every pin by name."""
    out: dict[str, Pin] = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        name, module, version, *packages = fields
        out[name] = Pin(name, module, version, tuple(packages))
    return out


def cache_dir() -> Path:
    """The folder scripts/neighbours builds into."""
    explicit = os.environ.get("GPUPULSE_NEIGHBOURS")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpupulse" / "neighbours"


def neighbour_binary(name: str, binary: str | None = None) -> Path:
    """The path of `binary` (default: the pin's own name) of pin `name`, built at its pinned version."""
    pin = pins()[name]
    folder = cache_dir() / f"{pin.name}-{pin.version}"
    path = folder / "bin" / (binary or name)
    if not (folder / ".built").exists() or not os.access(path, os.X_OK):
        raise MissingNeighbourError(
            f"{binary or name} {pin.version} ({pin.module}) is not built here: run scripts/neighbours {name} "
            "(scripts/setup does)"
        )
    return path


# The Debian packages of the second line (bookworm: Prometheus 2.42, Alertmanager 0.25), in /usr/bin.
DEBIAN_BIN = Path("/usr/bin")
DEBIAN_BINARIES = {
    "prometheus": "prometheus",
    "promtool": "promtool",
    "alertmanager": "prometheus-alertmanager",
    "amtool": "amtool",
}
# each binary's pin in scripts/neighbours.pins
PINNED_BINARIES = {
    "prometheus": ("prometheus", "prometheus"),
    "promtool": ("prometheus", "promtool"),
    "alertmanager": ("alertmanager", "alertmanager"),
    "amtool": ("alertmanager", "amtool"),
}
CURRENT = "3.x"  # what our users run (kube-prometheus-stack): replays and the demo run on it
DEBIAN = "2.42"  # Debian's packages: every promtool rule test runs here too, and one replay smoke-tests it
LINES = (CURRENT, DEBIAN)


@dataclass(frozen=True)
class Line:
    """One line of neighbours: a Prometheus with its promtool, an Alertmanager with its amtool.

    Tests, replays and the demo take their binaries from a Line, never from PATH. Each binary is looked
    up when asked for (a promtool test does not need Alertmanager built) and raises
    MissingNeighbourError when absent: a test that needs it fails with that message, it does not skip."""

    name: str  # CURRENT or DEBIAN: what test ids and messages call it
    debian_bin: Path = DEBIAN_BIN

    def binary(self, key: str) -> Path:
        """prometheus, promtool, alertmanager or amtool of this line."""
        if self.name == CURRENT:
            return neighbour_binary(*PINNED_BINARIES[key])
        path = self.debian_bin / DEBIAN_BINARIES[key]
        if not os.access(path, os.X_OK):
            raise MissingNeighbourError(
                f"{path} is missing: Debian's {DEBIAN} line is `apt-get install prometheus "
                "prometheus-alertmanager` (scripts/setup does)"
            )
        return path

    @property
    def prometheus(self) -> Path:
        return self.binary("prometheus")

    @property
    def promtool(self) -> Path:
        return self.binary("promtool")

    @property
    def alertmanager(self) -> Path:
        return self.binary("alertmanager")

    @property
    def amtool(self) -> Path:
        return self.binary("amtool")


def line(name: str = CURRENT) -> Line:
    """Line `name`: CURRENT, the pins scripts/neighbours builds (Prometheus 3.x, Alertmanager 0.3x);
    DEBIAN, Debian's packages in /usr/bin."""
    if name not in LINES:
        raise ValueError(f"unknown line {name!r}: one of {', '.join(LINES)}")
    return Line(name)
