"""The kubelet List call spoken with h2: against grpcio's server (grpc-core's HTTP/2), and against a
raw HTTP/2 server for what a real one does only when something is wrong (each a PodResourcesError)."""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
import h2.errors
import pytest
from hyperframe.frame import GoAwayFrame, PingFrame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.attribution.kubelet import PodResourcesClient, PodResourcesTracker, TrackerSettings
from exporter.attribution.podresources_proto import encode_list_response
from exporter.errors import PodResourcesError
from tests.attribution.conftest import GPU_UUIDS
from tests.fakes.kubelet import FakeKubelet, RawExchange, RawKubelet, grpc_frame, pod

ONE_POD = (pod("serving", "llama-0", {"vllm": {"nvidia.com/gpu": [GPU_UUIDS[0]]}}),)
Respond = Callable[[RawExchange], Awaitable[None]]
StartRaw = Callable[..., Awaitable[RawKubelet]]


@pytest.fixture
async def raw(tmp_path: Path) -> AsyncIterator[StartRaw]:
    """Start a RawKubelet (on a socket of the test's own unless given one); stopped after the test."""
    started: list[RawKubelet] = []

    async def start(respond: Respond, socket_path: str = "") -> RawKubelet:
        server = RawKubelet(socket_path or str(tmp_path / f"raw{len(started)}.sock"), respond)
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


async def list_once(socket_path: str, timeout_seconds: float = 5.0, **kwargs: int) -> object:
    client = PodResourcesClient(socket_path, timeout_seconds, **kwargs)
    try:
        return await client.list()
    finally:
        await client.close()


def many_pods(count: int) -> tuple[object, ...]:
    return tuple(
        pod("batch", f"job-{i:05d}-" + "x" * 40, {"worker": {"nvidia.com/gpu": [GPU_UUIDS[i % 8]]}})
        for i in range(count)
    )


# --- against grpcio's server -------------------------------------------------------------------


async def test_answer_of_several_windows_arrives_whole(kubelet: FakeKubelet) -> None:
    kubelet.pods = many_pods(3000)  # type: ignore[assignment]
    # far past HTTP/2's initial 64 KiB windows: without WINDOW_UPDATEs the stream stalls
    assert len(encode_list_response(kubelet.pods)) > 4 * 65535
    assert await list_once(kubelet.socket_path) == kubelet.pods


async def test_an_unchanged_answer_gives_the_same_pods_and_any_change_is_read(kubelet: FakeKubelet) -> None:
    # refreshes with the same bytes return the objects already decoded (what was made from them is
    # kept downstream); a new pod, a changed device, a garbage answer or a failure are each read anew
    client = PodResourcesClient(kubelet.socket_path, 5.0)
    try:
        kubelet.pods = many_pods(3)  # type: ignore[assignment]
        first = await client.list()
        assert first == kubelet.pods and await client.list() is first
        kubelet.pods = many_pods(4)  # type: ignore[assignment]
        grown = await client.list()
        assert grown == kubelet.pods and grown is not first
        changed = pod("batch", "job-00000-" + "x" * 40, {"worker": {"nvidia.com/gpu": [GPU_UUIDS[7]]}})
        kubelet.pods = (changed,)
        assert await client.list() == kubelet.pods
        kubelet.garbage = b"\xff\xff\xff"
        with pytest.raises(PodResourcesError, match="undecodable"):
            await client.list()
        kubelet.garbage = None
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
            await client.list()
        kubelet.fail_with = None
        kubelet.pods = many_pods(3)  # type: ignore[assignment]
        assert await client.list() == first
    finally:
        await client.close()
    assert client.connections_opened == 1  # every call on the one kept connection, failed answers too


async def test_status_message_is_percent_decoded(kubelet: FakeKubelet) -> None:
    kubelet.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
    kubelet.fail_message = "100% of 16 slots busy, ünïcode\nsecond line"
    with pytest.raises(PodResourcesError) as failed:
        await list_once(kubelet.socket_path)
    assert str(failed.value) == "List failed: RESOURCE_EXHAUSTED: 100% of 16 slots busy, ünïcode\nsecond line"


async def test_kubelet_without_the_v1_api_is_unimplemented(tmp_path: Path) -> None:
    server = grpc.aio.server()  # a gRPC server on the socket that serves no PodResourcesLister
    socket_path = str(tmp_path / "old-kubelet.sock")
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    try:
        with pytest.raises(PodResourcesError, match=r"^List failed: UNIMPLEMENTED: "):
            await list_once(socket_path)
    finally:
        await server.stop(grace=None)


async def test_answer_over_the_limit_is_refused(kubelet: FakeKubelet) -> None:
    kubelet.pods = many_pods(50)  # type: ignore[assignment]
    size = len(encode_list_response(kubelet.pods))
    with pytest.raises(PodResourcesError, match=f"answer of {size} bytes is over the limit of 1000"):
        await list_once(kubelet.socket_path, max_message_bytes=1000)
    assert len(await list_once(kubelet.socket_path, max_message_bytes=size)) == 50  # type: ignore[arg-type]


async def test_hung_list_ends_at_the_deadline(kubelet: FakeKubelet) -> None:
    kubelet.hang = True
    with pytest.raises(PodResourcesError, match=r"no answer from .*kubelet\.sock within 0\.2s"):
        await list_once(kubelet.socket_path, timeout_seconds=0.2)
    kubelet.hang = False
    assert await list_once(kubelet.socket_path) == ()  # the server is not left wedged


async def test_connect_refused_when_nobody_listens(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "stale.sock"  # a socket file left by a kubelet that died
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    with pytest.raises(PodResourcesError, match=r"cannot connect to .*stale\.sock"):
        await list_once(str(path))


# --- against a raw HTTP/2 server ---------------------------------------------------------------


async def answer(exchange: RawExchange, body: bytes, status: int = 0) -> None:
    await exchange.headers()
    await exchange.data(body)
    await exchange.trailers(status)


async def test_request_is_what_grpc_servers_expect(raw: StartRaw) -> None:
    server = await raw(lambda x: answer(x, grpc_frame(encode_list_response(ONE_POD))))
    assert await list_once(server.socket_path) == ONE_POD
    (headers,) = server.requests
    assert {k: headers[k] for k in (b":method", b":scheme", b":path", b"content-type", b"te")} == {
        b":method": b"POST",
        b":scheme": b"http",
        b":path": b"/v1.PodResourcesLister/List",
        b"content-type": b"application/grpc",
        b"te": b"trailers",
    }
    assert headers[b"grpc-timeout"] == b"5000m"
    assert b"grpc-accept-encoding" not in headers  # so a compressed answer is the server's error


async def test_message_split_across_many_data_frames(raw: StartRaw) -> None:
    frame = grpc_frame(encode_list_response(ONE_POD))

    async def dribble(exchange: RawExchange) -> None:
        await exchange.headers()
        for i in range(len(frame)):  # the 5-byte prefix itself cut up too
            await exchange.data(frame[i : i + 1])
        await exchange.trailers()

    server = await raw(dribble)
    assert await list_once(server.socket_path) == ONE_POD


async def test_socket_that_accepts_and_never_answers(raw: StartRaw) -> None:
    server = await raw(lambda _: asyncio.Event().wait())
    with pytest.raises(PodResourcesError, match=r"no answer from .* within 0\.2s"):
        await list_once(server.socket_path, timeout_seconds=0.2)
    await server.client_gone.wait()  # the client closed its connection instead of leaking it


async def test_deadline_is_for_the_whole_call_not_each_read(raw: StartRaw) -> None:
    async def dribble_forever(exchange: RawExchange) -> None:
        await exchange.headers()
        await exchange.data(b"\0\0\0\x10\0")  # a 1 MiB message announced
        while True:  # a byte at a time, each well within any per-read timeout
            await exchange.data(b"x")
            await asyncio.sleep(0.02)

    server = await raw(dribble_forever)
    with pytest.raises(PodResourcesError, match=r"no answer from .* within 0\.3s"):
        await list_once(server.socket_path, timeout_seconds=0.3)


async def test_server_closing_mid_frame(raw: StartRaw) -> None:
    async def cut(exchange: RawExchange) -> None:
        await exchange.headers()
        # a DATA frame header announcing 100 bytes on stream 1, then 10 of them, then the end
        await exchange.raw(b"\x00\x00\x64\x00\x00\x00\x00\x00\x01" + b"\x00" * 10)
        exchange.end()

    server = await raw(cut)
    with pytest.raises(PodResourcesError, match="closed the connection before the answer was complete"):
        await list_once(server.socket_path)


async def test_server_closing_between_message_and_trailers(
    raw: StartRaw,
) -> None:
    async def no_trailers(exchange: RawExchange) -> None:
        await exchange.headers()
        await exchange.data(grpc_frame(encode_list_response(ONE_POD)))
        exchange.end()

    server = await raw(no_trailers)
    with pytest.raises(PodResourcesError, match="closed the connection before the answer was complete"):
        await list_once(server.socket_path)


async def test_stream_reset(raw: StartRaw) -> None:
    async def reset(exchange: RawExchange) -> None:
        await exchange.headers()
        exchange.conn.reset_stream(exchange.stream_id, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        await exchange.flush()

    server = await raw(reset)
    with pytest.raises(PodResourcesError, match=r"reset the stream \(HTTP/2 error ENHANCE_YOUR_CALM\)"):
        await list_once(server.socket_path)


async def test_goaway_before_the_answer(raw: StartRaw) -> None:
    async def goaway(exchange: RawExchange) -> None:
        exchange.conn.close_connection(h2.errors.ErrorCodes.NO_ERROR, last_stream_id=0)
        await exchange.flush()

    server = await raw(goaway)
    with pytest.raises(PodResourcesError, match=r"GOAWAY \(NO_ERROR\) before the answer was complete"):
        await list_once(server.socket_path)


async def test_compressed_answer_is_refused(raw: StartRaw) -> None:
    server = await raw(lambda x: answer(x, grpc_frame(b"\x1f\x8b gzip", compressed=1)))
    with pytest.raises(PodResourcesError, match=r"compressed answer \(flag 1\)"):
        await list_once(server.socket_path)


async def test_huge_length_prefix_fails_at_once(raw: StartRaw) -> None:
    async def announce(exchange: RawExchange) -> None:
        await exchange.headers()
        await exchange.data(b"\x00\x7f\xff\xff\xff")  # 2 GiB announced, never sent
        await asyncio.Event().wait()

    server = await raw(announce)
    # refused on the prefix: not a 2 GiB buffer, and not the 30 s deadline either
    with pytest.raises(PodResourcesError, match=r"answer of 2147483647 bytes is over the limit of 16777216"):
        await list_once(server.socket_path, timeout_seconds=30.0)


async def test_frame_announcing_megabytes_is_cut_off(raw: StartRaw) -> None:
    async def flood(exchange: RawExchange) -> None:
        await exchange.raw(b"\xff\xff\xff\x00\x00\x00\x00\x00\x01")  # a 16 MiB DATA frame header
        for _ in range(64):
            await exchange.raw(b"\0" * 65536)
        await asyncio.Event().wait()

    server = await raw(flood)
    # h2 would buffer the whole frame before judging its length; the client stops at its cap
    with pytest.raises(PodResourcesError, match=f"the server sent more than {1000 + (1 << 20)} bytes"):
        await list_once(server.socket_path, max_message_bytes=1000)


async def test_second_message_in_a_unary_answer(raw: StartRaw) -> None:
    message = grpc_frame(encode_list_response(ONE_POD))
    server = await raw(lambda x: answer(x, message + message))
    with pytest.raises(PodResourcesError, match="more than one message"):
        await list_once(server.socket_path)


async def test_ok_status_without_a_message(raw: StartRaw) -> None:
    async def empty(exchange: RawExchange) -> None:
        await exchange.headers()
        await exchange.trailers()

    server = await raw(empty)
    with pytest.raises(PodResourcesError, match="the answer has 0 bytes, not one length-prefixed message"):
        await list_once(server.socket_path)


async def test_answer_ending_without_grpc_status(raw: StartRaw) -> None:
    async def no_status(exchange: RawExchange) -> None:
        await exchange.headers()
        await exchange.data(grpc_frame(encode_list_response(ONE_POD)), end_stream=True)

    server = await raw(no_status)
    with pytest.raises(PodResourcesError, match="ended without a grpc-status"):
        await list_once(server.socket_path)


async def test_non_numeric_grpc_status(raw: StartRaw) -> None:
    async def odd(exchange: RawExchange) -> None:
        await exchange.headers()
        exchange.conn.send_headers(exchange.stream_id, [(b"grpc-status", b"OK")], end_stream=True)
        await exchange.flush()

    server = await raw(odd)
    with pytest.raises(PodResourcesError, match="grpc-status 'OK' is not a number"):
        await list_once(server.socket_path)


async def test_unknown_status_code_and_malformed_percent_encoding(
    raw: StartRaw,
) -> None:
    server = await raw(lambda x: x.trailers_only(99, b"bad %zz and %C3%BC"))
    # trailers-only (the status in the first HEADERS) is how grpc servers fail a call early
    with pytest.raises(PodResourcesError) as failed:
        await list_once(server.socket_path)
    assert str(failed.value) == "List failed: status 99: bad %zz and ü"


async def test_http_error_status(raw: StartRaw) -> None:
    server = await raw(lambda x: x.headers(status=b"503", content_type=b"text/plain"))
    with pytest.raises(PodResourcesError, match="HTTP status 503, not 200"):
        await list_once(server.socket_path)


async def test_not_grpc_content_type(raw: StartRaw) -> None:
    server = await raw(lambda x: x.headers(content_type=b"text/html"))
    with pytest.raises(PodResourcesError, match="content-type 'text/html' is not gRPC"):
        await list_once(server.socket_path)


async def test_server_that_does_not_speak_http2(tmp_path: Path) -> None:
    done = asyncio.Event()

    async def http1(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(100)
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            await reader.read()  # kept open: the client must not wait for megabytes of "frame"
        finally:
            writer.close()
            done.set()

    socket_path = str(tmp_path / "http1.sock")
    server = await asyncio.start_unix_server(http1, socket_path)
    try:
        with pytest.raises(PodResourcesError, match=r"does not speak HTTP/2: its answer starts b'HTTP/1\.1 "):
            await list_once(socket_path)
        await done.wait()
    finally:
        server.close()


async def test_tracker_keeps_last_good_answer_through_a_hostile_kubelet(
    kubelet: FakeKubelet, raw: StartRaw
) -> None:
    kubelet.pods = ONE_POD
    client = PodResourcesClient(kubelet.socket_path, timeout_seconds=5.0)
    tracker = PodResourcesTracker(client, TrackerSettings(max_stale_seconds=3600.0))
    try:
        await tracker.refresh_once()
        await kubelet.stop()  # the kubelet comes back misbehaving on the same socket
        await raw(lambda x: answer(x, grpc_frame(b"zz", compressed=1)), kubelet.socket_path)
        await tracker.refresh_once()
    finally:
        await tracker.close()
    view = tracker.view()
    assert view.pods == ONE_POD and view.has_data
    assert "compressed answer" in view.error


def test_the_exporter_never_imports_grpc(tmp_path: Path) -> None:
    # grpcio is a test dependency now (the fake kubelets' servers); the exporter must not need it
    code = f"""
import asyncio, sys
import exporter.cli
from exporter.attribution.kubelet import PodResourcesClient
from exporter.errors import PodResourcesError
try:
    asyncio.run(PodResourcesClient({str(tmp_path / "none.sock")!r}, 1.0).list())
except PodResourcesError:
    pass
print(sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "h2")))
"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "-c", code]
    out = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "'h2.connection'" in out.stdout  # the client ran (h2 is imported on the first List)
    assert "'grpc'" not in out.stdout


# any frames a server may send after its SETTINGS: type, flags, stream (0, ours, another), payload
FRAMES = st.lists(
    st.tuples(st.integers(0, 10), st.integers(0, 255), st.sampled_from([0, 1, 3]), st.binary(max_size=40)),
    max_size=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=FRAMES, cut=st.integers(0, 8))
def test_any_frames_end_in_an_answer_or_a_pod_resources_error(
    frames: list[tuple[int, int, int, bytes]], cut: int
) -> None:
    wire = b"".join(
        struct.pack(">I", len(p))[1:] + bytes((t, f)) + struct.pack(">I", s) + p for t, f, s, p in frames
    )
    wire = b"\0\0\0\x04\0\0\0\0\0" + wire[: len(wire) - cut if cut < len(wire) else len(wire)]

    async def one(socket_path: str) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(65536)
            writer.write(wire)
            writer.write_eof()  # then the end: a client waiting for more is the bug
            await reader.read()
            writer.close()

        server = await asyncio.start_unix_server(handle, socket_path)
        client = PodResourcesClient(socket_path, timeout_seconds=5.0)
        try:
            await client.list()
        except PodResourcesError as exc:
            assert "within" not in str(exc)  # it never waits for the deadline once the server is done
        finally:
            await client.close()
            server.close()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(one(os.path.join(folder, "fuzz.sock")))


# --- the kept connection -----------------------------------------------------------------------


async def test_a_restarted_kubelet_is_reached_again_without_an_error(kubelet: FakeKubelet) -> None:
    # The kubelet restarts (its socket recreated): the kept connection is dead, the next List goes
    # out on a new one within its deadline and answers; while the kubelet is gone, the error says so.
    kubelet.pods = ONE_POD
    client = PodResourcesClient(kubelet.socket_path, timeout_seconds=5.0)
    try:
        assert await client.list() == ONE_POD
        assert await client.list() == ONE_POD
        assert client.connections_opened == 1
        await kubelet.stop()
        with pytest.raises(PodResourcesError, match="does not exist"):
            await client.list()
        kubelet.pods = ()
        await kubelet.start()
        assert await client.list() == ()
        assert client.connections_opened == 2
    finally:
        await client.close()


def _calls(*behaviours: Respond) -> Respond:
    """A respond that answers each request (on whatever connection) with the next behaviour."""
    left = list(behaviours)

    async def respond(exchange: RawExchange) -> None:
        await left.pop(0)(exchange)

    return respond


def _ok(pods: tuple[object, ...] = ONE_POD) -> Respond:
    return lambda x: answer(x, grpc_frame(encode_list_response(pods)))  # type: ignore[arg-type]


async def _silent_close(exchange: RawExchange) -> None:
    exchange.end()  # the server closes the connection without taking the request


async def _goaway_after_answer(exchange: RawExchange) -> None:
    await answer(exchange, grpc_frame(encode_list_response(ONE_POD)))
    # then gives the connection up while it is idle: no stream after this one is taken
    exchange.conn.close_connection(h2.errors.ErrorCodes.NO_ERROR, last_stream_id=exchange.stream_id)
    await exchange.flush()


async def _graceful_shutdown_after_answer(exchange: RawExchange) -> None:
    await answer(exchange, grpc_frame(encode_list_response(ONE_POD)))
    # then shuts down as grpc servers do: a GOAWAY notice (2^31-1, no stream named as taken) and a
    # PING in one write, and the socket closed; h2 refuses the PING after the GOAWAY
    notice = GoAwayFrame(0, last_stream_id=2**31 - 1, error_code=0).serialize()
    await exchange.raw(notice + PingFrame(0, opaque_data=b"shutdown").serialize())
    exchange.end()


async def _goaway_taking_the_call(exchange: RawExchange) -> None:
    # the server took this stream (last_stream_id is it) and gives up before answering
    exchange.conn.close_connection(h2.errors.ErrorCodes.INTERNAL_ERROR, last_stream_id=exchange.stream_id)
    await exchange.flush()


async def _reset(exchange: RawExchange) -> None:
    exchange.conn.reset_stream(exchange.stream_id, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
    await exchange.flush()


@pytest.mark.parametrize(
    "first",
    [
        [_ok(), _silent_close],  # answered; closed without a word when the next request comes
        [_goaway_after_answer],  # answered, then a GOAWAY while idle that takes no later stream
        [_graceful_shutdown_after_answer],  # answered, then shut down gracefully while idle
    ],
)
async def test_a_kept_connection_the_server_closed_or_gave_up_is_replaced_within_the_call(
    raw: StartRaw, first: list[Respond]
) -> None:
    # The server never saw the second call on the kept connection: it goes out again on a new one.
    server = await raw(_calls(*first, _ok(()), _ok(())))
    client = PodResourcesClient(server.socket_path, timeout_seconds=5.0)
    try:
        assert await client.list() == ONE_POD
        assert await client.list() == ()
        assert client.connections_opened == 2
        assert await client.list() == ()  # the new connection is kept in turn
        assert client.connections_opened == 2
    finally:
        await client.close()


async def test_a_call_the_server_took_is_never_sent_twice(raw: StartRaw) -> None:
    # A GOAWAY that names our stream as taken, a reset of our stream, or no answer within the deadline
    # on the kept connection: the error is the call's (the server may have acted on it), the broken
    # connection is dropped, and the next call opens a new one.
    for failing, message in (
        (_goaway_taking_the_call, r"GOAWAY \(INTERNAL_ERROR\) before the answer was complete"),
        (_reset, r"reset the stream \(HTTP/2 error ENHANCE_YOUR_CALM\)"),
        (lambda _: asyncio.Event().wait(), r"no answer from .* within 0\.3s"),
    ):
        server = await raw(_calls(_ok(), failing, _ok(())))
        client = PodResourcesClient(server.socket_path, timeout_seconds=0.3)
        try:
            assert await client.list() == ONE_POD
            with pytest.raises(PodResourcesError, match=message):
                await client.list()
            assert len(server.requests) == 2  # sent once
            assert await client.list() == ()
            assert client.connections_opened == 2
        finally:
            await client.close()


async def test_each_call_on_a_kept_connection_is_a_new_stream_with_the_same_request(raw: StartRaw) -> None:
    server = await raw(_calls(_ok(), _ok(), _ok()))
    client = PodResourcesClient(server.socket_path, timeout_seconds=5.0)
    try:
        for _ in range(3):
            assert await client.list() == ONE_POD
    finally:
        await client.close()
    assert client.connections_opened == 1 and len(server.requests) == 3
    assert all(headers == server.requests[0] for headers in server.requests)
    await server.client_gone.wait()  # close() ends the kept connection
