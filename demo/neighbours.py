"""Where scripts/neighbours puts the real neighbours it builds from their Go modules.

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
