"""Engine targets from annotations on this node's pods.

The pods come from the shared reflector (exporter/kube/reflector.py): one LIST and then WATCHes, with
the field selector spec.nodeName=<node>, as a kubelet and client-go's reflector do: the LIST asks for
resourceVersion "0", which the API server answers from its watch cache instead of etcd; each WATCH
resumes from the last resourceVersion seen (events and BOOKMARKs) and ends after
watch_timeout_seconds, when the next one starts where it stopped; only a 410 Expired (the server no
longer has that resourceVersion) costs a new LIST, which then reads the current state
(resourceVersion ""). docs/scale.md counts the requests.

Annotations (docs/design/engines.md):
  gpupulse.io/engine  vllm|sglang|tgi|triton|trtllm|dynamo|auto  (required: opts the pod in)
  gpupulse.io/port    metrics port (default per engine kind; required for auto)
  gpupulse.io/path    metrics path (default /metrics; /prometheus/metrics for trtllm)
  gpupulse.io/scheme  http|https (default http)
  gpupulse.io/model   model name override
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from exporter.engines.detect import KINDS
from exporter.engines.settings import KubeSettings
from exporter.engines.targets import AUTO, Target
from exporter.kube.client import ApiSettings, KubeClient
from exporter.kube.reflector import PodReflector, ReflectorStats
from gpupulse.clock import Clock

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


DiscoveryStats = ReflectorStats  # what the source asked of the API server (docs/scale.md)
Sleep = Callable[[float], Awaitable[None]]


class KubePodSource(PodReflector):
    """This node's annotated pods, kept current by a watch; the last good state survives API errors."""

    log = log

    def __init__(
        self,
        settings: KubeSettings,
        clock: Clock,
        client_factory: Callable[[ApiSettings], KubeClient] = KubeClient,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        super().__init__(settings, client_factory=client_factory, sleep=sleep)
        self._clock = clock
        self._targets: list[Target] = []
        self._synced = asyncio.Event()

    async def targets(self) -> list[Target]:
        """Annotated, running pods of this node as targets. Only the first call waits (at most
        timeout_seconds) for the first LIST; later calls never wait on the API server."""
        first = not self.started
        self.start()
        if first and not self._synced.is_set():
            try:
                await asyncio.wait_for(self._synced.wait(), self._settings.timeout_seconds)
            except TimeoutError:
                log.warning("engine pod discovery: no pod list yet from %s", self._settings.api_url)
        return self._targets

    def _publish(self) -> None:
        self._targets = sorted(
            (t for p in self._objects.values() if (t := target_from_pod(p)) is not None), key=lambda t: t.url
        )
        self._synced.set()
