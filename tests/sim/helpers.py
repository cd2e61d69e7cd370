"""Small helpers shared by the simulated NVML tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as N

from exporter.sim import SimulatedNvml

Installer = Callable[..., SimulatedNvml]


def handles() -> list[Any]:
    """Handles of every simulated GPU, by index."""
    return [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
