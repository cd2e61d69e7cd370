"""Which collectors exist: the NVML ones built in (BUILTINS), plus the plug-in modules (PLUGINS).

A plug-in module exposes `add_arguments(parser)` and `from_args(args, ctx) -> Collector | None` (None =
disabled); `ctx` (exporter/collectors/plugin.py) holds what plug-ins share, such as the one pod store
of this node. Adding one is a loader (a plain import) and one line in PLUGINS. It sits above the collector
packages it lists (exporter-layers in pyproject.toml).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import Metric

from exporter.collectors.base import Collector
from exporter.collectors.device import DeviceCollector
from exporter.collectors.flags import collector_enabled
from exporter.collectors.gpm import GpmCollector
from exporter.collectors.gpus import GpuFleet
from exporter.collectors.health import HealthCollector
from exporter.collectors.mig import MigCollector
from exporter.collectors.nvlink import NvLinkCollector
from exporter.collectors.plugin import PluginContext
from exporter.collectors.processes import ProcessesCollector
from exporter.collectors.xid import XidCounter
from exporter.config import ExporterSettings


@dataclass(frozen=True)
class BuiltinContext:
    """What the NVML collectors are built from."""

    fleet: GpuFleet
    xids: XidCounter
    settings: ExporterSettings


BUILTINS: dict[str, Callable[[BuiltinContext], Collector]] = {
    "device": lambda ctx: DeviceCollector(ctx.fleet, ctx.settings.slow_fields_interval_seconds),
    "gpm": lambda ctx: GpmCollector(ctx.fleet),
    "health": lambda ctx: HealthCollector(ctx.fleet, ctx.xids, ctx.settings.slow_fields_interval_seconds),
    "nvlink": lambda ctx: NvLinkCollector(ctx.fleet, ctx.settings.slow_fields_interval_seconds),
    "processes": lambda ctx: ProcessesCollector(ctx.fleet, ctx.settings.process_sample_window_seconds),
    "mig": lambda ctx: MigCollector(ctx.fleet),
}


class PluginModule(Protocol):
    """What a plug-in module provides: its own flags, and its collector built from them and the
    shared context."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def from_args(self, args: argparse.Namespace, ctx: PluginContext) -> Collector | None: ...


# Each loader is a plain import, run only when the plug-in is on: a switched-off plug-in's module
# (and what it pulls in: h2 for the kubelet, the API watch client) is never imported, saving memory.
def _attribution() -> PluginModule:
    from exporter.attribution import collector

    return collector


def _engines() -> PluginModule:
    from exporter.engines import collector

    return collector


def _pagecache() -> PluginModule:
    from exporter.pagecache import collector

    return collector


def _progress() -> PluginModule:
    from exporter.progress import collector

    return collector


@dataclass(frozen=True)
class Plugin:
    """A plug-in collector: its --collector.<name>, how to import it, and whether it reads the
    Kubernetes API (the shared pod store and --kube.* settings are made only when one that does is on)."""

    name: str
    load: Callable[[], PluginModule]
    kube: bool = False


PLUGINS: tuple[Plugin, ...] = (
    Plugin("attribution", _attribution, kube=True),
    Plugin("engines", _engines, kube=True),
    Plugin("pagecache", _pagecache),
    Plugin("progress", _progress, kube=True),
)


def reads_kube(names: Collection[str]) -> bool:
    """Whether any of these plug-ins (those loaded) reads the Kubernetes API."""
    return any(plugin.kube and plugin.name in names for plugin in PLUGINS)


class Pusher(Protocol):
    """The OTLP pusher's surface the exporter uses."""

    async def push(self, families: Sequence[Metric]) -> None: ...

    async def close(self) -> None: ...


class PushModule(Protocol):
    """What the OTLP push module provides: its flags, and a pusher when an endpoint is set."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def from_args(self, args: argparse.Namespace) -> Pusher | None: ...


def load_otlp() -> PushModule:
    """The OTLP push module (imported here, once the exporter starts)."""
    from exporter.otlp import push

    return push


def available_plugins(skip: Collection[str] = ()) -> dict[str, PluginModule]:
    """The plug-in modules, by collector name; names in `skip` are not imported."""
    return {plugin.name: plugin.load() for plugin in PLUGINS if plugin.name not in skip}


def enabled(args: argparse.Namespace, name: str) -> bool:
    """--collector.<name> / --no-collector.<name>, on unless turned off."""
    return collector_enabled(args, name)


def build_builtins(args: argparse.Namespace, ctx: BuiltinContext) -> list[Collector]:
    """The enabled NVML collectors."""
    return [factory(ctx) for name, factory in BUILTINS.items() if enabled(args, name)]


def build_plugins(
    args: argparse.Namespace, plugins: dict[str, PluginModule], ctx: PluginContext
) -> list[Collector]:
    """The enabled plug-in collectors whose from_args returned one, all built on the same context."""
    out: list[Collector] = []
    for name, mod in plugins.items():
        if not enabled(args, name):
            continue
        collector = mod.from_args(args, ctx)
        if collector is not None:
            out.append(collector)
    return out
