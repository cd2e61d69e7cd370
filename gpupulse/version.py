"""The installed gpupulse version, from the package metadata: what every program's --version prints."""

from __future__ import annotations

import importlib.metadata

UNKNOWN = "0.0.0+unknown"  # run from a checkout that was never installed


def package_version() -> str:
    """The version of the installed `gpupulse` distribution."""
    try:
        return importlib.metadata.version("gpupulse")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN
