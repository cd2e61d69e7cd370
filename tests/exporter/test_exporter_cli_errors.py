"""gpupulse-exporter's rough edges a new user hits first: a bad --simulate or --engines.config is one
line and exit 2 (never a traceback), help shows every default (lists as comma lists), and the log
names the port actually bound."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from exporter import cli

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPULSE_")}
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *argv],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(
    ("scenario", "says"),
    [
        ("/nonexistent.yaml", "/nonexistent.yaml: cannot read file: [Errno 2] No such file or directory"),
        ("no-such-scenario", "no-such-scenario: no such scenario; shipped ones: basic,"),
    ],
)
def test_a_scenario_that_cannot_be_loaded_is_one_line_and_exit_2(scenario: str, says: str) -> None:
    proc = run("--simulate", scenario, "--web.listen-address", "127.0.0.1:0")
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith("gpupulse-exporter: error: --simulate: ") and says in line


def test_a_malformed_scenario_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [ {name: H100\n")
    proc = run("--simulate", str(bad), "--web.listen-address", "127.0.0.1:0")
    assert proc.returncode == 2
    assert one_line(proc).startswith(f"gpupulse-exporter: error: --simulate: {bad}")


def test_a_missing_engines_config_fails_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "engines.yaml"
    for proc in (
        run("--simulate", "basic", "--engines.config", str(missing)),
        run("--simulate", "basic", env={"GPUPULSE_ENGINES_CONFIG": str(missing)}),
    ):
        assert proc.returncode == 2
        assert one_line(proc) == f"gpupulse-exporter: error: --engines.config {missing}: no such file"


def test_help_shows_every_default_and_lists_as_comma_lists() -> None:
    text = cli.build_parser(
        dict(cli.registry.available_plugins(skip=set())), cli._otlp_module()
    ).format_help()
    flat = re.sub(r"\s+", " ", text)
    assert "--log.format {json,logfmt,text} log line format (default: text)" in flat
    assert "--log.level {debug,info,warning,error} lowest level logged (default: info)" in flat
    assert re.search(r"--engines\.interval ENGINES_INTERVAL .*?\(default: 5\.0\)", flat)
    assert "(default: gpu.nvidia.com)" in flat
    assert "['" not in text and "(default: None)" not in text
    # a default stated in the help already is not stated twice
    assert "(default: on) (default" not in flat


async def test_the_log_names_the_port_bound_not_0(caplog: pytest.LogCaptureFixture) -> None:
    parser = cli.build_parser({}, None)
    args = parser.parse_args(["--simulate", "basic", "--web.listen-address", "127.0.0.1:0"])
    settings = cli.settings_from_args(args)
    listening = asyncio.Event()
    loop = asyncio.get_running_loop()
    lines: list[str] = []

    class Listening(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("listening on "):
                lines.append(record.getMessage())
                loop.call_soon_threadsafe(listening.set)

    handler = Listening()
    caplog.set_level(logging.INFO, logger="exporter")
    logging.getLogger("exporter").addHandler(handler)
    stop = asyncio.Event()
    task = asyncio.create_task(cli.serve(settings, args, {}, None, stop))
    try:
        await asyncio.wait_for(listening.wait(), 30)
        (line,) = lines
        host, _, port = line.removeprefix("listening on ").rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 200  # the port in the log is the one serving
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
        logging.getLogger("exporter").removeHandler(handler)
