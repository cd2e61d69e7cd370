"""Fixtures for the demo tests: the demo scenario installed on a ManualClock, always uninstalled."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml as N
import pytest

from demo.simnode import DEFAULT_SCENARIO, load_demo_scenario
from demo.world import World
from exporter.sim import ManualClock, SimulatedNvml, install


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sim(clock: ManualClock) -> Iterator[SimulatedNvml]:
    """The demo scenario's simulated NVML, initialised."""
    scenario, _ = load_demo_scenario(DEFAULT_SCENARIO)
    nv = install(scenario, clock)
    N.nvmlInit()
    try:
        yield nv
    finally:
        N.nvmlShutdown()
        nv.uninstall()


@pytest.fixture
def world(sim: SimulatedNvml) -> World:
    """The demo world over the installed simulation."""
    _, spec = load_demo_scenario(DEFAULT_SCENARIO)
    w = World(sim, spec)
    w.start_script()  # at scenario time 0: the script's times are the file's times
    return w
