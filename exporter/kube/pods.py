"""This node's pods, listed and watched once for every plug-in: each plug-in asks the store for a view
(a projection of the pods), and reads only what its projection made of them.

kube-state-metrics feeds every pod family from one store; so do we: one LIST and one WATCH of pods per
node (field selector spec.nodeName=<node>, exporter/kube/reflector.py), however many plug-ins read
them. A projection runs after the first LIST and after every change, on the loop; it gets the store's
pods as a read-only map and must not keep it (the store changes it in place). One that raises keeps
its last value and is logged (once until it works again): one plug-in's bug never stops another's
view, nor the watch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from exporter.kube.client import ApiSettings, KubeClient
from exporter.kube.reflector import Key, PodReflector, ReflectorStats
from gpupulse.clock import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")
Pods = Mapping[Key, Mapping[str, Any]]  # (namespace, name) -> the pod object
Projection = Callable[[Pods], T]


class PodView(Generic[T]):
    """One plug-in's view of the node's pods: what its projection made of them after the last change.
    Starting and waiting go to the store, which one view starts for all."""

    def __init__(self, store: PodStore, name: str, project: Projection[T]) -> None:
        self.store = store
        self.name = name
        self._project = project
        self._failing = False  # logged once until it works again: the store changes on every event
        self.value: T = project(MappingProxyType({}))

    def _update(self, pods: Pods) -> None:
        try:
            self.value = self._project(pods)
        except Exception:
            if not self._failing:
                log.exception("pod view %s failed; keeping its last value", self.name)
            self._failing = True
        else:
            self._failing = False

    # the store's state, so a plug-in holds its view alone

    @property
    def stats(self) -> ReflectorStats:
        return self.store.stats

    @property
    def error(self) -> str:
        return self.store.error

    @property
    def started(self) -> bool:
        return self.store.started

    def start(self) -> None:
        """Start the shared watch (idempotent)."""
        self.store.start()

    async def wait_until(self, predicate: Callable[[], bool], timeout_seconds: float) -> None:
        """Wait until predicate() holds, re-checked after every change of the store."""
        await self.store.wait_until(predicate, timeout_seconds)

    async def close(self) -> None:
        """Nothing to close: the store belongs to the exporter, which closes it after the plug-ins."""


class PodStore(PodReflector):
    """This node's pods, kept current by one watch; the views registered on it are updated on every
    change. The last good state survives API errors."""

    log = log

    def __init__(
        self,
        settings: ApiSettings,
        client_factory: Callable[[ApiSettings], KubeClient] = KubeClient,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(settings, client_factory=client_factory, sleep=sleep, clock=clock)
        self._views: list[PodView[Any]] = []
        self._listed = False

    @property
    def settings(self) -> ApiSettings:
        """Where and how the pods are watched."""
        return self._settings

    @property
    def views(self) -> tuple[str, ...]:
        """The names of the views registered, in order (for logs and tests)."""
        return tuple(v.name for v in self._views)

    def view(self, name: str, project: Projection[T]) -> PodView[T]:
        """Register a projection of the pods; it runs now on what the store holds, then on every change."""
        got: PodView[T] = PodView(self, name, project)
        if self._listed:
            got._update(MappingProxyType(self._objects))
        self._views.append(got)
        return got

    def _publish(self) -> None:
        self._listed = True
        pods = MappingProxyType(self._objects)
        for v in self._views:
            v._update(pods)
