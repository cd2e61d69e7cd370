"""Flag helpers shared by the plug-in collectors: --path.procfs (once), comma lists, --collector.<name>."""

from __future__ import annotations

import argparse
import contextlib

from exporter.host.procfs import DEFAULT_PROCFS


def add_procfs_argument(parser: argparse.ArgumentParser) -> None:
    """Add node_exporter's --path.procfs once, whichever plug-in (or the core) asks first."""
    with contextlib.suppress(argparse.ArgumentError):
        parser.add_argument(
            "--path.procfs",
            dest="path_procfs",
            default=DEFAULT_PROCFS,
            help="procfs mount point; the host's /proc mounted into the container (default: %(default)s)",
        )


def csv_list(value: str) -> list[str]:
    """Split a comma-separated flag value, dropping empty items."""
    return [item.strip() for item in value.split(",") if item.strip()]


def collector_enabled(args: argparse.Namespace, name: str) -> bool:
    """Honour exporter-core's --collector.<name> / --no-collector.<name> when it defines them."""
    return bool(getattr(args, f"collector_{name}", True))
