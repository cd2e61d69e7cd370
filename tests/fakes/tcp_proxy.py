"""A TCP proxy in front of a server that a test can cut: a network partition between one client and it.

`cut()` closes every open connection and refuses new ones (the client sees resets, then refused
connects, as when a node loses its route to the API server); `heal()` lets traffic through again.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to `target_url`'s host and port while not cut."""

    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        self._host, self._port = parts.hostname or "127.0.0.1", int(parts.port or 80)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.is_cut = False
        self.url = ""

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def retarget(self, target_url: str) -> None:
        """Forward new connections to another server (one that started after its clients)."""
        parts = urlsplit(target_url)
        self._host, self._port = parts.hostname or "127.0.0.1", int(parts.port or 80)

    def cut(self) -> None:
        self.is_cut = True
        for w in list(self._writers):
            w.close()

    def heal(self) -> None:
        self.is_cut = False

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    if self.is_cut:
                        break
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))
