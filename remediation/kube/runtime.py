"""Connect to the cluster and build the Kubernetes backend, gated by leader election when enabled."""

from __future__ import annotations

from dataclasses import dataclass

from gpupulse.clock import Clock, SystemClock
from remediation.backends.kubernetes import KubernetesBackend, KubernetesBackendSettings
from remediation.kube.client import KubeClient, KubeClientSettings
from remediation.kube.leader import LeaderElectionSettings, LeaderElector


@dataclass
class KubeRuntime:
    """The connected client, the backend and (when enabled) the elector that gates it."""

    client: KubeClient
    backend: KubernetesBackend
    elector: LeaderElector | None

    async def close(self) -> None:
        """Close the API connection."""
        await self.client.close()


async def connect(
    client_settings: KubeClientSettings,
    backend_settings: KubernetesBackendSettings,
    election: LeaderElectionSettings | None = None,
    clock: Clock | None = None,
) -> KubeRuntime:
    """Connect and build the backend; with `election`, the backend acts only while this replica leads."""
    clock = clock or SystemClock()
    client = await KubeClient.connect(client_settings)
    elector = LeaderElector(client, election, clock) if election is not None else None
    backend = KubernetesBackend(
        client,
        backend_settings,
        clock,
        may_act=(lambda: elector.is_leader) if elector is not None else None,
    )
    return KubeRuntime(client, backend, elector)
