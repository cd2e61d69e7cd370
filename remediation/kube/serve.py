"""`serve --backend kubernetes`: intake on every replica, the ladder engine only on the leader.

Connects to the API server (remediation/kube/runtime.py), builds the Kubernetes backend and, with
leader election on, campaigns for the Lease (remediation/kube/leader.py): the leader opens the ledger
and drains the shared inbox; a follower keeps accepting alerts and answers the API as a follower
(EngineProxy). Losing leadership ends the process (LeadershipLost) so it restarts clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from gpupulse.clock import SystemClock
from remediation.errors import ConfigError, KubeError, LeadershipLost, NotLeader
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent, Engine
from remediation.settings import Settings

if TYPE_CHECKING:
    from remediation.backends.kubernetes import KubernetesBackendSettings
    from remediation.kube.events import KubeSwitchAudit
    from remediation.kube.incidents import IncidentStore
    from remediation.kube.leader import LeaderElector
    from remediation.kube.runtime import KubeRuntime
    from remediation.server import RunningService

log = logging.getLogger(__name__)


class EngineProxy:
    """The Engine the HTTP service sees: the ladder engine while it exists, a follower's answers otherwise.

    Closing it closes the engine and then the Kubernetes API connection.
    """

    def __init__(self, runtime: KubeRuntime, identity: str) -> None:
        self.runtime = runtime
        self.identity = identity
        self.engine: Engine | None = None
        # each pause, resume and breaker reset as an Event on this replica's Pod (set by serve_kubernetes)
        self.switches: KubeSwitchAudit | None = None
        self._recording: set[asyncio.Task[None]] = set()

    def _leader(self) -> Engine:
        if self.engine is None:
            raise NotLeader(f"{self.identity} is not the leader; send this to the leading replica")
        return self.engine

    async def handle(self, event: AlertEvent) -> None:
        """Hand the alert to the ladder engine (only the leader's worker ever calls this)."""
        await self._leader().handle(event)

    async def tick(self) -> None:
        """Advance the engine's timers, when there is an engine."""
        if self.engine is not None:
            await self.engine.tick()

    def list_incidents(
        self, state: str | None = None, limit: int = 100, signature: str | None = None
    ) -> Sequence[Mapping[str, Any]]:
        """The leader's incidents; a follower has none open (it never opened the ledger)."""
        return self.engine.list_incidents(state, limit, signature) if self.engine is not None else []

    def get_incident(self, incident_id: int) -> Mapping[str, Any] | None:
        """One incident, from the leader's ledger."""
        return self.engine.get_incident(incident_id) if self.engine is not None else None

    def list_signatures(self) -> Sequence[Mapping[str, Any]]:
        """The leader's signature library."""
        return self.engine.list_signatures() if self.engine is not None else []

    def stats(self) -> Mapping[str, Any]:
        """The engine's stats plus who this replica is and whether it leads."""
        base = dict(self.engine.stats()) if self.engine is not None else {}
        elector = self.runtime.elector
        leading = self.engine is not None
        return {**base, "replica": self.identity, "leader": leading, "leader_election": elector is not None}

    def pause(self, by: str) -> Mapping[str, Any]:
        """Pause the leader's engine."""
        return self._switched("pause", by, self._leader().pause(by))

    def resume(self, by: str) -> Mapping[str, Any]:
        """Resume the leader's engine."""
        return self._switched("resume", by, self._leader().resume(by))

    def reset_breaker(self, by: str) -> Mapping[str, Any]:
        """Close the leader's breaker."""
        return self._switched("breaker_reset", by, self._leader().reset_breaker(by))

    def _switched(self, action: str, by: str, answer: Mapping[str, Any]) -> Mapping[str, Any]:
        """The switch has taken effect; its Event is written in the background (the API answers now)."""
        if self.switches is not None:
            announce = self.switches.announce(action, by, bool(answer.get("changed", True)))
            task = asyncio.get_running_loop().create_task(announce)
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)
        return answer

    async def close_engine(self) -> None:
        """Close the ladder engine (the ledger) and forget it."""
        from remediation.server import close_engine

        engine, self.engine = self.engine, None
        if engine is not None:
            await close_engine(engine)

    async def aclose(self) -> None:
        """Close the engine, then the API connection (after the switch Events still being written)."""
        await self.close_engine()
        if self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)
        await self.runtime.close()


def _backend_settings(settings: Settings) -> KubernetesBackendSettings:
    from remediation.backends.kubernetes import settings_from_mapping

    kube = settings.kube
    raw: dict[str, Any] = {}
    if kube.backend_config_file is not None:
        try:
            loaded = yaml.safe_load(kube.backend_config_file.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"--kube.backend-config {kube.backend_config_file}: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"--kube.backend-config {kube.backend_config_file}: not a mapping")
        raw = dict(loaded)
    raw.update(namespace=kube.namespace, identity=kube.identity)
    try:
        return settings_from_mapping(raw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--kube.backend-config: {e}") from e


async def connect_kube(settings: Settings) -> KubeRuntime:
    """Connect to the API server and build the backend (and the elector when leader election is on)."""
    from remediation.kube.client import KubeClientSettings
    from remediation.kube.leader import LeaderElectionSettings
    from remediation.kube.runtime import connect

    kube = settings.kube
    election = (
        LeaderElectionSettings(
            namespace=kube.namespace,
            identity=kube.identity,
            lease_name=kube.lease_name,
            legacy_lease_name=kube.legacy_lease_name,
            legacy_holder_prefix=kube.legacy_lease_holder_prefix,
            lease_duration_seconds=kube.lease_duration_seconds,
            renew_deadline_seconds=kube.renew_deadline_seconds,
            retry_period_seconds=kube.retry_period_seconds,
        )
        if kube.leader_election
        else None
    )
    client_settings = KubeClientSettings(kube.kubeconfig_path, kube.context, kube.request_timeout_seconds)
    try:
        return await connect(client_settings, _backend_settings(settings), election)
    except (OSError, ValueError, TypeError) as e:  # kubeconfig missing or unreadable, no service account
        where = kube.kubeconfig_path or "in-cluster service account"
        raise ConfigError(f"cannot reach the Kubernetes API ({where}): {e}") from e


async def open_cluster_ledger(
    settings: Settings, runtime: KubeRuntime, elector: LeaderElector | None
) -> IncidentStore:
    """`--kube.ledger kubernetes`: throw the local ledger away and rebuild it from the GpuIncident
    objects (it may be behind, or ahead of a write that never landed); returns the write-through."""
    from remediation.kube.incidents import IncidentStore, IncidentStoreSettings
    from remediation.ledger import Ledger, connect
    from remediation.replication import restore

    kube = settings.kube
    store = IncidentStore(
        runtime.client,
        IncidentStoreSettings(
            namespace=kube.namespace,
            identity=kube.identity,
            term=elector.term if elector is not None else 0,
            write_deadline_seconds=kube.renew_deadline_seconds,
            instance=kube.instance,
            status_interval_seconds=kube.incident_status_interval_seconds,
        ),
        may_act=(lambda: elector.is_leader) if elector is not None else (lambda: True),
    )
    snapshot = await store.load()

    def rebuild() -> int:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{settings.db_path}{suffix}").unlink(missing_ok=True)
        ledger = Ledger(connect(settings.db_path))
        try:
            return restore(ledger, snapshot)
        finally:
            ledger.conn.close()

    count = await asyncio.to_thread(rebuild)
    log.info("%s rebuilt its ledger from %d GpuIncident object(s)", kube.identity, count)
    return store


async def _prune_incidents(settings: Settings, store: IncidentStore) -> None:
    kube = settings.kube
    while True:
        try:
            deleted = await store.prune(time.time(), kube.incident_retention_seconds, kube.incident_keep)
            if deleted:
                log.info("pruned %d closed GpuIncident object(s)", deleted)
        except KubeError as exc:
            log.warning("pruning GpuIncident objects failed: %s", exc)
        await asyncio.sleep(kube.incident_prune_interval_seconds)


async def build_kube_engine(
    settings: Settings, metrics: RemediationMetrics, proxy: EngineProxy, mirror: IncidentStore | None = None
) -> Engine:
    """The ladder engine on the ledger with the Kubernetes backend; recovers interrupted actions.

    With a mirror (cluster mode) every decision is written through to the GpuIncident objects."""
    from remediation.kube.events import KubeEventAudit
    from remediation.kube.nodelabels import KubeNodeLabels

    engine_mod = importlib.import_module("remediation.engine")
    try:
        built = await asyncio.to_thread(
            engine_mod.build_engine,
            settings.engine,
            settings.db_path,
            metrics,
            SystemClock(),
            backend=proxy.runtime.backend,
            node_labels=KubeNodeLabels(proxy.runtime.client),
            mirror=mirror,
            audit=KubeEventAudit(proxy.runtime.client, proxy.identity),
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return cast(Engine, built)


async def _rescan_shared_inbox(service: RunningService, interval_seconds: float) -> None:
    # rows another replica committed to the shared inbox never reach this worker's in-memory hand-over;
    # when some wait longer than a scan interval, send the worker through the inbox (its recovery path)
    inbox, worker = service.ctl.inbox, service.ctl.worker
    while True:
        await asyncio.sleep(interval_seconds)
        cutoff = time.time() - interval_seconds
        if await inbox.count("processed_at IS NULL AND received_at < ?", (cutoff,)) > 0:
            worker.rescan()


async def serve_kubernetes(settings: Settings) -> None:
    """`serve --backend kubernetes`: intake on every replica, the engine only on the leader."""
    from remediation.kube.events import KubeSwitchAudit
    from remediation.server import start_service

    runtime = await connect_kube(settings)
    proxy = EngineProxy(runtime, settings.kube.identity)
    proxy.switches = KubeSwitchAudit(runtime.client, settings.kube.identity, settings.kube.namespace)

    async def factory(s: Settings, metrics: RemediationMetrics) -> Engine:
        metrics.leader.set_function(lambda: 1.0 if proxy.engine is not None else 0.0)
        if runtime.elector is None:
            mirror = await open_cluster_ledger(s, runtime, None) if s.kube.ledger == "kubernetes" else None
            proxy.engine = await build_kube_engine(s, metrics, proxy, mirror)
        return proxy

    try:
        service = await start_service(settings, factory)
    except BaseException:
        await proxy.aclose()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    elector = runtime.elector
    try:
        if elector is None:
            await stop.wait()
            return
        await _serve_with_election(settings, service, proxy, elector, stop)
    finally:
        log.info("shutting down")
        await service.stop()


async def _serve_with_election(
    settings: Settings,
    service: RunningService,
    proxy: EngineProxy,
    elector: LeaderElector,
    stop: asyncio.Event,
) -> None:
    worker = service.ctl.worker
    # a follower keeps accepting into the inbox but never drains it: the worker runs only while leading
    await worker.stop()
    lost = asyncio.Event()
    trim: asyncio.Task[None] | None = None
    if settings.kube.ledger == "kubernetes":  # each replica's own inbox: a follower trims its copies
        from remediation.kube.follower import trim_follower_inbox

        trim = asyncio.create_task(
            trim_follower_inbox(
                service.ctl.inbox,
                settings.engine.max_event_age_seconds,
                max(1.0, settings.engine.max_event_age_seconds / 10),
                SystemClock(),
            )
        )

    async def lead() -> None:
        log.info("%s leads: opening the ledger and draining the inbox", proxy.identity)
        if trim is not None:
            trim.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trim
        mirror = None
        if settings.kube.ledger == "kubernetes":
            mirror = await open_cluster_ledger(settings, proxy.runtime, elector)
        proxy.engine = await build_kube_engine(settings, service.ctl.metrics, proxy, mirror)
        worker.start()
        rescan = _rescan_shared_inbox(service, max(1.0, 5 * settings.engine_tick_interval_seconds))
        if mirror is None:
            await rescan
            return
        # a write-through that failed for good ends leadership (the next leader rebuilds from the cluster)
        tasks = [
            asyncio.ensure_future(rescan),
            asyncio.ensure_future(_prune_incidents(settings, mirror)),
            asyncio.ensure_future(mirror.run_flusher()),
        ]
        try:
            await mirror.lost_event.wait()
            assert mirror.lost is not None
            raise mirror.lost
        finally:
            # what was coalesced goes out before leadership is given up (a no-op once lost or fenced)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(mirror.flush(), settings.kube.renew_deadline_seconds)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def stopped() -> None:
        await worker.stop(settings.shutdown_grace_seconds)
        await proxy.close_engine()
        if not stop.is_set():
            lost.set()

    log.info(
        "%s campaigning for Lease %s/%s", proxy.identity, settings.kube.namespace, settings.kube.lease_name
    )
    election = asyncio.create_task(elector.run(lead, stopped), name="leader-election")
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())]
    try:
        await asyncio.wait([election, *waiters], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waiters:
            task.cancel()
        if trim is not None:
            trim.cancel()
        election.cancel()  # releases the Lease when leading, after the worker and engine stopped
        with contextlib.suppress(asyncio.CancelledError):
            await election
    if lost.is_set() and not stop.is_set():
        raise LeadershipLost(f"{proxy.identity} lost leadership; exiting so it restarts as a follower")
