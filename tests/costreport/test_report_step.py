"""`gpupulse report` refuses a --step too short for the counters it integrates, against a real
Prometheus 3: the scrape interval comes from its targets (the job that exports the energy counter, not
a slower unrelated one), else its global scrape_interval, else --scrape-interval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

import tests.fakes.prometheus_process as prometheus_process
from costreport.cli import EXIT_NO_DATA, EXIT_USAGE, main
from demo.neighbours import neighbour_binary
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus

pytestmark = pytest.mark.integration

START, END = "2026-11-30T00:00:00Z", "2026-11-30T06:00:00Z"


@pytest.fixture(autouse=True)
def prometheus_3(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run the 3.x line: the harness that still starts `prometheus` from PATH (2.42) is pointed at the
    pinned 3.x build; once the harness picks 3.x itself there is nothing to point."""
    binary = neighbour_binary("prometheus")  # fails, never skips, when it is not built
    if hasattr(prometheus_process, "PROMETHEUS"):
        monkeypatch.setattr(prometheus_process, "PROMETHEUS", str(binary))
    yield


async def _is_3(prom: PromHandle) -> None:
    version = (await prom.api("status/buildinfo"))["version"]
    assert version.startswith("3."), version


async def _report(url: str, *argv: str) -> int:
    return await asyncio.to_thread(
        main, ["report", f"--prometheus.url={url}", f"--start={START}", f"--end={END}", *argv]
    )


@pytest.fixture
async def exporter() -> AsyncIterator[str]:
    """A target that exports the energy counter the report's step must hold two samples of."""

    async def metrics(request: web.Request) -> web.Response:
        text = '# TYPE gpu_energy_joules_total counter\ngpu_energy_joules_total{uuid="GPU-0"} 1\n'
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_step_under_three_scrapes_of_the_exporters_job_exits_2_naming_the_minimum(
    exporter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the exporters' job every 5 s; another job every 2 minutes must not set the bound
    config = f"""
global:
  scrape_interval: 2m
scrape_configs:
  - job_name: gpupulse
    scrape_interval: 5s
    static_configs: [{{targets: ["{exporter}"]}}]
  - job_name: slow
    scrape_interval: 2m
    static_configs: [{{targets: ["127.0.0.1:{free_port()}"]}}]
"""
    async with running_prometheus(config) as prom:
        await _is_3(prom)
        await prom.wait_for('gpu_energy_joules_total{job="gpupulse"}')
        assert await _report(prom.url, "--step=14s") == EXIT_USAGE
        err = capsys.readouterr().err
        assert "--step 14s is shorter than 3 scrape intervals of 5s" in err, err
        assert "job 'gpupulse'" in err and "use --step 15s or longer" in err and "Traceback" not in err
        # three intervals pass the check and reach the report (which finds no allocation data here)
        assert await _report(prom.url, "--step=15s") == EXIT_NO_DATA
        assert "no GPU allocation data" in capsys.readouterr().err


async def test_without_targets_the_global_scrape_interval_bounds_the_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with running_prometheus("global:\n  scrape_interval: 2m\n") as prom:
        await _is_3(prom)
        # a 5 m step is shorter than three scrapes of 2 m
        assert await _report(prom.url, "--step=5m") == EXIT_USAGE
        err = capsys.readouterr().err
        assert "--step 5m is shorter than 3 scrape intervals of 2m" in err, err
        assert "global scrape_interval" in err and "use --step 6m or longer" in err
        assert await _report(prom.url, "--step=6m") == EXIT_NO_DATA
        # without --step the report takes three scrapes (6 m), which leave enough steps in the 6 h
        assert await _report(prom.url) == EXIT_NO_DATA
        # an explicit scrape interval is taken as it is
        assert await _report(prom.url, "--step=30s", "--scrape-interval=10s") == EXIT_NO_DATA
        assert await _report(prom.url, "--step=30s", "--scrape-interval=11s") == EXIT_USAGE
        assert "(--scrape-interval)" in capsys.readouterr().err
