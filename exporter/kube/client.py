"""Where and how the exporter reaches the Kubernetes API: settings and the service-account client.

kubernetes_asyncio (its generated client imports every API group and model: about 35 MiB of RSS) is
imported when the first API client is made, so a node whose collectors never talk to the API server
does not carry it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.errors import KubeError

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s


@dataclass(frozen=True)
class ApiSettings:
    """One watch of this node's objects: the API server, the credentials, the timeouts."""

    node_name: str
    api_url: str = "https://kubernetes.default.svc"
    token_path: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    ca_path: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    timeout_seconds: float = 5.0  # one LIST, and the first sync a reader waits for
    # Each watch asks the server to end it after this long, jittered up to twice as long (client-go's
    # reflector uses 5-10 min), so watches spread over API server replicas after a rollout.
    watch_timeout_seconds: float = 300.0
    # After a failed LIST or WATCH wait this long, doubling up to retry_max_seconds.
    retry_seconds: float = 1.0
    retry_max_seconds: float = 60.0


def api_client(settings: ApiSettings) -> k8s.ApiClient:
    """An API client for the pod's service account; the token is re-read before every request,
    because projected service-account tokens rotate."""
    from kubernetes_asyncio import client as k8s

    configuration = k8s.Configuration(host=settings.api_url)
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    if settings.api_url.startswith("https"):
        configuration.verify_ssl = True
        if settings.ca_path is not None:
            configuration.ssl_ca_cert = str(settings.ca_path)

    def refresh(config: k8s.Configuration) -> None:
        try:
            config.api_key = {"BearerToken": settings.token_path.read_text().strip()}
        except OSError as exc:
            raise KubeError(f"service account token: {exc}") from exc

    refresh(configuration)  # the client sends a token only once one is set
    configuration.refresh_api_key_hook = refresh
    return k8s.ApiClient(configuration)
