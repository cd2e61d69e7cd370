"""gpupulse-exporter: flags, environment variables, NVML start-up failures, serving and shutdown."""

from __future__ import annotations

import argparse
import asyncio
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from exporter import cli
from exporter.config import DEFAULT_PORT
from exporter.errors import NvmlInitError
from exporter.nvml import Nvml

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(argv: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    parser = cli.build_parser({}, None)
    cli.apply_environment(parser, environ or {})
    return parser.parse_args(argv)


def test_defaults() -> None:
    args = parse([])
    settings = cli.settings_from_args(args)
    assert (settings.listen_host, settings.listen_port) == ("0.0.0.0", DEFAULT_PORT)
    assert DEFAULT_PORT not in (9400, 9835, 9445)  # dcgm-exporter, nvidia_gpu_exporter, mindprince
    assert settings.sampling_interval_seconds == 1.0
    assert all(
        getattr(args, f"collector_{n}") for n in ("device", "gpm", "health", "nvlink", "processes", "mig")
    )


def test_flags_override_defaults() -> None:
    args = parse(
        [
            "--web.listen-address",
            "[::1]:9999",
            "--sampling.interval",
            "2.5",
            "--no-collector.gpm",
            "--log.format",
            "json",
            "--simulate",
            "demo",
            "--simulate.speed",
            "4",
        ]
    )
    settings = cli.settings_from_args(args)
    assert (settings.listen_host, settings.listen_port) == ("::1", 9999)
    assert settings.sampling_interval_seconds == 2.5
    assert args.collector_gpm is False and args.collector_device is True
    assert (settings.log_format, settings.simulate, settings.simulate_speed) == ("json", "demo", 4.0)


def test_environment_variables_set_defaults_and_flags_win() -> None:
    env = {
        "GPUPULSE_WEB_LISTEN_ADDRESS": "127.0.0.1:1234",
        "GPUPULSE_COLLECTOR_NVLINK": "false",
        "GPUPULSE_SAMPLING_INTERVAL": "0.5",
        "GPUPULSE_SIMULATE": "basic",
    }
    args = parse([], env)
    assert args.web_listen_address == "127.0.0.1:1234"
    assert args.collector_nvlink is False
    assert args.sampling_interval == 0.5
    assert args.simulate == "basic"
    args = parse(["--collector.nvlink", "--sampling.interval", "3"], env)
    assert args.collector_nvlink is True and args.sampling_interval == 3.0


def test_env_name_rule() -> None:
    assert cli.env_name("--web.listen-address") == "GPUPULSE_WEB_LISTEN_ADDRESS"
    assert cli.env_name("--collector.gpm") == "GPUPULSE_COLLECTOR_GPM"


@pytest.mark.parametrize(
    ("name", "value"), [("GPUPULSE_COLLECTOR_GPM", "maybe"), ("GPUPULSE_LOG_FORMAT", "xml")]
)
def test_malformed_environment_value_is_rejected(name: str, value: str) -> None:
    parser = cli.build_parser({}, None)
    with pytest.raises(ValueError, match=name):
        cli.apply_environment(parser, {name: value})


def test_bad_listen_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--web.listen-address", "nonsense"], environ={})
    assert exc.value.code == 2
    assert "host:port" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"], environ={}) == 0
    assert capsys.readouterr().out.startswith("gpupulse-exporter ")


def test_plugin_modules_get_collector_flags_and_their_own() -> None:
    class Plugin:
        @staticmethod
        def add_arguments(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("--fakeplug.url", dest="fakeplug_url", default="x")

        @staticmethod
        def from_args(args: argparse.Namespace, ctx: object) -> None:
            return None

    parser = cli.build_parser({"fakeplug": Plugin}, None)  # type: ignore[dict-item]
    cli.apply_environment(parser, {"GPUPULSE_FAKEPLUG_URL": "http://y"})
    args = parser.parse_args(["--no-collector.fakeplug"])
    assert args.collector_fakeplug is False and args.fakeplug_url == "http://y"


def test_unknown_error_at_init_exits_non_zero_with_a_clear_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Nvml) -> None:
        raise NvmlInitError("nvmlInitWithFlags: Unknown Error", unavailable=False, unknown=True)

    monkeypatch.setattr(Nvml, "init", broken)
    monkeypatch.setattr(cli, "setup_logging", lambda *a: None)
    with caplog.at_level(logging.ERROR):
        code = cli.main(["--web.listen-address", f"127.0.0.1:{free_port()}"], environ={})
    assert code == cli.EXIT_NVML_UNKNOWN
    assert "device cgroup" in caplog.text


def test_nvml_unknown_error_is_classified_for_init(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def fail(flags: int) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlInitWithFlags", fail)
    with pytest.raises(NvmlInitError) as exc:
        Nvml().init()
    assert exc.value.unknown and not exc.value.unavailable


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has NVML")
def test_without_nvml_it_says_so_and_suggests_simulate(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "setup_logging", lambda *a: None)
    with caplog.at_level(logging.ERROR):
        code = cli.main(["--web.listen-address", f"127.0.0.1:{free_port()}"], environ={})
    assert code == cli.EXIT_NO_NVML
    assert "--simulate demo" in caplog.text


async def _get(url: str, deadline_seconds: float = 20.0) -> tuple[int, str]:
    deadline = time.monotonic() + deadline_seconds
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as resp:
                    if resp.status == 200 or time.monotonic() > deadline:
                        return resp.status, await resp.text()
            except aiohttp.ClientConnectionError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)


async def test_serve_simulated_scenario_and_stop_cleanly() -> None:
    port = free_port()
    args = parse(
        ["--simulate", "basic", "--web.listen-address", f"127.0.0.1:{port}", "--sampling.interval", "0.2"]
    )
    settings = cli.settings_from_args(args)
    stop = asyncio.Event()
    task = asyncio.create_task(cli.serve(settings, args, {}, None, stop))
    status, text = await _get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    assert "gpu_sm_active_ratio" in text and 'gpupulse_collector_success{collector="device"} 1.0' in text
    status, _ = await _get(f"http://127.0.0.1:{port}/readyz")
    assert status == 200
    status, page = await _get(f"http://127.0.0.1:{port}/")
    assert "NVIDIA H100" in page
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
    from exporter.sim import installed

    assert installed() is None  # the simulation was uninstalled on shutdown


@pytest.mark.integration
def test_console_script_serves_and_exits_on_sigterm() -> None:
    port = free_port()
    env = {**os.environ, "GPUPULSE_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}"}
    with subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "--simulate", "demo", "--log.format", "json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            status, text = asyncio.run(_get(f"http://127.0.0.1:{port}/metrics"))
            assert status == 200 and "gpu_up" in text
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
            assert proc.returncode == 0, err
            assert '"msg": "shutting down"' in err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_plugins_switched_off_are_not_imported_but_their_flag_parses() -> None:
    env = {"GPUPULSE_COLLECTOR_ENGINES": "false", "GPUPULSE_COLLECTOR_PAGECACHE": "0"}
    off = cli.switched_off(["--no-collector.attribution", "--collector.pagecache"], env)
    assert off == {"attribution", "engines"}
    parser = cli.build_parser({}, None, also_collectors=sorted(off))
    args = parser.parse_args(["--no-collector.attribution"])
    assert args.collector_attribution is False


class _RecordingPusher:
    def __init__(self) -> None:
        self.pushed: list[int] = []
        self.closed = False

    async def push(self, families: object) -> None:
        self.pushed.append(len(families))  # type: ignore[arg-type]

    async def close(self) -> None:
        self.closed = True


async def test_otlp_pusher_gets_every_snapshot_off_the_scrape_path() -> None:
    pusher = _RecordingPusher()

    class FakeOtlp:
        @staticmethod
        def add_arguments(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("--otlp.endpoint", dest="otlp_endpoint", default="")

        @staticmethod
        def from_args(args: argparse.Namespace) -> _RecordingPusher | None:
            return pusher if args.otlp_endpoint else None

    port = free_port()
    parser = cli.build_parser({}, FakeOtlp)  # type: ignore[arg-type]
    args = parser.parse_args(
        [
            "--simulate",
            "basic",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--sampling.interval",
            "0.1",
            "--otlp.endpoint",
            "http://collector",
        ]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(cli.serve(cli.settings_from_args(args), args, {}, FakeOtlp, stop))  # type: ignore[arg-type]
    deadline = time.monotonic() + 20
    while len(pusher.pushed) < 2:  # the pusher runs on the sampler's loop (another thread)
        assert time.monotonic() < deadline, "no pushes"
        await asyncio.sleep(0.05)
    assert all(n > 20 for n in pusher.pushed)  # whole families, not a subset
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
    assert pusher.closed


def test_nvml_errors_are_classified() -> None:
    import pynvml

    from exporter import nvml

    assert isinstance(nvml.classify(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)), nvml.GpuLostError)
    for code in (
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
    ):
        assert isinstance(nvml.classify(pynvml.NVMLError(code)), nvml.NotSupportedError)
    assert isinstance(nvml.classify(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)), nvml.NvmlUnknownError)
    assert isinstance(
        nvml.classify(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)), nvml.NvmlUnavailableError
    )
    assert isinstance(nvml.classify(pynvml.NVMLLibraryMismatchError("v3 missing")), nvml.NotSupportedError)
    other = nvml.classify(pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE))
    assert type(other) is nvml.NvmlError and other.code == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


@pytest.mark.parametrize(
    ("argv", "meant"),
    [(["--sampling.intervall=1s"], "--sampling.interval"), (["--collector.gpmm"], "--collector.gpm")],
)
def test_a_misspelt_flag_is_two_lines_naming_the_flag_meant(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv, environ={})
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gpupulse-exporter: error: unrecognized arguments: {argv[0]} (did you mean {meant}?)",
        "See 'gpupulse-exporter --help'.",
    ]
