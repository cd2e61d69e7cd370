"""Engine targets from annotations on this node's pods: the only module that talks to the API server.

Annotations (docs/design/engines.md):
  gpupulse.io/engine  vllm|sglang|tgi|triton|trtllm|dynamo|auto  (required: opts the pod in)
  gpupulse.io/port    metrics port (default per engine kind; required for auto)
  gpupulse.io/path    metrics path (default /metrics; /prometheus/metrics for trtllm)
  gpupulse.io/scheme  http|https (default http)
  gpupulse.io/model   model name override
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from exporter.engines.detect import KINDS
from exporter.engines.settings import Clock, KubeSettings
from exporter.engines.targets import AUTO, Target

log = logging.getLogger(__name__)

PREFIX = "gpupulse.io/"
DEFAULT_PORTS: Mapping[str, int] = {
    "vllm": 8000,
    "sglang": 30000,
    "tgi": 80,
    "triton": 8002,
    "trtllm": 8000,
    "dynamo": 8000,
}
DEFAULT_PATHS: Mapping[str, str] = {"trtllm": "/prometheus/metrics"}


class KubeError(Exception):
    """The pod list could not be fetched or decoded."""


def target_from_pod(pod: Mapping[str, Any]) -> Target | None:
    """The pod's engine target, or None when it is not annotated, not running, or malformed."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    kind = ann.get(PREFIX + "engine")
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not kind or status.get("phase") != "Running" or not ip:
        return None
    if kind != AUTO and kind not in KINDS:
        log.warning("pod %s/%s: unknown engine %r", meta.get("namespace"), meta.get("name"), kind)
        return None
    try:
        port = int(ann[PREFIX + "port"]) if PREFIX + "port" in ann else DEFAULT_PORTS[kind]
    except (KeyError, ValueError):
        log.warning("pod %s/%s: no usable %sport", meta.get("namespace"), meta.get("name"), PREFIX)
        return None
    scheme = ann.get(PREFIX + "scheme", "http")
    path = ann.get(PREFIX + "path", DEFAULT_PATHS.get(kind, "/metrics"))
    if not path.startswith("/"):
        path = "/" + path
    host = f"[{ip}]" if ":" in ip else ip
    return Target(
        url=f"{scheme}://{host}:{port}{path}",
        kind=kind,
        model=ann.get(PREFIX + "model", ""),
        namespace=str(meta.get("namespace", "")),
        pod=str(meta.get("name", "")),
    )


class KubePodSource:
    """Lists this node's pods at most every refresh_seconds; keeps the last good list on errors."""

    def __init__(
        self,
        settings: KubeSettings,
        clock: Clock,
        session_factory: Callable[[], aiohttp.ClientSession] | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._session_factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self._targets: list[Target] = []
        self._fetched_at: float | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self._settings.api_url.startswith("https"):
            return False
        ctx = ssl.create_default_context()
        if self._settings.ca_path is not None:
            ctx.load_verify_locations(cafile=str(self._settings.ca_path))
        return ctx

    async def _list_pods(self) -> list[Mapping[str, Any]]:
        s = self._settings
        if self._session is None:
            if self._session_factory is not None:
                self._session = self._session_factory()
            else:
                self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl()))
        try:
            token = s.token_path.read_text().strip()  # re-read: projected tokens rotate
        except OSError as exc:
            raise KubeError(f"service account token: {exc}") from exc
        url = f"{s.api_url}/api/v1/pods?fieldSelector={quote('spec.nodeName=' + s.node_name)}"
        try:
            async with self._session.get(
                url,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                timeout=aiohttp.ClientTimeout(total=s.timeout_seconds),
            ) as resp:
                if resp.status != 200:
                    raise KubeError(f"GET pods: HTTP {resp.status}")
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise KubeError(f"GET pods: {exc}") from exc
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise KubeError("GET pods: no items list")
        return items

    async def targets(self) -> list[Target]:
        """Annotated, running pods of this node as targets."""
        now = self._clock.time()
        if self._fetched_at is not None and now - self._fetched_at < self._settings.refresh_seconds:
            return self._targets
        self._fetched_at = now
        try:
            pods = await self._list_pods()
        except KubeError as exc:
            log.warning("engine pod discovery failed, keeping %d targets: %s", len(self._targets), exc)
            return self._targets
        self._targets = sorted(
            (t for p in pods if (t := target_from_pod(p)) is not None), key=lambda t: t.url
        )
        return self._targets

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
