"""Which collectors exist: the NVML ones built in, plus plug-in modules imported when present.

A plug-in module exposes `add_arguments(parser)` and `from_args(args) -> Collector | None` (None =
disabled). Adding one is one line in PLUGINS.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import ModuleType

from exporter.collectors.base import Collector
from exporter.collectors.device import DeviceCollector
from exporter.collectors.gpm import GpmCollector
from exporter.collectors.gpus import GpuFleet
from exporter.collectors.health import HealthCollector
from exporter.collectors.mig import MigCollector
from exporter.collectors.nvlink import NvLinkCollector
from exporter.collectors.processes import ProcessesCollector
from exporter.collectors.xid import XidCounter
from exporter.config import ExporterSettings

log = logging.getLogger(__name__)


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

# (collector name, module path)
PLUGINS: tuple[tuple[str, str], ...] = (
    ("attribution", "exporter.attribution.collector"),
    ("engines", "exporter.engines.collector"),
    ("pagecache", "exporter.pagecache.collector"),
)

OTLP_MODULE = "exporter.otlp.push"


def load_plugin(module: str) -> ModuleType | None:
    """The module when it imports and has the plug-in functions; None otherwise."""
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        log.debug("plug-in %s not available: %s", module, exc)
        return None
    if not (hasattr(mod, "add_arguments") and hasattr(mod, "from_args")):
        return None
    return mod


def available_plugins(skip: Collection[str] = ()) -> dict[str, ModuleType]:
    """Plug-ins present in this installation, by collector name; names in `skip` are not imported."""
    found: dict[str, ModuleType] = {}
    for name, module in PLUGINS:
        if name in skip:
            continue
        mod = load_plugin(module)
        if mod is not None:
            found[name] = mod
    return found


def enabled(args: argparse.Namespace, name: str) -> bool:
    """--collector.<name> / --no-collector.<name>, on unless turned off."""
    return bool(getattr(args, f"collector_{name}", True))


def build_builtins(args: argparse.Namespace, ctx: BuiltinContext) -> list[Collector]:
    """The enabled NVML collectors."""
    return [factory(ctx) for name, factory in BUILTINS.items() if enabled(args, name)]


def build_plugins(args: argparse.Namespace, plugins: dict[str, ModuleType]) -> list[Collector]:
    """The enabled plug-in collectors whose from_args returned one."""
    out: list[Collector] = []
    for name, mod in plugins.items():
        if not enabled(args, name):
            continue
        collector = mod.from_args(args)
        if collector is not None:
            out.append(collector)
    return out
