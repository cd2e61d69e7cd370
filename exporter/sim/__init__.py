"""Simulated NVML under pynvml: scenario files drive every pynvml wrapper without a GPU."""

from exporter.sim.clock import ManualClock, RealClock
from exporter.sim.library import (
    SimAlreadyInstalledError,
    SimulatedNvml,
    implemented_symbols,
    install,
    installed,
)
from exporter.sim.scenario import Scenario, ScenarioError, list_scenarios, load_scenario

__all__ = [
    "ManualClock",
    "RealClock",
    "Scenario",
    "ScenarioError",
    "SimAlreadyInstalledError",
    "SimulatedNvml",
    "implemented_symbols",
    "install",
    "installed",
    "list_scenarios",
    "load_scenario",
]
