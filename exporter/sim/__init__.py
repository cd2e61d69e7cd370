"""The simulator: NVML under pynvml driven by scenario files (this package), plus the simulated
inference engines (`engines`, `engine_spec`) and the page-cache scenario player (`pagecache`)."""

from exporter.errors import ScenarioError, SimAlreadyInstalledError
from exporter.sim.clock import ManualClock, RealClock
from exporter.sim.library import SimulatedNvml, implemented_symbols, install, installed
from exporter.sim.scenario import list_scenarios, load_scenario
from exporter.sim.scenario_types import Scenario

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
