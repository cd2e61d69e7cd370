"""The Kubernetes API access the plug-ins of one exporter share: where the API server is, and the
one pod store of this node (exporter/kube/pods.py), made when a plug-in first asks for it.

Imported by the exporter's core whichever plug-ins are on, so it imports the API client and the
reflector only when a store is made: an exporter without Kubernetes plug-ins never loads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.kube.client import ApiSettings
    from exporter.kube.pods import PodStore


class KubeContext:
    """The Kubernetes API access the plug-ins of one exporter share: where the API server is, and one
    pod store of this node, made when a plug-in first asks for it (none when no plug-in does)."""

    def __init__(
        self,
        settings: ApiSettings | None,
        store_factory: Callable[[ApiSettings], PodStore] | None = None,
    ) -> None:
        self.settings = settings  # None: no node name, nothing of this node is watched
        self._store_factory = store_factory
        self._store: PodStore | None = None

    def pods(self) -> PodStore | None:
        """The node's pod store (the same one for every caller); None without a node name."""
        if self._store is None and self.settings is not None:
            if self._store_factory is None:
                from exporter.kube.pods import PodStore

                self._store_factory = PodStore
            self._store = self._store_factory(self.settings)
        return self._store

    async def close(self) -> None:
        """Stop the pod watch (after the plug-ins that read it have closed)."""
        if self._store is not None:
            await self._store.close()
