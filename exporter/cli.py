"""`gpupulse-exporter`: node_exporter-style flags, environment equivalents, clean shutdown.

Every long flag has an environment variable: GPUPULSE_ + the flag without dashes, upper-cased, with
`.` and `-` turned into `_` (--web.listen-address -> GPUPULSE_WEB_LISTEN_ADDRESS, --collector.gpm ->
GPUPULSE_COLLECTOR_GPM=false). A flag on the command line wins over its variable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from exporter import gcpolicy, registry
from exporter.collectors.base import Collector
from exporter.collectors.gpus import GpuFleet
from exporter.collectors.plugin import PluginContext
from exporter.collectors.xid import XidCounter
from exporter.config import (
    DEFAULT_PORT,
    ExporterSettings,
    exporter_version,
    parse_listen_address,
)
from exporter.errors import NvmlInitError, ScenarioError, WebConfigError
from exporter.kube import flags as kube_flags
from exporter.kube.context import KubeContext
from exporter.kube.requests import REQUESTS
from exporter.nvml import Nvml, XidWatcher
from exporter.sampler import Sampler, SnapshotHook
from exporter.server import make_app, make_site
from exporter.snapshot import Snapshot
from exporter.webconfig import web_config_from_flag
from gpupulse.cliargs import Parser
from gpupulse.clock import SystemClock
from gpupulse.durations import duration_flag
from gpupulse.logs import FORMATS, LEVELS, setup_logging

log = logging.getLogger("exporter")

EXIT_NO_NVML = 2
EXIT_NVML_UNKNOWN = 3
EXIT_USAGE = 64
# a flag names a file that cannot be used: argparse's exit code for a bad argument
EXIT_BAD_INPUT = 2
SWITCH_INTERVAL_SECONDS = 0.001
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_name(option: str) -> str:
    """The environment variable of a long flag."""
    return "GPUPULSE_" + option.lstrip("-").upper().replace(".", "_").replace("-", "_")


def switched_off(argv: Sequence[str], environ: Mapping[str, str]) -> set[str]:
    """Plug-in collectors turned off by flag or environment: they are not even imported (saves memory)."""
    off: set[str] = set()
    for name in (plugin.name for plugin in registry.PLUGINS):
        value = environ.get(env_name(f"--collector.{name}"), "")
        if value.lower() in _FALSE:
            off.add(name)
        for arg in argv:  # the last flag wins, and flags win over the environment
            if arg == f"--no-collector.{name}":
                off.add(name)
            elif arg == f"--collector.{name}":
                off.discard(name)
    return off


def build_parser(
    plugins: Mapping[str, registry.PluginModule] | None = None,
    otlp: registry.PushModule | None = None,
    also_collectors: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """All flags: core, --collector.<name> for every collector, then the plug-ins' own."""
    d = ExporterSettings()
    p = Parser(
        prog="gpupulse-exporter",
        description="GPU metrics for Prometheus from NVML, sampled in the background and served from memory.",
        epilog="Every flag can also be set by environment: GPUPULSE_ + flag upper-cased, . and - as _. "
        "Durations are Prometheus durations (500ms, 15s, 1m30s) or a bare number of seconds.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument(
        "--web.listen-address",
        dest="web_listen_address",
        default=f"0.0.0.0:{DEFAULT_PORT}",
        help="host:port to serve /metrics on (default: %(default)s)",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default="",
        help="TLS and basic auth, in the Prometheus exporter toolkit's format (tls_server_config, "
        "basic_auth_users, http_server_config); read again when it changes (default: none, plain HTTP)",
    )
    p.add_argument(
        "--sampling.interval",
        dest="sampling_interval",
        type=duration_flag,
        default=d.sampling_interval_seconds,
        help="time between samples, a duration (default: %(default)ss)",
    )
    p.add_argument(
        "--sampling.gpu-timeout",
        dest="sampling_gpu_timeout",
        type=duration_flag,
        default=d.gpu_call_timeout_seconds,
        help="deadline of one GPU's NVML calls per collector, a duration; a slower GPU is marked "
        "stale (default: %(default)ss)",
    )
    p.add_argument(
        "--sampling.slow-interval",
        dest="sampling_slow_interval",
        type=duration_flag,
        default=d.slow_fields_interval_seconds,
        help="time between reads of fields that change slowly, a duration: ECC and remap counters, "
        "NVLink link states, power limit, PCIe link and replays; 0 reads them every sample "
        "(default: %(default)ss)",
    )
    p.add_argument(
        "--simulate",
        dest="simulate",
        default=None,
        metavar="SCENARIO",
        help="serve a simulated GPU node: a shipped scenario name or a YAML path",
    )
    p.add_argument(
        "--simulate.speed",
        dest="simulate_speed",
        type=float,
        default=1.0,
        help="scenario seconds per real second (default: %(default)s)",
    )
    p.add_argument("--log.format", dest="log_format", choices=FORMATS, default="text", help="log line format")
    p.add_argument(
        "--log.level", dest="log_level", choices=LEVELS, default="info", help="lowest level logged"
    )
    names = [*registry.BUILTINS, *(plugins or {}), *also_collectors]
    for name in names:
        p.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"enable the {name} collector (default: on)",
        )
    kube_flags.add_arguments(p)  # shared by the plug-ins; there whichever are on
    for mod in (plugins or {}).values():
        mod.add_arguments(p)
    if otlp is not None:
        otlp.add_arguments(p)
    return p


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default unless it names one already; lists as comma lists."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is argparse.SUPPRESS or isinstance(default, bool):
            return text
        if isinstance(default, list | tuple):
            shown = ",".join(str(d) for d in default) or "none"
        else:
            shown = str(default)
        if not shown:
            return text
        return f"{text} (default: {shown.replace('%', '%%')})"


def apply_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Turn GPUPULSE_* variables into flag defaults; raises ValueError on a malformed value."""
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if not longs or action.dest in ("help",):
            continue
        name = env_name(longs[0])
        if name not in environ:
            continue
        raw = environ[name]
        value: Any
        if isinstance(action, argparse.BooleanOptionalAction | argparse._StoreTrueAction):
            if raw.lower() not in _TRUE | _FALSE:
                raise ValueError(f"{name}={raw!r}: expected true or false")
            value = raw.lower() in _TRUE
        else:
            value = action.type(raw) if callable(action.type) else raw
            if action.choices is not None and value not in action.choices:
                raise ValueError(f"{name}={raw!r}: expected one of {list(action.choices)}")
        action.default = value


def settings_from_args(args: argparse.Namespace) -> ExporterSettings:
    """Typed settings from parsed flags; raises ValueError."""
    host, port = parse_listen_address(args.web_listen_address)
    return ExporterSettings(
        listen_host=host,
        listen_port=port,
        sampling_interval_seconds=args.sampling_interval,
        gpu_call_timeout_seconds=min(args.sampling_gpu_timeout, args.sampling_interval),
        collector_timeout_seconds=max(2.0, 2 * args.sampling_interval),
        slow_fields_interval_seconds=args.sampling_slow_interval,
        simulate=args.simulate,
        simulate_speed=args.simulate_speed,
        log_format=args.log_format,
        log_level=args.log_level,
    )


def _otlp_module() -> registry.PushModule:
    return registry.load_otlp()


@dataclass
class Exporter:
    """Everything one running exporter holds, in start order, so it can be stopped in reverse."""

    settings: ExporterSettings
    sampler: Sampler
    fleet: GpuFleet
    nvml: Nvml
    watcher: XidWatcher | None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    uninstall: Callable[[], None] | None = None

    async def close(self) -> None:
        """Stop sampling, the XID thread and the workers; shut NVML down unless a call is wedged."""
        await self.sampler.close()
        for closer in self.closers:
            with contextlib.suppress(Exception):
                await closer()
        threads_done = await asyncio.to_thread(self._stop_threads)
        if threads_done:
            self.nvml.shutdown()
        else:
            log.warning("an NVML call is still running; skipping nvmlShutdown so exit does not hang")
        if self.uninstall is not None:
            self.uninstall()

    def _stop_threads(self) -> bool:
        ok = self.watcher.stop() if self.watcher is not None else True
        return self.fleet.close() and ok


def _install_simulation(settings: ExporterSettings) -> Callable[[], None]:
    from exporter.sim import install
    from exporter.sim.clock import RealClock
    from exporter.sim.scenario import load_scenario

    assert settings.simulate is not None
    sim = install(load_scenario(settings.simulate), RealClock(settings.simulate_speed))
    return sim.uninstall


async def start_exporter(
    settings: ExporterSettings,
    args: argparse.Namespace,
    plugins: Mapping[str, registry.PluginModule],
    otlp: registry.PushModule | None = None,
) -> Exporter:
    """Init NVML (or the simulation), discover GPUs, build collectors and sampler; raises NvmlInitError."""
    uninstall = _install_simulation(settings) if settings.simulate else None
    nvml = Nvml()
    try:
        await asyncio.to_thread(nvml.init)
        await asyncio.to_thread(nvml.discover)
    except BaseException:
        if uninstall is not None:
            uninstall()
        raise
    clock = SystemClock()
    fleet = GpuFleet(nvml, clock, settings.gpu_call_timeout_seconds)
    xids = XidCounter()
    watcher = XidWatcher(nvml.devices, xids.add, asyncio.get_running_loop(), settings.xid_wait_timeout_ms)
    watcher.start()
    ctx = registry.BuiltinContext(fleet=fleet, xids=xids, settings=settings)
    # one pod store for every plug-in that reads this node's pods (main checked the flags already)
    kube = kube_flags.api_settings(args) if registry.reads_kube(plugins) else None
    shared = PluginContext(KubeContext(kube))
    collectors: list[Collector] = registry.build_builtins(args, ctx) + registry.build_plugins(
        args, dict(plugins), shared
    )
    hooks: list[SnapshotHook] = []
    # the sampler closes the plug-ins first, then these run: the shared watch outlives its readers
    closers: list[Callable[[], Awaitable[None]]] = [shared.close]
    pusher = otlp.from_args(args) if otlp is not None else None
    if pusher is not None:

        async def push(snap: Snapshot) -> None:
            await pusher.push(snap.families)

        hooks.append(push)
        closers.append(pusher.close)
    sampler = Sampler(collectors, settings, clock, gpu_status=fleet, hooks=hooks, kube_requests=REQUESTS)
    log.info(
        "sampling %d GPU(s) every %.2f s with collectors %s",
        len(nvml.devices),
        settings.sampling_interval_seconds,
        ", ".join(c.name for c in collectors),
    )
    return Exporter(settings, sampler, fleet, nvml, watcher, closers, uninstall)


async def serve(
    settings: ExporterSettings,
    args: argparse.Namespace,
    plugins: Mapping[str, registry.PluginModule],
    otlp: registry.PushModule | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or `stop`); returns the exit code."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        return await _serve(settings, args, plugins, otlp, stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


SWITCH_INTERVAL_SECONDS = 0.0005


class SamplingThread:
    """The sampler on its own thread and event loop, so a tick never holds up the serving loop.

    The serving loop only reads `sampler.snapshot` (one reference, swapped whole) and `ready()`.
    """

    def __init__(
        self,
        settings: ExporterSettings,
        args: argparse.Namespace,
        plugins: Mapping[str, registry.PluginModule],
        otlp: registry.PushModule | None,
        on_done: Callable[[], object] | None = None,
    ) -> None:
        self._start = (settings, args, plugins, otlp)
        self._on_done = on_done
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="gpupulse-sampler", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.exporter: Exporter | None = None
        self.error: BaseException | None = None

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            try:
                self.exporter = loop.run_until_complete(start_exporter(*self._start))
            except BaseException as exc:
                self.error = exc
                return
            finally:
                self._stop = asyncio.Event()
                self._started.set()
            try:
                loop.run_until_complete(self.exporter.sampler.run(self._stop))
            finally:
                if self._on_done is not None:
                    with contextlib.suppress(RuntimeError):  # the serving loop may be gone already
                        self._on_done()  # sampling stopped by itself (fatal): stop serving too
                loop.run_until_complete(self.exporter.close())
        finally:
            loop.close()

    async def start(self) -> Exporter:
        """Start the thread and wait until NVML is up and the collectors exist; re-raises start errors."""
        # A thread running Python keeps the GIL up to the switch interval (5 ms by default) while
        # another waits for it: a scrape arriving during a tick waited that long. With a shorter
        # interval the serving loop gets the GIL back within it.
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        self._thread.start()
        await asyncio.to_thread(self._started.wait)
        if self.error is not None:
            await asyncio.to_thread(self._thread.join)
            raise self.error
        assert self.exporter is not None
        return self.exporter

    async def stop(self) -> None:
        """Stop sampling, close everything on the sampler loop, and wait for the thread."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join)


def _bound(runner: web.AppRunner, settings: ExporterSettings) -> str:
    """host:port the server is bound to (the real port when :0 was asked for)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            host = str(address[0])
            return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return f"{settings.listen_host}:{settings.listen_port}"


async def _serve(
    settings: ExporterSettings,
    args: argparse.Namespace,
    plugins: Mapping[str, registry.PluginModule],
    otlp: registry.PushModule | None,
    stop: asyncio.Event,
) -> int:
    # A short switch interval hands the GIL to the serving loop quickly while the sampler computes.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    loop = asyncio.get_running_loop()
    sampling = SamplingThread(
        settings, args, plugins, otlp, on_done=lambda: loop.call_soon_threadsafe(stop.set)
    )
    exporter = await sampling.start()
    web_config = web_config_from_flag(args.web_config_file)
    runner = web.AppRunner(make_app(exporter.sampler, web_config), access_log=None)
    collecting: asyncio.Task[None] | None = None
    try:
        await runner.setup()
        site = make_site(
            runner,
            settings.listen_host,
            settings.listen_port,
            ssl_context=web_config.context if web_config is not None else None,
        )
        await site.start()
        # What start-up made lives for the whole run: frozen out of the collector's scans, so a full
        # collection stays short; one a minute frees the cycles that died old (exporter/gcpolicy.py).
        gcpolicy.freeze_startup()
        collecting = asyncio.create_task(gcpolicy.collect_periodically())
        log.info("listening on %s", _bound(runner, settings))
        await stop.wait()
    finally:
        log.info("shutting down")
        if collecting is not None:
            collecting.cancel()
        await runner.cleanup()
        await sampling.stop()
    if exporter.sampler.fatal is not None:
        log.error("exiting so the orchestrator restarts the container: %s", exporter.sampler.fatal)
        return EXIT_NVML_UNKNOWN
    return 0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Console entry point."""
    env = os.environ if environ is None else environ
    off = switched_off(sys.argv[1:] if argv is None else argv, env)
    plugins = registry.available_plugins(skip=off)
    otlp = _otlp_module()
    parser = build_parser(plugins, otlp, also_collectors=sorted(off))
    try:
        apply_environment(parser, env)
    except ValueError as exc:
        parser.error(str(exc))
    args = parser.parse_args(argv)
    if args.version:
        print(f"gpupulse-exporter {exporter_version()}")
        return 0
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    engines_config = getattr(args, "engines_config", None)
    if engines_config is not None and not os.access(engines_config, os.R_OK):
        why = "no such file" if not os.path.exists(engines_config) else "not readable"
        print(f"gpupulse-exporter: error: --engines.config {engines_config}: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    setup_logging(settings.log_format, settings.log_level)
    try:
        # deprecated --<plug-in>.* Kubernetes flags warn here, once; disagreeing ones are refused
        if registry.reads_kube(plugins):
            kube_flags.api_settings(args, warn=True)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        web_config_from_flag(args.web_config_file)  # a bad file fails here, before any sampling starts
    except WebConfigError as exc:
        parser.error(str(exc))
    try:
        return asyncio.run(serve(settings, args, plugins, otlp))
    except ScenarioError as exc:
        flat = " ".join(str(exc).split())  # a YAML error spans lines: keep it one
        print(f"gpupulse-exporter: error: --simulate: {flat}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NvmlInitError as exc:
        if exc.unknown:
            log.error(
                "NVML init failed with Unknown Error (%s). In a container this usually means the device "
                "cgroup lost access to /dev/nvidia* (e.g. after systemctl daemon-reload); exiting so the "
                "orchestrator restarts the container.",
                exc,
            )
            return EXIT_NVML_UNKNOWN
        if exc.unavailable:
            log.error(
                "NVML is not available on this host (%s): no NVIDIA driver or libnvidia-ml.so.1. "
                "To try the exporter without a GPU run: gpupulse-exporter --simulate demo",
                exc,
            )
        else:
            log.error("NVML init failed: %s", exc)
        return EXIT_NO_NVML
    except OSError as exc:
        log.error("cannot serve on %s: %s", args.web_listen_address, exc)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
