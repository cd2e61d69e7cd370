"""`gpupulse report` on its own: the period it reads from its flags, and what it does when Prometheus
is not there, hangs, or answers something other than its API (an exit status and one line, never a
traceback or a report of zeros)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from costreport.cli import EXIT_NO_DATA, EXIT_PROMETHEUS, EXIT_USAGE, main, parser, period
from costreport.prom import MAX_POINTS_PER_QUERY, PrometheusClient
from costreport.usage import DEFAULT_IDLE_SM_ACTIVITY_RATIO
from tests.fakes.prometheus_process import free_port

NOW = datetime(2026, 12, 1, 11, 52, tzinfo=UTC).timestamp()


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ("2026-11-01T00:00:00", "2026-12-01T00:00:00")),  # the previous calendar month
        (["--month", "2026-02"], ("2026-02-01T00:00:00", "2026-03-01T00:00:00")),
        (["--month", "2025-12"], ("2025-12-01T00:00:00", "2026-01-01T00:00:00")),
        # a month still running is reported up to now
        (["--month", "2026-12"], ("2026-12-01T00:00:00", "2026-12-01T11:52:00")),
        (["--last", "1d12h"], ("2026-11-29T23:52:00", "2026-12-01T11:52:00")),
        (
            ["--start", "2026-11-30T00:00:00Z", "--end", "2026-11-30T06:00:00+00:00"],
            ("2026-11-30T00:00:00", "2026-11-30T06:00:00"),
        ),
        (["--start", str(int(_ts("2026-11-30T00:00:00")))], ("2026-11-30T00:00:00", "2026-12-01T11:52:00")),
    ],
)
def test_the_period_comes_from_one_of_month_last_or_start_end(
    argv: list[str], expected: tuple[str, str]
) -> None:
    assert period(parser().parse_args(argv), NOW) == (_ts(expected[0]), _ts(expected[1]))


def test_january_reports_the_previous_december() -> None:
    january = datetime(2027, 1, 3, tzinfo=UTC).timestamp()
    assert period(parser().parse_args([]), january) == (
        _ts("2026-12-01T00:00:00"),
        _ts("2027-01-01T00:00:00"),
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--month", "2026-13"], "not a month"),
        (["--month", "2026-11", "--last", "7d"], "choose one of"),
        (["--end", "2026-11-30T00:00:00Z"], "--end needs --start"),
        (["--start", "2026-11-30T00:00:00"], "needs its offset"),
        (["--start", "yesterday"], "not a time"),
        (["--start", "2026-11-30T06:00:00Z", "--end", "2026-11-30T00:00:00Z"], "ends before it starts"),
        (["--last", "7 days"], "--last"),
        (["--step", "0"], "longer than 0"),
        (["--step", "1500ms"], "whole seconds"),
        (["--step", "5m1h"], "--step"),
        (["--idle-threshold", "30"], "between 0 and 1"),
        (["--top", "-1"], "0 or more"),
        (["--prometheus.bearer-token-file", "/nonexistent/token"], "bearer-token-file"),
        (["--scrape-interval", "often"], "--scrape-interval"),
        (["--scrape-interval", "0s"], "longer than 0"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason_before_any_query(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the URL is a closed port: an argument error must be reported before anything is asked of it
    assert main(["report", f"--prometheus.url=http://127.0.0.1:{free_port()}", *argv], now=NOW) == EXIT_USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/api/v1/query_range", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _report(url: str, *argv: str) -> int:
    return await asyncio.to_thread(main, ["report", f"--prometheus.url={url}", "--last=1h", *argv], NOW)


async def test_an_unreachable_prometheus_exits_3_and_names_the_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert await _report(url) == EXIT_PROMETHEUS
    err = capsys.readouterr().err
    assert f"cannot reach Prometheus at {url}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (web.Response(text="<html>login</html>", content_type="text/html"), "did not answer JSON"),
        (
            web.json_response(
                {"status": "error", "errorType": "unavailable", "error": "too many queries"}, status=503
            ),
            "HTTP 503: unavailable: too many queries",
        ),
        (
            web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400
            ),
            "HTTP 400: bad_data",
        ),
        (
            web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}}),
            "no matrix",
        ),
        (web.json_response(["not", "an", "object"]), "query_range"),
    ],
)
async def test_an_answer_that_is_not_prometheus_exits_3(
    answer: web.Response, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return answer

    async with serving(handler) as url:
        assert await _report(url) == EXIT_PROMETHEUS
    captured = capsys.readouterr()
    assert says in captured.err and "Traceback" not in captured.err and captured.out == ""


async def test_a_hung_prometheus_is_given_up_on_at_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    never = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await never.wait()
        return web.Response()

    async with serving(handler) as url:
        assert await _report(url, "--prometheus.timeout=1s") == EXIT_PROMETHEUS
        never.set()
    assert "cannot reach Prometheus" in capsys.readouterr().err


def _matrix(result: list[dict[str, Any]]) -> web.Response:
    return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})


async def test_no_allocation_series_exits_4(capsys: pytest.CaptureFixture[str]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return _matrix([])

    async with serving(handler) as url:
        assert await _report(url) == EXIT_NO_DATA
    assert "no GPU allocation data" in capsys.readouterr().err


async def test_a_long_range_is_split_into_queries_under_the_point_limit_with_no_gap_or_overlap() -> None:
    asked: list[tuple[float, float, float]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        start, end, step = (float(request.query[k]) for k in ("start", "end", "step"))
        asked.append((start, end, step))
        points = [[start + i * step, "1"] for i in range(int((end - start) / step) + 1)]
        # a NaN and an infinity are no GPU-hours
        points[0][1] = "NaN"
        points[-1][1] = "+Inf"
        return _matrix([{"metric": {"namespace": "a"}, "values": points}])

    async with serving(handler) as url:
        client = PrometheusClient(url, timeout_seconds=10)
        series = await asyncio.to_thread(client.query_range, "up", 0.0, 25_000.0, 1.0)
    assert [round((e - s) / st) + 1 for s, e, st in asked] == [
        MAX_POINTS_PER_QUERY,
        MAX_POINTS_PER_QUERY,
        5_001,
    ]
    assert all(nxt[0] == prev[1] + 1.0 for prev, nxt in itertools.pairwise(asked))
    assert asked[0][0] == 0.0 and asked[-1][1] == 25_000.0
    (only,) = series
    times = [t for t, _ in only.points]
    assert times == sorted(times) and len(times) == len(set(times)) == 25_001 - 2 * len(asked)
    assert json.dumps(only.labels) == '{"namespace": "a"}'


def test_the_per_pod_idle_threshold_defaults_to_the_idle_rules_threshold() -> None:
    # the namespace idle figures come from the rules; the per-pod list repeats the threshold
    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "alerts" / "config.yaml").read_text())
    assert DEFAULT_IDLE_SM_ACTIVITY_RATIO == config["thresholds"]["idle_sm_activity_ratio"]


async def test_a_server_that_cannot_say_its_scrape_interval_is_assumed_to_scrape_every_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a query frontend: range queries, but no /api/v1/query, targets or configuration (HTTP 404)
    async def handler(request: web.Request) -> web.StreamResponse:
        return _matrix([])

    async with serving(handler) as url:
        assert await _report(url, "--step=2m") == EXIT_USAGE
        err = capsys.readouterr().err
        assert "assuming 1m, set --scrape-interval" in err
        assert "--step 2m is shorter than 3 scrape intervals of 1m (Prometheus' default" in err
        assert "Traceback" not in err
        # the default step is long enough for the assumed interval
        assert await _report(url) == EXIT_NO_DATA


async def test_targets_without_a_scrape_interval_fall_back_to_the_global_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a Prometheus before 2.37 lists its targets without scrapeInterval
    async def query(request: web.Request) -> web.StreamResponse:
        result = [{"metric": {"job": "gpupulse"}, "value": [0, "1"]}]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    async def targets(request: web.Request) -> web.StreamResponse:
        active = [{"labels": {"job": "gpupulse"}, "health": "up"}]
        return web.json_response({"status": "success", "data": {"activeTargets": active}})

    async def config(request: web.Request) -> web.StreamResponse:
        text = yaml.safe_dump({"global": {"scrape_interval": "3m"}, "scrape_configs": []})
        return web.json_response({"status": "success", "data": {"yaml": text}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/api/v1/targets", targets)
    app.router.add_get("/api/v1/status/config", config)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        assert await _report(f"http://127.0.0.1:{port}", "--step=5m") == EXIT_USAGE
    finally:
        await runner.cleanup()
    err = capsys.readouterr().err
    assert "--step 5m is shorter than 3 scrape intervals of 3m (the global scrape_interval" in err


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:9090", "--prometheus.url '127.0.0.1:9090': give the base URL with its scheme, e.g. "
         "http://127.0.0.1:9090"),
        ("ftp://prom:9090", "--prometheus.url 'ftp://prom:9090': give an http:// or https:// URL"),
        ("http://", "--prometheus.url 'http://': give an http:// or https:// URL"),
    ],
)  # fmt: skip
def test_a_prometheus_url_without_http_is_a_bad_argument(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--prometheus.url", url, "--last", "1h"], now=NOW) == EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        f"gpupulse report: error: {says}",
        "See 'gpupulse report --help'.",
    ]


def test_a_step_that_leaves_too_few_steps_in_the_period_is_refused_before_any_query(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the URL is a closed port: refused before anything is asked of it
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["report", f"--prometheus.url={url}", "--last", "10m", "--step", "5m"], now=NOW) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(
        "gpupulse report: error: --step 5m leaves fewer than 10 steps in the 10m period: each step counts "
        "a GPU from one sample"
    )
    assert "use --step 1m or shorter" in err


@pytest.mark.parametrize(("last", "step"), [("10m", 30), ("1h", 180), ("100m", 300), ("7d", 300), ("3m", 9)])
def test_without_step_the_report_picks_one_that_fits_the_period(last: str, step: int) -> None:
    from costreport.cli import auto_step
    from gpupulse.durations import parse_duration

    assert auto_step(0.0, parse_duration(last), shortest=3.0) == step


def test_without_step_a_short_period_gets_three_scrapes_a_step_while_ten_steps_fit() -> None:
    from costreport.cli import auto_step

    # 10 minutes at a 15 s scrape: 1/20 is 30 s, under 3 scrapes (45 s); 45 s still leaves 13 steps
    assert auto_step(0.0, 600.0, shortest=45.0) == 45.0


async def test_ten_minutes_read_the_gpu_hours_held_and_say_no_gpu_was_idle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 3 GPUs held for the last 6 of the 10 minutes: 0.30 GPU-hours (5 m steps read 0.50 from 2 samples)
    held_from = NOW - 360

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query["query"] != "sum by (cluster, namespace) (namespace:gpu_allocated:sum)":
            return _matrix([])
        start, end, step = (float(request.query[k]) for k in ("start", "end", "step"))
        times = [start + i * step for i in range(int((end - start) / step) + 1)]
        values = [[t, "3"] for t in times if t > held_from]
        return _matrix([{"metric": {"namespace": "team-a"}, "values": values}])

    async with serving(handler) as url:
        argv = ["report", f"--prometheus.url={url}", "--last=10m", "--scrape-interval=1s"]
        assert await asyncio.to_thread(main, argv, NOW) == 0
    out = capsys.readouterr().out
    assert "(step 30 s)" in out.splitlines()[0]
    assert out.split("Per namespace\n")[1].splitlines()[1].split()[:2] == ["team-a", "0.30"]
    no_idle = "no idle GPUs: no allocated GPU's SM activity was under the idle threshold"
    assert out.endswith(f"Largest idle allocations\n{no_idle}\n")
