"""Engine targets from annotations on this node's pods.

The pods come from the node's one pod store (exporter/kube/pods.py), which the other plug-ins read
too: this module keeps only its view of them, the targets (`target_from_pod` over every pod, after
each change). The store's LIST and WATCHes (field selector spec.nodeName=<node>) are
exporter/kube/reflector.py's; docs/scale.md counts the requests.

Annotations (docs/design/engines.md):
  gpupulse.io/engine  vllm|sglang|tgi|triton|trtllm|dynamo|auto  (required: opts the pod in)
  gpupulse.io/port    metrics port (default per engine kind; required for auto)
  gpupulse.io/path    metrics path (default /metrics; /prometheus/metrics for trtllm)
  gpupulse.io/scheme  http|https (default http)
  gpupulse.io/model   model name override
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from exporter.engines.detect import KINDS
from exporter.engines.targets import AUTO, Target
from exporter.kube.pods import Pods, PodStore, PodView

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


def targets_of(pods: Pods) -> list[Target]:
    """The targets of the annotated, running pods, in URL order (the engines' view of the store)."""
    return sorted((t for p in pods.values() if (t := target_from_pod(p)) is not None), key=lambda t: t.url)


class KubePodSource:
    """This node's annotated pods as engine targets, a view of the node's pod store; the last good
    state survives API errors."""

    def __init__(self, store: PodStore) -> None:
        self._view: PodView[list[Target]] = store.view("engines", targets_of)
        self._waited = False

    @property
    def view(self) -> PodView[list[Target]]:
        """The engines' view of the store (its stats and error are the store's)."""
        return self._view

    async def targets(self) -> list[Target]:
        """Annotated, running pods of this node as targets. Only the first call waits (at most the
        API timeout) for the store's first LIST; later calls never wait on the API server."""
        view = self._view
        view.start()  # the store may be started by another plug-in already, or listed
        if not self._waited:
            self._waited = True
            try:
                await view.wait_until(lambda: view.stats.lists > 0, view.store.settings.timeout_seconds)
            except TimeoutError:
                log.warning("engine pod discovery: no pod list yet from %s", view.store.settings.api_url)
        return view.value

    async def close(self) -> None:
        """Nothing of its own to close: the exporter closes the shared store."""
