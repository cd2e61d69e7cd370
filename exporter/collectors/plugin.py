"""What the exporter hands every plug-in's `from_args`: the parts they share, built once.

Today that is the Kubernetes API access of this node (exporter/kube/context.py: one pod store, however
many plug-ins read pods). It sits below the plug-ins so that each can name it without knowing the
registry above them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.kube.context import KubeContext


@dataclass(frozen=True)
class PluginContext:
    """Shared by the plug-ins of one exporter; the exporter closes it after them."""

    kube: KubeContext = field(default_factory=lambda: KubeContext(None))

    async def close(self) -> None:
        """Stop what the plug-ins shared (the pod watch)."""
        await self.kube.close()
