"""Scrape targets and the static YAML config that lists them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from exporter.engines.detect import KINDS
from exporter.errors import ConfigError

AUTO = "auto"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """One engine metrics endpoint and what we know about its owner."""

    url: str
    kind: str = AUTO  # an engine kind or "auto"
    model: str = ""  # overrides the engine's model label when it serves one model (or none)
    namespace: str = ""
    pod: str = ""
    pid: int | None = None  # host PID of the process listening on the port, when known

    @property
    def port(self) -> int | None:
        """TCP port of the URL (scheme default when absent)."""
        parts = urlsplit(self.url)
        if parts.port is not None:
            return parts.port
        return {"http": 80, "https": 443}.get(parts.scheme)


def _target(entry: Any, where: str) -> Target:
    if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
        raise ConfigError(f"{where}: each entry needs a `url` string")
    kind = str(entry.get("engine", entry.get("kind", AUTO)))
    if kind != AUTO and kind not in KINDS:
        raise ConfigError(f"{where}: engine {kind!r} is not one of {', '.join((AUTO, *KINDS))}")
    pid = entry.get("pid")
    if pid is not None and not isinstance(pid, int):
        raise ConfigError(f"{where}: pid must be an integer")
    parts = urlsplit(entry["url"])
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: url {entry['url']!r} is not an http(s) URL")
    return Target(
        url=entry["url"],
        kind=kind,
        model=str(entry.get("model", "")),
        namespace=str(entry.get("namespace", "")),
        pod=str(entry.get("pod", "")),
        pid=pid,
    )


def load_config(path: Path) -> list[Target]:
    """Read a static engines config: a list of entries, or a mapping with an `engines` list."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    entries = doc.get("engines") if isinstance(doc, dict) else doc
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: expected a list of engines")
    return [_target(e, f"{path}[{i}]") for i, e in enumerate(entries)]


class StaticSource:
    """Targets from the config file, re-read when its modification time changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._mtime = -1.0
        self._targets: list[Target] = []

    async def targets(self) -> list[Target]:
        """Current targets; a config that became invalid keeps the last good list."""
        try:
            mtime = self._path.stat().st_mtime
        except OSError:
            return self._targets
        if mtime != self._mtime:
            try:
                self._targets = load_config(self._path)
            except ConfigError as exc:
                if self._mtime < 0:
                    raise  # never loaded: the collector reports the failure
                log.warning("keeping the previous engine targets: %s", exc)
            self._mtime = mtime
        return self._targets

    async def close(self) -> None:
        """Nothing to release."""
