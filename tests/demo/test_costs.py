"""The demo's cost summary: what it prints from the token and DRA rules, and how it fails."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from demo.costs import DraSummary, ModelCost, cost_lines, cost_summary
from demo.procs import free_port


def test_lines_name_the_model_cost_and_the_dra_node() -> None:
    models = [ModelCost("serving", "llama", 0.4340, "USD", 0.3, 1600.0)]
    dra = DraSummary("dra-0", 4, 1, 5, 1, {"search": 2.5, "chat": 2.5}, "USD")
    assert cost_lines(models, dra) == [
        "serving: 0.434 USD per 1M generated tokens for model llama (serving), "
        "0.300 J per generated token, 1600 tokens/s",
        "DRA node dra-0: 4 claims attributed to pods, 1 device-plugin allocation(s), 1 of 5 GPUs free and "
        "still reported; cost per hour by namespace (USD): chat 2.50, search 2.50",
    ]


def test_no_data_is_said_not_hidden() -> None:
    lines = cost_lines([], DraSummary("dra-0", 0, 0, 0, 0))
    assert lines[0].startswith("serving: no cost per token yet")
    assert lines[1].endswith("cost per hour by namespace (no data): none")


async def test_an_unreachable_prometheus_is_one_line() -> None:
    lines = await cost_summary(f"http://127.0.0.1:{free_port()}", "dra-0")
    assert len(lines) == 1 and lines[0].startswith("costs not read from Prometheus: ClientConnectorError")


@pytest.fixture
async def failing_prometheus() -> AsyncIterator[str]:
    async def query(_: web.Request) -> web.Response:
        body = {"status": "error", "errorType": "bad_data", "error": "parse error"}
        return web.json_response(body, status=400)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_query_error_is_one_line(failing_prometheus: str) -> None:
    lines = await cost_summary(failing_prometheus, None)
    assert len(lines) == 1 and "parse error" in lines[0]
