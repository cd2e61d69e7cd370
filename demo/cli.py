"""`gpupulse-demo`: the whole stack on 127.0.0.1, playing an incident scenario.

Starts the exporter (the simulated incident node in this process; on a machine with NVML also the
real exporter for the real node), a simulated vLLM engine, Prometheus and Alertmanager with a fast
copy of our rules, the remediation controller with the local backend, and a pager sink; then
prints alerts, the controller's ledger and pages as they happen. See docs/demo.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from demo.binaries import MissingBinaryError
from demo.costs import cost_summary
from demo.neighbours import CURRENT, DEBIAN, LINES
from demo.pager_sink import ReceivedPage, describe_diagnosis, describe_page
from demo.procs import StartupError, Supervisor, log_tail
from demo.simnode import DEFAULT_SCENARIO
from demo.stack import DemoOptions, Stack, start_stack
from demo.timeline import AlertWatcher, LedgerWatcher, Timeline, watch
from demo.verdict import Check, evaluate, expectations_from

EXIT_OK = 0
EXIT_LADDER_FAILED = 1
EXIT_STARTUP_FAILED = 2
log = logging.getLogger("demo")


def _write_state(path: Path, stack: Stack, world_pid: int) -> None:
    doc = {
        "pid": world_pid,
        "children": stack.supervisor.pids(),
        "urls": stack.urls,
        "workdir": str(stack.workdir),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)


def _show_page(timeline: Timeline, page: ReceivedPage) -> None:
    """A page, then the diagnosis it carries (the controller reads the demo's Prometheus)."""
    timeline.line("PAGE", describe_page(page))
    diagnosis = describe_diagnosis(page)
    if diagnosis is not None:
        timeline.line("DIAGNOSIS", diagnosis)


def _print_costs(timeline: Timeline, lines: Sequence[str]) -> None:
    print("What it cost (from the demo's Prometheus):", file=timeline.out)
    for line in lines:
        print(f"  {line}", file=timeline.out)
    print("", file=timeline.out, flush=True)


def _print_verdict(timeline: Timeline, checks: Sequence[Check], interrupted: bool) -> None:
    print("", file=timeline.out)
    print("What the ladder did" + (" before Ctrl-C:" if interrupted else ":"), file=timeline.out)
    for c in checks:
        status = "ok" if c.ok else ("not yet" if interrupted else "MISSING")
        print(f"  [{status}] {c.name}: {c.detail}", file=timeline.out)
    print("", file=timeline.out, flush=True)


async def run_demo(opts: DemoOptions, stop: asyncio.Event) -> int:
    """Start the stack, play the scenario, stop everything; returns the exit code."""
    timeline = Timeline()
    workdir = Path(tempfile.mkdtemp(prefix="gpupulse-demo-"))
    (workdir / "logs").mkdir()
    logging.basicConfig(
        filename=workdir / "logs" / "demo.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        force=True,
    )
    stack = Stack(workdir, Supervisor(workdir / "logs"), timeline)
    stack.sink.on_page = lambda page: _show_page(timeline, page)
    timeline.line("SETUP", f"starting the stack in {workdir}")
    code = EXIT_OK
    interrupted = False
    try:
        try:
            start = asyncio.ensure_future(start_stack(stack, opts))
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if start not in done:
                start.cancel()
                with contextlib.suppress(BaseException):
                    await start
                timeline.line("STOP", "interrupted during start-up")
                return EXIT_OK
            stopper.cancel()
            prometheus_url, controller_url, world = start.result()
        except (StartupError, MissingBinaryError) as exc:
            print(f"gpupulse-demo: could not start the stack: {exc}", file=sys.stderr, flush=True)
            return EXIT_STARTUP_FAILED
        except Exception as exc:  # any other start-up failure: say what it was, then clean up
            log.exception("start-up failed")
            print(
                f"gpupulse-demo: could not start the stack: {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_STARTUP_FAILED
        for name, url in stack.urls.items():
            timeline.line("URL", f"{name}: {url}")
        timeline.line("PIDS", " ".join(f"{n}={p}" for n, p in stack.supervisor.pids().items()))
        if opts.state_file is not None:
            _write_state(opts.state_file, stack, os.getpid())
        timeline.line(
            "READY",
            f"playing scenario {world.sim.scenario.name}: {world.sim.scenario.description}"
            + (
                f"; stopping after {opts.duration_seconds:.0f} s"
                if opts.duration_seconds
                else "; Ctrl-C stops"
            ),
        )
        offset = world.start_script()
        timeline.line("SCRIPT", f"the scenario's fault times count from now (simulation time {offset:.1f} s)")
        token = (workdir / "controller.token").read_text().strip()
        alerts = AlertWatcher(prometheus_url, timeline)
        ledger = LedgerWatcher(controller_url, token, timeline)
        expect = expectations_from(world)
        watcher = asyncio.create_task(watch(alerts, ledger, stop))
        deadline = time.monotonic() + opts.duration_seconds if opts.duration_seconds else None
        died = False
        played = False
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            dead = [c for c in stack.supervisor.children if not c.running]
            if dead:
                for c in dead:
                    timeline.line(
                        "ERROR", f"{c.name} exited with status {c.proc.returncode}:\n{log_tail(c.log)}"
                    )
                died = True
                break
            if not played and all(
                c.ok for c in evaluate(expect, list(ledger.incidents.values()), stack.sink.pages)
            ):
                played = True
                timeline.line("DONE", played_line(opts))
                if opts.stop_when_verified:
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        interrupted = stop.is_set()
        stop.set()
        await watcher
        checks = evaluate(expect, list(ledger.incidents.values()), stack.sink.pages)
        _print_verdict(timeline, checks, interrupted)
        dra_node = stack.dra_node.node if stack.dra_node is not None else None
        _print_costs(timeline, await cost_summary(prometheus_url, dra_node))
        if interrupted:
            timeline.line("STOP", "interrupted: stopping everything")
        elif died or not all(c.ok for c in checks):
            code = EXIT_LADDER_FAILED
    finally:
        await stack.close(opts.keep_temp)
        timeline.line(
            "STOP", "all components stopped" + (f"; files kept in {workdir}" if opts.keep_temp else "")
        )
    return code


def played_line(opts: DemoOptions) -> str:
    """What the timeline says once the whole ladder has played: that it stops, or why nothing more
    happens (the stack runs on until the duration or Ctrl-C; a silent minute reads as a hang)."""
    if opts.stop_when_verified:
        return "every step of the ladder played; stopping early"
    if opts.duration_seconds:
        seconds = f"{opts.duration_seconds:.0f} s"
        return f"every step of the ladder played; the stack keeps running until the {seconds} are up"
    return "every step of the ladder played; the stack keeps running until Ctrl-C"


def parse_args(argv: Sequence[str] | None) -> DemoOptions:
    """Command line -> DemoOptions."""
    p = argparse.ArgumentParser(prog="gpupulse-demo", description=__doc__)
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long; exit 0 only if the whole ladder played (default: until Ctrl-C)",
    )
    p.add_argument(
        "--stop-when-verified",
        action="store_true",
        help="with --duration: stop as soon as every expected step has been seen",
    )
    p.add_argument(
        "--scenario", type=Path, default=DEFAULT_SCENARIO, help="scenario file (default: %(default)s)"
    )
    p.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="write the PIDs and URLs of everything started here (JSON)",
    )
    p.add_argument("--keep-temp", action="store_true", help="keep configs, logs and databases afterwards")
    p.add_argument(
        "--no-install",
        action="store_true",
        help="never build (scripts/neighbours) or apt-get install a missing Prometheus/Alertmanager",
    )
    p.add_argument(
        "--neighbours",
        choices=LINES,
        default=CURRENT,
        help=f"Prometheus and Alertmanager line: {CURRENT} (built by scripts/neighbours) or {DEBIAN} "
        "(Debian's packages) (default: %(default)s)",
    )
    p.add_argument(
        "--real-gpus",
        choices=("auto", "on", "off"),
        default="auto",
        help="also run the exporter on this machine's GPUs (auto: when NVML loads)",
    )
    a = p.parse_args(argv)
    if a.duration is not None and a.duration <= 0:
        p.error("--duration must be positive")
    return DemoOptions(
        duration_seconds=a.duration,
        stop_when_verified=a.stop_when_verified,
        scenario=a.scenario.resolve(),
        state_file=a.state_file,
        keep_temp=a.keep_temp,
        install_missing=not a.no_install,
        real_gpus=a.real_gpus,
        neighbours=a.neighbours,
    )


async def _main(opts: DemoOptions) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run_demo(opts, stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    opts = parse_args(argv)
    try:
        return asyncio.run(_main(opts))
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
