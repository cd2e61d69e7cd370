"""The simulated GPU node, run inside the orchestrator so that actions can change it.

It is the real exporter (exporter.cli's SamplingThread, collectors, sampler and /metrics app) over
the simulated NVML, plus the demo's pod attribution; only the process it lives in differs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from aiohttp import web

from demo.podattr import as_plugin
from demo.world import DemoSpec, World, parse_demo_spec
from exporter import registry
from exporter.cli import SamplingThread, build_parser, settings_from_args
from exporter.server import make_app
from exporter.sim import RealClock, Scenario, SimulatedNvml, install, load_scenario
from exporter.sim.scenario import SCENARIO_DIR

# shipped with the other scenarios, so `gpupulse-exporter --simulate incident-demo` plays it too
DEFAULT_SCENARIO = SCENARIO_DIR / "incident-demo.yaml"


@dataclass
class SimNode:
    """A running simulated node: the world, its exporter thread and its /metrics server."""

    world: World
    sim: SimulatedNvml
    sampling: SamplingThread
    runner: web.AppRunner
    port: int
    tick_task: asyncio.Task[None] | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    async def close(self) -> None:
        """Stop the world's clock task, the server, the sampler thread, then the simulation."""
        if self.tick_task is not None:
            self.tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.tick_task
        await self.runner.cleanup()
        await self.sampling.stop()
        self.sim.uninstall()


async def _tick(world: World, period_seconds: float) -> None:
    while True:
        world.tick()
        await asyncio.sleep(period_seconds)


def load_demo_scenario(path: Path) -> tuple[Scenario, DemoSpec]:
    """The scenario for the simulated NVML and the demo's own sections of the same file."""
    return load_scenario(str(path)), parse_demo_spec(yaml.safe_load(path.read_text()))


async def start_sim_node(
    scenario_path: Path,
    engines_config: Path | None,
    log: Callable[[str], None],
    tick_seconds: float = 0.25,
) -> SimNode:
    """Install the simulation, start the exporter on a free 127.0.0.1 port; the world starts ticking."""
    scenario, spec = load_demo_scenario(scenario_path)
    sim = install(scenario, RealClock())
    try:
        world = World(sim, spec, log)
        plugins: dict[str, registry.PluginModule] = {"demo_pods": as_plugin(world)}
        argv = ["--web.listen-address", "127.0.0.1:0", "--sampling.interval", "1"]
        if engines_config is not None:
            plugins["engines"] = registry.available_plugins(skip={"attribution", "pagecache"})["engines"]
            argv += ["--engines.config", str(engines_config), "--engines.interval", "2"]
        args = build_parser(plugins).parse_args(argv)
        settings = settings_from_args(args)
        sampling = SamplingThread(settings, args, plugins, None)
        exporter = await sampling.start()
    except BaseException:
        sim.uninstall()
        raise
    runner = web.AppRunner(make_app(exporter.sampler), access_log=None)
    try:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
    except BaseException:
        await runner.cleanup()
        await sampling.stop()
        sim.uninstall()
        raise
    node = SimNode(world, sim, sampling, runner, int(runner.addresses[0][1]))
    node.tick_task = asyncio.create_task(_tick(world, tick_seconds))
    return node
