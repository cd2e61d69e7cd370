"""Fixtures for the simulated NVML tests: install a scenario on a ManualClock, always uninstall."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml as N
import pytest

from exporter.sim import ManualClock, SimulatedNvml, install, load_scenario
from exporter.sim.scenario import Scenario, parse_scenario
from tests.sim.helpers import Installer


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sim(clock: ManualClock) -> Iterator[Installer]:
    """Call with a shipped scenario name or a dict; NVML is initialised for you."""
    installed: list[SimulatedNvml] = []

    def start(scenario: str | dict[str, Any] | Scenario, *, init: bool = True) -> SimulatedNvml:
        if isinstance(scenario, str):
            scenario = load_scenario(scenario)
        elif isinstance(scenario, dict):
            scenario = parse_scenario(scenario, source="<test>")
        nv = install(scenario, clock)
        installed.append(nv)
        if init:
            N.nvmlInit()
        return nv

    yield start
    for nv in installed:
        nv.uninstall()
