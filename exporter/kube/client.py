"""Where and how the exporter reaches the Kubernetes API: settings, and a LIST/WATCH client on aiohttp.

The exporter asks the API server for two things only, a LIST and a WATCH of one collection, so it
speaks that much of the API itself instead of carrying kubernetes_asyncio (whose generated client
imports every API group and model: +37 MiB of RSS, `python -m bench.exporter_memory --imports`).

As client-go's in-cluster config does, it reads the service account's token file (before every
request: projected tokens rotate, and the kubelet swaps the file), trusts the CA file for an https URL
and finds the server in KUBERNETES_SERVICE_HOST/PORT (`in_cluster_api_url`). A WATCH is a stream of
JSON lines (k8s.io/apimachinery watch.Event); each line is bounded (`max_event_bytes`), a silent
connection is given up after `watch_idle_timeout_seconds`, and an ERROR event is raised as the Status
it carries (Expired for 410). Every failure comes out as KubeError with a message naming the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from exporter.errors import Expired, KubeError, WatchSilentError
from exporter.kube.requests import ERROR_CODE, REQUESTS, RequestCounts

USER_AGENT = "gpupulse-exporter"
DEFAULT_API_URL = "https://kubernetes.default.svc"
_ERROR_BODY_BYTES = 64 * 1024  # of a non-200 answer, enough for its Status message


@dataclass(frozen=True)
class ApiSettings:
    """One watch of this node's objects: the API server, the credentials, the timeouts and bounds."""

    node_name: str
    api_url: str = DEFAULT_API_URL
    token_path: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    ca_path: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    # one LIST, a WATCH's answer (its status and headers), and the first sync a reader waits for
    timeout_seconds: float = 5.0
    # Each watch asks the server to end it after this long, jittered up to twice as long (client-go's
    # reflector uses 5-10 min), so watches spread over API server replicas after a rollout.
    watch_timeout_seconds: float = 300.0
    # The API server sends a watch that allows bookmarks a BOOKMARK about every minute (its watch
    # cache's bookmark frequency), but only once that cache has seen an event of the resource (after a
    # restart a quiet resource's watches hear nothing: docs/scale.md); no byte for this long and the
    # connection is taken for dead.
    watch_idle_timeout_seconds: float = 120.0
    # One watch event (one JSON line). etcd stores at most 1.5 MiB per object; its JSON is a little larger.
    max_event_bytes: int = 4 * 1024 * 1024
    max_list_bytes: int = 64 * 1024 * 1024  # one LIST's body (a node runs at most ~110 pods)
    # After a failed, expired or short WATCH (or a failed LIST) wait this long, doubling up to
    # retry_max_seconds, each wait stretched by a random share of up to retry_jitter_ratio; the
    # doubling starts over only when the last wait began retry_reset_seconds ago (client-go's
    # reflector: 800 ms, 30 s, 1.0, 2 min; exporter/kube/backoff.py).
    retry_seconds: float = 0.8
    retry_max_seconds: float = 30.0
    retry_jitter_ratio: float = 1.0
    retry_reset_seconds: float = 120.0
    # A watch that ends sooner than this without moving the resourceVersion counts as a failure
    # (client-go: "very short watch", 1 s): a server that closes every watch at once is backed off.
    short_watch_seconds: float = 1.0
    # LIST pages (limit/continue) of an etcd read or a resourceVersion "0" one; 0: one request.
    list_page_size: int = 500


def in_cluster_api_url(environ: Mapping[str, str]) -> str:
    """The API server a pod reaches, from the service environment the kubelet sets (as client-go's
    rest.InClusterConfig); the cluster DNS name outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT") or "443"
    if not host:
        return DEFAULT_API_URL
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@dataclass(frozen=True)
class WatchEvent:
    """One event of a WATCH: ADDED, MODIFIED, DELETED or BOOKMARK, and the object it carries."""

    type: str
    object: Mapping[str, Any]


def status_error(
    what: str, status: int, body: bytes | Mapping[str, Any], retry_after_seconds: float = 0.0
) -> KubeError:
    """An API server's failure (an HTTP status and its body, or an ERROR event's Status object) as
    KubeError, Expired for 410, with the Status reason and message when the body is a Status."""
    doc: Any = body
    if isinstance(body, bytes):
        try:
            doc = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            doc = {}
    if isinstance(doc, Mapping) and isinstance(doc.get("message"), str):
        reason = doc.get("reason")
        message = f"{reason}: {doc['message']}" if isinstance(reason, str) and reason else doc["message"]
    else:
        raw = body if isinstance(body, bytes) else b""
        message = raw[:200].decode("utf-8", "replace").strip() or "(no body)"
    text = f"{what}: HTTP {status}: {message}"
    if status == 410:
        return Expired(text, status)
    return KubeError(text, status, retry_after_seconds)


def _retry_after(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0  # an HTTP date: client-go ignores those too


def _read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KubeError(f"service account token: {exc}") from exc
    if not token:
        raise KubeError(f"service account token: {path} is empty")
    if any(not 0x21 <= ord(c) <= 0x7E for c in token):  # it goes into a header line
        raise KubeError(f"service account token: {path} holds spaces or control characters")
    return token


class KubeClient:
    """LIST and WATCH of collections on one API server, with the settings' credentials and bounds.
    One HTTP session, made on first use (it needs the running loop); `close` ends it."""

    def __init__(self, settings: ApiSettings, requests: RequestCounts = REQUESTS) -> None:
        self._settings = settings
        self._requests = requests
        self._base = settings.api_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._ca_seen: tuple[int, int, int] | None = None  # (inode, mtime, size) of the CA file loaded
        self._ca_context: ssl.SSLContext | None = None

    async def close(self) -> None:
        """Close the HTTP session (and an open watch's connection)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def list(self, what: str, path: str, params: Mapping[str, str]) -> dict[str, Any] | None:
        """One LIST: the decoded body, or None on 404 (the resource is not served here)."""
        s = self._settings
        try:
            async with asyncio.timeout(s.timeout_seconds):
                response = await self._get(path, params)
                try:
                    if response.status == 404:
                        return None
                    if response.status != 200:
                        raise await self._failure(what, response)
                    body = await self._read_bounded(what, response)
                finally:
                    response.release()
        except TimeoutError:
            raise KubeError(f"{what}: no complete answer in {s.timeout_seconds:g} s") from None
        except aiohttp.ClientError as exc:
            raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from exc
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise KubeError(f"{what}: not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise KubeError(f"{what}: not a JSON object")
        return doc

    @contextlib.asynccontextmanager
    async def watch(
        self, what: str, path: str, params: Mapping[str, str]
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """Open one WATCH (the block starts once the server has answered 200) and give its events.
        They end when the server ends the stream, or timeout_seconds past the watch's own
        timeoutSeconds; the connection is closed when the block ends."""
        s = self._settings
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(s.timeout_seconds):
                response = await self._get(path, params)
                if response.status != 200:
                    raise await self._failure(what, response)
        except TimeoutError:
            raise KubeError(f"{what}: no answer in {s.timeout_seconds:g} s") from None
        except aiohttp.ClientError as exc:
            raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from exc
        finally:
            if response is not None and response.status != 200:
                response.close()
        try:
            timeout = float(params.get("timeoutSeconds", s.watch_timeout_seconds))
            deadline = asyncio.get_running_loop().time() + timeout + s.timeout_seconds
            events = self._events(what, response, deadline)
            try:
                yield events
            finally:
                await events.aclose()
        finally:
            response.close()  # a stream cut short never goes back into the pool

    # --- the wire

    async def _get(self, path: str, params: Mapping[str, str]) -> aiohttp.ClientResponse:
        """A GET whose status and headers are in; the caller releases or closes it."""
        s = self._settings
        # small files, but on a filesystem: off the loop (the caller's deadline covers the read)
        token, ssl_context = await asyncio.to_thread(self._credentials)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, "Authorization": f"Bearer {token}"}
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2),
                timeout=aiohttp.ClientTimeout(total=None, connect=s.timeout_seconds),
                trust_env=False,  # the API server is reached directly, as client-go's in-cluster config does
            )
        verb = "WATCH" if params.get("watch") == "true" else "LIST"
        resource = path.rstrip("/").rsplit("/", 1)[-1]
        try:
            url = self._base + path
            response = await self._session.get(
                url, params=dict(params), headers=headers, ssl=ssl_context, allow_redirects=False
            )
        except BaseException:  # refused, reset, timed out or cancelled: sent, never answered
            self._requests.add(resource, verb, ERROR_CODE)
            raise
        self._requests.add(resource, verb, str(response.status))
        return response

    async def _read_bounded(self, what: str, response: aiohttp.ClientResponse) -> bytes:
        limit = self._settings.max_list_bytes
        if (response.content_length or 0) > limit:
            raise KubeError(f"{what}: a body of {response.content_length} bytes, over {limit} bytes")
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise KubeError(f"{what}: a body over {limit} bytes")
        return bytes(body)

    def _credentials(self) -> tuple[str, ssl.SSLContext | bool]:
        token = _read_token(self._settings.token_path)
        ca = self._settings.ca_path
        if not self._base.startswith("https:") or ca is None:
            return token, True  # http, or https with the system's trust store
        try:
            st = os.stat(ca)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._ca_context is None or seen != self._ca_seen:  # loaded again when it rotates
                self._ca_context, self._ca_seen = ssl.create_default_context(cafile=str(ca)), seen
        except (OSError, ssl.SSLError) as exc:
            raise KubeError(f"CA file {ca}: {exc}") from exc
        return token, self._ca_context

    async def _failure(self, what: str, response: aiohttp.ClientResponse) -> KubeError:
        try:
            body = await response.content.read(_ERROR_BODY_BYTES)
        except aiohttp.ClientError:
            body = b""
        return status_error(what, response.status, body, _retry_after(response.headers.get("Retry-After")))

    async def _events(
        self, what: str, response: aiohttp.ClientResponse, deadline: float
    ) -> AsyncGenerator[WatchEvent, None]:
        s = self._settings
        loop = asyncio.get_running_loop()
        buffer = bytearray()
        while True:
            wait = min(s.watch_idle_timeout_seconds, deadline - loop.time())
            try:
                async with asyncio.timeout(max(wait, 0.0)):
                    chunk = await response.content.readany()
            except TimeoutError:
                if loop.time() >= deadline:
                    return  # past its own timeoutSeconds: end it as the server should have
                raise WatchSilentError(f"{what}: no byte in {s.watch_idle_timeout_seconds:g} s") from None
            except aiohttp.ClientError as exc:
                raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from exc
            if not chunk:
                if buffer.strip():
                    raise KubeError(f"{what}: the stream ended inside an event ({len(buffer)} bytes)")
                return
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", start)) >= 0:
                line, start = bytes(buffer[start:end]), end + 1
                if len(line) > s.max_event_bytes:
                    raise KubeError(f"{what}: an event of {len(line)} bytes, over {s.max_event_bytes} bytes")
                if line.strip():
                    yield _event(what, line)
            del buffer[:start]
            if len(buffer) > s.max_event_bytes:  # no newline yet: never buffered without bound
                raise KubeError(f"{what}: an event over {s.max_event_bytes} bytes")


def _event(what: str, line: bytes) -> WatchEvent:
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise KubeError(f"{what}: an event that is not JSON ({exc}): {line[:200]!r}") from exc
    kind = doc.get("type") if isinstance(doc, dict) else None
    obj = doc.get("object") if isinstance(doc, dict) else None
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise KubeError(f"{what}: not a watch event: {line[:200]!r}")
    if kind == "ERROR":  # the API server's way to end a watch it cannot serve: a Status object
        code = obj.get("code")
        raise status_error(f"{what}: ERROR event", code if isinstance(code, int) else 500, obj)
    return WatchEvent(kind, obj)
