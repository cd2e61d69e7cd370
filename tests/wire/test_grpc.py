"""The kubelet's unary gRPC call when the server goes away or refuses, as grpc-go's own servers do
(issue 37): a call the server never took goes out once more on a fresh connection, never a third
time; a graceful stop in the middle of a call lets that call finish."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import h2.errors
import pytest
from hyperframe.frame import GoAwayFrame, PingFrame

from exporter.attribution.kubelet import PodResourcesClient
from exporter.attribution.podresources_proto import encode_list_response
from exporter.errors import PodResourcesError
from tests.attribution.conftest import GPU_UUIDS
from tests.fakes.kubelet import RawExchange, RawKubelet, grpc_frame, pod

ONE_POD = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
Respond = Callable[[RawExchange], Awaitable[None]]


@pytest.fixture
async def raw(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[RawKubelet]]]:
    """Start a RawKubelet whose requests, on whatever connection, get the next behaviour given."""
    started: list[RawKubelet] = []

    async def start(*behaviours: Respond) -> RawKubelet:
        left = list(behaviours)

        async def respond(exchange: RawExchange) -> None:
            await left.pop(0)(exchange)

        server = RawKubelet(str(tmp_path / f"raw{len(started)}.sock"), respond)
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


def ok(pods: tuple[object, ...] = ONE_POD) -> Respond:
    async def answer(exchange: RawExchange) -> None:
        await exchange.headers()
        await exchange.data(grpc_frame(encode_list_response(pods)))  # type: ignore[arg-type]
        await exchange.trailers()

    return answer


def goaway(last_stream_id: int, error_code: int = 0) -> bytes:
    return GoAwayFrame(0, last_stream_id=last_stream_id, error_code=error_code).serialize()


def goaway_below(error_code: int) -> Respond:
    async def respond(exchange: RawExchange) -> None:
        # the server stops before our stream: it names the one below as the last it takes
        await exchange.raw(goaway(max(0, exchange.stream_id - 2), error_code))

    return respond


async def refused(exchange: RawExchange) -> None:
    exchange.conn.reset_stream(exchange.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
    await exchange.flush()


async def graceful_stop_mid_call(exchange: RawExchange) -> None:
    # grpc-go's GracefulStop while our call is under way: the notice (2^31-1) and a PING in one
    # write, then the last stream it takes (ours) in the final GOAWAY; the call finishes, then it closes
    await exchange.headers()
    await exchange.raw(goaway(2**31 - 1) + PingFrame(0, opaque_data=b"graceful").serialize())
    await exchange.data(grpc_frame(encode_list_response(ONE_POD)))
    await exchange.raw(goaway(exchange.stream_id))
    await exchange.trailers()
    exchange.end()


async def calls(server: RawKubelet, count: int) -> tuple[list[object], int]:
    client = PodResourcesClient(server.socket_path, timeout_seconds=5.0)
    try:
        return [await client.list() for _ in range(count)], client.connections_opened
    finally:
        await client.close()


@pytest.mark.parametrize(
    "error_code", [0, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM], ids=["NO_ERROR", "an error"]
)
async def test_a_goaway_below_our_stream_sends_the_call_again_on_a_fresh_connection(
    raw: Callable[..., Awaitable[RawKubelet]], error_code: int
) -> None:
    # on the first call of a fresh connection (last stream 0 of none), and on a kept one (stream 3)
    server = await raw(goaway_below(error_code), ok(), goaway_below(error_code), ok(()))
    client = PodResourcesClient(server.socket_path, timeout_seconds=5.0)
    try:
        assert await client.list() == ONE_POD
        assert client.connections_opened == 2
        assert await client.list() == ()
        assert client.connections_opened == 3
    finally:
        await client.close()
    assert len(server.requests) == 4


async def test_a_refused_stream_is_sent_again_on_a_fresh_connection(
    raw: Callable[..., Awaitable[RawKubelet]],
) -> None:
    server = await raw(refused, ok(), ok(), refused, ok(()))
    assert await calls(server, 3) == ([ONE_POD, ONE_POD, ()], 3)
    assert len(server.requests) == 5


async def test_a_call_refused_twice_fails_and_is_not_sent_a_third_time(
    raw: Callable[..., Awaitable[RawKubelet]],
) -> None:
    server = await raw(refused, refused, ok())
    with pytest.raises(
        PodResourcesError, match=r"refused the stream \(REFUSED_STREAM\) \(and did so when asked"
    ):
        await calls(server, 1)
    assert len(server.requests) == 2


async def test_a_graceful_stop_in_the_middle_of_a_call_lets_it_finish(
    raw: Callable[..., Awaitable[RawKubelet]],
) -> None:
    server = await raw(graceful_stop_mid_call, ok(()))
    # the call under way is answered; the next goes on a new connection, the drained one taking none
    assert await calls(server, 2) == ([ONE_POD, ()], 2)
    assert len(server.requests) == 2


async def test_a_graceful_notice_then_the_end_before_the_answer_fails_the_call(
    raw: Callable[..., Awaitable[RawKubelet]],
) -> None:
    async def notice_then_gone(exchange: RawExchange) -> None:
        await exchange.headers()
        await exchange.raw(goaway(2**31 - 1))
        exchange.end()

    server = await raw(notice_then_gone, ok())
    with pytest.raises(PodResourcesError, match="closed the connection before the answer was complete"):
        await calls(server, 1)
    assert len(server.requests) == 1  # taken (the notice names every stream): not sent again
