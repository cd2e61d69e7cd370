"""The ladder's restart and migrate rungs carried out on Kubernetes.

restart deletes the pod (with a UID precondition) so its controller replaces it, or rolls its
Deployment; migrate cordons and taints the node and evicts the affected pods through the Eviction
API, except for a GPU target whose GPU DRA allocates: that one device is tainted with a
DeviceTaintRule and the node keeps serving (remediation/kube/quarantine.py). A job target (a
distributed training job) is restarted as a gang through its controller (remediation/kube/jobs.py),
and its migrate cordons the suspect node, then restarts the job so that it is scheduled away from it.
Every action holds the node's Lease, and every write first checks that this replica may act.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from gpupulse.clock import Clock, SystemClock
from remediation.capacity import pool_refusal
from remediation.errors import (
    ActionError,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeTooManyRequests,
    PermanentError,
    TemporaryError,
)
from remediation.kube.client import KubeClient
from remediation.kube.devices import Device, find_gpu_devices
from remediation.kube.devicetaints import EFFECTS, DeviceTaintEffect, remove_rule, rule_name
from remediation.kube.eviction import DeadlinePolicy, EvictionSettings, evict_pods
from remediation.kube.jobs import restart_job
from remediation.kube.lease import LeaseStore
from remediation.kube.nodelock import NodeBusy, NodeLock
from remediation.kube.nodes import NodeConflict, cordon_and_taint, taint_value, uncordon
from remediation.kube.pods import (
    JSON,
    PodRef,
    controller_owner,
    is_mirror_pod,
    is_terminating,
    pods_using_gpu,
    requests_gpu,
    skip_reason,
)
from remediation.kube.pools import count_pool, lemon_of, mark_lemon
from remediation.kube.quarantine import DeviceQuarantineSettings, preview_device, quarantine_device
from remediation.kube.returning import return_device, validation_name
from remediation.kube.timing import micro_time
from remediation.kube.validation import ValidationSettings, validation_from_mapping
from remediation.model import ActionResult, Prepare, Rung, Target
from remediation.settings import PoolSettings

log = logging.getLogger(__name__)

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"


def _recorded(pod: JSON) -> dict[str, str]:
    ref = PodRef.of(pod)
    return {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}


@dataclass(frozen=True)
class KubernetesBackendSettings:
    """What the backend may do and how long it waits; defaults are the conservative choice."""

    namespace: str  # the controller's namespace: node Leases live here
    identity: str  # this replica (the pod name); node Lease holders are <identity>/<random>
    # Deployment pods: delete the one pod, or roll the whole Deployment (kubectl rollout restart)
    deployment_restart: Literal["delete_pod", "rollout_restart"] = "delete_pod"
    allow_bare_pods: bool = False  # a pod without a controller never comes back once deleted
    pod_delete_grace_period_seconds: int | None = None  # None: the pod's own terminationGracePeriod
    taint_key: str = "gpupulse.io/remediation"
    eviction_deadline_seconds: float = 300.0
    eviction_backoff_initial_seconds: float = 1.0
    eviction_backoff_max_seconds: float = 30.0
    eviction_concurrency: int = 8
    # what happens to pods a PodDisruptionBudget still protects at the deadline
    on_eviction_deadline: DeadlinePolicy = "fail"
    blocked_retry_delay_seconds: float = 60.0
    auto_uncordon: bool = False
    # target_kind node: evict only GPU pods, or everything evictable (kubectl drain)
    node_scope: Literal["gpu_pods", "all_pods"] = "gpu_pods"
    gpu_resource_prefixes: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-")
    gpu_uuid_annotation: str = "gpupulse.io/gpu-uuids"
    node_lease_duration_seconds: int = 900
    node_patch_attempts: int = 5
    api_retry_delay_seconds: float = 10.0
    # a GPU target's migrate where DRA allocates its GPU: taint that device (DeviceTaintRule), not
    # the node (remediation/kube/quarantine.py); "off" keeps the node path everywhere
    device_quarantine: Literal["auto", "off"] = "auto"
    device_taint_effect: DeviceTaintEffect = "NoSchedule"
    dra_drivers: tuple[str, ...] = ("gpu.nvidia.com",)
    # in the engine's dry run, write a GPU's DeviceTaintRule with effect None: no scheduling effect, and
    # kube-controller-manager reports on it what NoExecute would evict. Off by default: a dry run
    # otherwise writes nothing to the cluster but Events
    dry_run_device_preview: bool = False
    # the validation Job that must pass before a quarantined GPU returns to service
    # (remediation/kube/validation.py); None: return_to_service refuses, the GPU stays out
    validation: ValidationSettings | None = None
    # minHealthy per pool (remediation/capacity.py): the Node label naming a node's pool ("" = every
    # GPU node is one pool) and how many of a pool's nodes may be out at once ("10%", "2"; "" = any)
    pool_label: str = ""
    pool_max_unavailable: str = ""

    def __post_init__(self) -> None:
        if self.node_lease_duration_seconds <= self.eviction_deadline_seconds:
            raise ValueError("node_lease_duration_seconds must outlast eviction_deadline_seconds")
        if self.on_eviction_deadline not in ("fail", "delete"):
            raise ValueError("on_eviction_deadline must be 'fail' or 'delete'")
        if self.device_quarantine not in ("auto", "off"):
            raise ValueError("device_quarantine must be 'auto' or 'off'")
        if self.device_taint_effect not in EFFECTS:
            raise ValueError(f"device_taint_effect must be one of {', '.join(EFFECTS)}")
        self.pools.validate()

    @property
    def pools(self) -> PoolSettings:
        return PoolSettings(label=self.pool_label, max_unavailable=self.pool_max_unavailable)


class KubernetesBackend:
    """ActionBackend for pods and nodes of a Kubernetes cluster."""

    name = "kubernetes"

    def __init__(
        self,
        client: KubeClient,
        settings: KubernetesBackendSettings,
        clock: Clock | None = None,
        may_act: Callable[[], bool] | None = None,
    ) -> None:
        self._client = client
        self._settings = settings
        self._clock = clock or SystemClock()
        # with leader election: LeaderElector.is_leader, checked before every write
        self._may_act = may_act or (lambda: True)
        self._lock = NodeLock(
            LeaseStore(client, settings.namespace),
            settings.identity,
            self._clock,
            settings.node_lease_duration_seconds,
        )
        # held from a pool's count to the cordon it allows: two migrates never both take its last place
        self._pool_gate = asyncio.Lock()

    def _guard(self) -> None:
        if not self._may_act():
            raise TemporaryError(
                "this replica is not the leader: not acting", self._settings.api_retry_delay_seconds
            )

    # --- restart

    async def restart(self, target: Target, reason: str) -> ActionResult:
        """Replace the target's pod(s) through their controller; never touches a bare pod unless allowed."""
        return await self._restart(target, reason, None, None)

    # --- taken again by the next leader (remediation.model.ResumableBackend)

    def resumable(self, rung: Rung, target: Target) -> bool:
        """A pod restart by delete (each delete preconditioned on the UID recorded before it) and a
        migrate (cordon and taint, or a DRA GPU's DeviceTaintRule, are ensured idempotently; what was
        evicted is gone, and the cordon or taint keeps its replacements away) can be taken again; a
        gang restart, a job's migrate (a gang restart too) and a Deployment rollout cannot: they are
        verified instead."""
        if target.kind in ("job", "exporter"):
            return False
        if rung == "restart":
            return self._settings.deployment_restart == "delete_pod"
        return rung == "migrate"

    async def act(
        self,
        rung: Rung,
        target: Target,
        reason: str,
        prepared: Mapping[str, Any] | None,
        prepare: Prepare,
    ) -> ActionResult:
        if rung == "migrate":
            return await self.migrate(target, reason)
        return await self._restart(target, reason, prepared, prepare)

    async def _restart(
        self,
        target: Target,
        reason: str,
        prepared: Mapping[str, Any] | None,
        prepare: Prepare | None,
    ) -> ActionResult:
        self._guard()
        if target.kind == "job":
            return await self._restart_job(target, reason, cordoned="")
        done: list[dict[str, Any]] = []
        try:
            async with self._errors("restart", target):
                recorded = list((prepared or {}).get("pods") or [])
                if recorded:
                    # taken again: only the pods recorded before the first try, while their UID holds
                    node = str((prepared or {}).get("node") or target.node)
                    async with self._node_lock(node):
                        for ref in recorded:
                            done.append(await self._restart_recorded(ref, reason))
                else:
                    pods = await self._restart_candidates(target)
                    node = target.node or PodRef.of(pods[0]).node
                    async with self._node_lock(node):
                        if prepare is not None:
                            # stored before any delete: a next leader deletes these UIDs or nothing
                            await prepare({"node": node, "pods": [_recorded(p) for p in pods]})
                        for pod in pods:
                            done.append(await self._restart_pod(pod, reason))
        except TemporaryError as exc:
            if not done and isinstance(exc.__cause__, KubeTooManyRequests):
                # throttled before any pod was replaced: the server changed nothing, not an action
                raise TemporaryError(str(exc), exc.delay_seconds, nothing_changed=True) from exc.__cause__
            raise
        summary = "; ".join(str(d["summary"]) for d in done)
        return ActionResult(
            done=True, summary=summary, details={"node": node, "pods": done, "reason": reason}
        )

    async def _restart_recorded(self, ref: Mapping[str, Any], reason: str) -> dict[str, Any]:
        """A pod an earlier try recorded: restarted while it is still that pod (same UID); gone or
        replaced, the earlier try (or its controller) already did it."""
        namespace, name, uid = str(ref.get("namespace")), str(ref.get("name")), str(ref.get("uid"))
        key = f"{namespace}/{name}"
        try:
            pod = await self._client.get_pod(namespace, name)
        except KubeNotFound:
            pod = None
        if pod is None or PodRef.of(pod).uid != uid:
            return {
                "pod": key,
                "uid": uid,
                "action": "delete_pod",
                "outcome": "already_replaced",
                "summary": f"pod {key} (uid {uid}) already replaced",
            }
        return await self._restart_pod(pod, reason)

    async def _restart_job(self, target: Target, reason: str, cordoned: str) -> ActionResult:
        """One gang restart of a training job (one action, however many ranks it has)."""
        written: list[str] = []
        try:
            async with self._errors("restart", target):
                if not (target.namespace and target.training_job and target.training_job_kind):
                    raise PermanentError(f"restart needs the job's namespace, kind and name for {target.key}")
                done = await restart_job(
                    self._client,
                    target.training_job_kind,
                    target.namespace,
                    target.training_job,
                    reason,
                    self._guard,
                    written,
                )
        except TemporaryError as exc:
            if not written and isinstance(exc.__cause__, KubeTooManyRequests):
                # throttled before the first delete (or Command): no rank was touched, not an action
                raise TemporaryError(str(exc), exc.delay_seconds, nothing_changed=True) from exc.__cause__
            raise
        summary = (f"cordoned {cordoned}, then " if cordoned else "") + done.summary()
        details: dict[str, Any] = {**done.details(), "reason": reason, "suspect_node": target.node}
        if cordoned:
            details["cordoned"] = cordoned
        return ActionResult(done=True, summary=summary, details=details)

    async def _restart_candidates(self, target: Target) -> list[JSON]:
        if target.kind == "exporter":
            raise PermanentError("exporter targets are not restarted by the Kubernetes backend")
        if target.namespace and target.pod:
            try:
                return [await self._client.get_pod(target.namespace, target.pod)]
            except KubeNotFound as exc:
                raise PermanentError(f"pod {target.namespace}/{target.pod} no longer exists") from exc
        if target.kind == "gpu" and target.node and target.uuid:
            s = self._settings
            on_node = await self._client.list_pods_on_node(target.node)
            live: list[JSON] = [p for p in on_node if not skip_reason(p)]
            pods, exact = pods_using_gpu(live, target.uuid, s.gpu_resource_prefixes, s.gpu_uuid_annotation)
            if exact and pods:
                return pods
            raise PermanentError(
                f"cannot tell which pod on {target.node} uses GPU {target.uuid} "
                f"(no {s.gpu_uuid_annotation} annotation): restart needs a pod identity"
            )
        raise PermanentError(f"restart needs a pod identity (namespace and pod) for {target.key}")

    async def _restart_pod(self, pod: JSON, reason: str) -> dict[str, Any]:
        ref = PodRef.of(pod)
        if is_mirror_pod(pod):
            raise PermanentError(f"pod {ref.key} is a static (mirror) pod: the kubelet owns it")
        if is_terminating(pod):
            return {
                "pod": ref.key,
                "uid": ref.uid,
                "action": "none",
                "summary": f"{ref.key} already terminating",
            }
        owner = controller_owner(pod)
        if owner is None and not self._settings.allow_bare_pods:
            raise PermanentError(f"pod {ref.key} has no controller: deleting it would not bring it back")
        owner_kind = str(owner.get("kind")) if owner else ""
        owner_name = str(owner.get("name")) if owner else ""
        if owner_kind == "ReplicaSet" and self._settings.deployment_restart == "rollout_restart":
            deployment = await self._deployment_of(ref.namespace, owner_name)
            if deployment:
                self._guard()
                now = micro_time(self._clock.utcnow())
                patch = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}}
                await self._client.patch_deployment(ref.namespace, deployment, patch)
                return {
                    "pod": ref.key,
                    "uid": ref.uid,
                    "action": "rollout_restart",
                    "owner": f"Deployment/{deployment}",
                    "summary": f"rolled Deployment {ref.namespace}/{deployment} ({RESTARTED_AT}={now})",
                }
        self._guard()
        try:
            await self._client.delete_pod(
                ref.namespace, ref.name, ref.uid, self._settings.pod_delete_grace_period_seconds
            )
            outcome = "deleted"
        except (KubeNotFound, KubeConflict):
            outcome = "already_replaced"  # gone, or the name now belongs to a replacement: never delete that
        return {
            "pod": ref.key,
            "uid": ref.uid,
            "action": "delete_pod",
            "owner": f"{owner_kind}/{owner_name}" if owner else "",
            "outcome": outcome,
            "summary": f"{outcome.replace('_', ' ')} pod {ref.key} (owner {owner_kind or 'none'})",
        }

    async def _deployment_of(self, namespace: str, replica_set: str) -> str:
        try:
            rs = await self._client.get_replica_set(namespace, replica_set)
        except KubeNotFound:
            return ""
        owner = controller_owner(rs)
        return str(owner.get("name")) if owner and owner.get("kind") == "Deployment" else ""

    # --- migrate

    async def migrate(self, target: Target, reason: str) -> ActionResult:
        """Cordon and taint the node, then evict the affected pods, honouring PodDisruptionBudgets."""
        self._guard()
        left: list[str] = []
        try:
            if target.kind == "job":
                return await self._migrate_job(target, reason, left)
            devices = await self._dra_devices(target)
            if devices:
                return await self._migrate_device(target, reason, devices, left)
            return await self._migrate_node(target, reason, left)
        except TemporaryError as exc:
            if not left and isinstance(exc.__cause__, KubeTooManyRequests):
                # throttled before the cordon: the server changed nothing, not an action
                raise TemporaryError(str(exc), exc.delay_seconds, nothing_changed=True) from exc.__cause__
            exc.left = "; ".join(left)
            # a job's gang restart refused after our cordon: the cordon was a change all the same
            exc.nothing_changed = exc.nothing_changed and not left
            raise
        except ActionError as exc:
            exc.left = "; ".join(left)
            raise

    def _left_cordoned(self, node: str, reason: str) -> str:
        """What a cordon leaves for a human, and the commands that undo it."""
        key = self._settings.taint_key
        return (
            f"node {node} left cordoned and tainted {key}={taint_value(reason)}:NoSchedule; "
            f"undo: kubectl uncordon {node} && kubectl taint node {node} {key}-"
        )

    async def _migrate_node(self, target: Target, reason: str, left: list[str]) -> ActionResult:
        s = self._settings
        async with self._errors("migrate", target):
            node = await self._node_of(target)
            async with self._node_lock(node):
                async with self._pool_budget(node):
                    change = await cordon_and_taint(
                        self._client,
                        node,
                        s.taint_key,
                        reason,
                        self._clock,
                        s.node_patch_attempts,
                        self._guard,
                    )
                left.append(self._left_cordoned(node, reason))
                pods, skipped, scope = await self._pods_to_move(target, node)
                report = await evict_pods(
                    self._client,
                    [PodRef.of(p) for p in pods if not is_terminating(p)],
                    EvictionSettings(
                        deadline_seconds=s.eviction_deadline_seconds,
                        backoff_initial_seconds=s.eviction_backoff_initial_seconds,
                        backoff_max_seconds=s.eviction_backoff_max_seconds,
                        concurrency=s.eviction_concurrency,
                    ),
                    self._clock,
                    self._guard,
                    terminating=[PodRef.of(p) for p in pods if is_terminating(p)],
                )
                forced: list[str] = []
                stuck = set(report.blocked) | set(report.terminating)
                if stuck and s.on_eviction_deadline == "delete":
                    forced = await self._force_delete(pods, stuck, now=set(report.terminating))
        details: dict[str, Any] = {
            "node": node,
            "cordoned": True,
            "node_changed": change.changed,
            "taint": f"{s.taint_key}={taint_value(reason)}:NoSchedule",
            "scope": scope,
            "evicted": sorted(report.evicted),
            "gone": sorted(report.gone),
            "skipped": skipped,
            "forced_delete": sorted(forced),
            "blocked": dict(sorted(report.blocked.items())) if not forced else {},
            "terminating": dict(sorted(report.terminating.items())) if not forced else {},
            "misconfigured": dict(sorted(report.misconfigured.items())),
            "eviction_attempts": report.attempts,
            "left": "; ".join(left),
        }
        if report.misconfigured:
            raise PermanentError(
                f"node {node} cordoned; eviction refused as misconfigured for "
                f"{', '.join(sorted(report.misconfigured))}: {next(iter(report.misconfigured.values()))}"
            )
        if report.blocked and not forced:
            raise TemporaryError(
                f"node {node} cordoned; eviction of {', '.join(sorted(report.blocked))} still refused "
                f"after {s.eviction_deadline_seconds:.0f}s "
                f"({len(report.evicted)} evicted): {next(iter(report.blocked.values()))}",
                s.blocked_retry_delay_seconds,
            )
        if report.terminating and not forced:
            raise TemporaryError(
                f"node {node} cordoned; {', '.join(sorted(report.terminating))} evicted but not gone after "
                f"{s.eviction_deadline_seconds:.0f}s ({len(report.evicted)} gone): "
                f"{next(iter(report.terminating.values()))}; on_eviction_deadline: delete force-deletes them",
                s.blocked_retry_delay_seconds,
            )
        summary = (
            f"cordoned {node}, evicted {len(report.evicted)} pod(s)"
            + (f", force-deleted {len(forced)} past the PDB deadline" if forced else "")
            + (f", skipped {len(skipped)}" if skipped else "")
        )
        return ActionResult(done=True, summary=summary, details=details)

    # --- migrate of one DRA device (remediation/kube/quarantine.py)

    async def _dra_devices(self, target: Target) -> list[Device]:
        """The DRA devices of a GPU target's GPU; none (the node path) for other targets, with
        device_quarantine off, and where no ResourceSlice publishes the GPU (a device-plugin cluster)."""
        s = self._settings
        if target.kind != "gpu" or not (target.node and target.uuid) or s.device_quarantine == "off":
            return []
        try:
            async with self._errors("migrate", target):
                return await find_gpu_devices(self._client, target.node, target.uuid, s.dra_drivers)
        except PermanentError as exc:
            # resource.k8s.io/v1 not served, or not readable by us: the node path, as before DRA
            log.warning("no DRA device lookup for %s, quarantining the node: %s", target.key, exc)
            return []

    async def _migrate_device(
        self, target: Target, reason: str, devices: list[Device], left: list[str]
    ) -> ActionResult:
        s = self._settings
        quarantine = DeviceQuarantineSettings(
            taint_key=s.taint_key,
            effect=s.device_taint_effect,
            eviction=EvictionSettings(
                deadline_seconds=s.eviction_deadline_seconds,
                backoff_initial_seconds=s.eviction_backoff_initial_seconds,
                backoff_max_seconds=s.eviction_backoff_max_seconds,
                concurrency=s.eviction_concurrency,
            ),
            blocked_retry_delay_seconds=s.blocked_retry_delay_seconds,
        )
        async with self._errors("migrate", target):
            async with self._node_lock(target.node):
                return await quarantine_device(
                    self._client,
                    target.node,
                    target.uuid,
                    devices,
                    reason,
                    quarantine,
                    self._clock,
                    self._guard,
                    left,
                )

    async def preview_migrate(self, target: Target, reason: str) -> ActionResult | None:
        """The dry run's migrate of a DRA GPU: its rules with effect None (an existing stronger rule
        stays as it is); None when not configured or not a DRA GPU."""
        if not self._settings.dry_run_device_preview:
            return None
        devices = await self._dra_devices(target)
        if not devices:
            return None
        self._guard()
        async with self._errors("migrate", target):
            async with self._node_lock(target.node):
                return await preview_device(
                    self._client,
                    target.node,
                    target.uuid,
                    devices,
                    reason,
                    self._settings.taint_key,
                    self._guard,
                )

    async def _migrate_job(self, target: Target, reason: str, left: list[str]) -> ActionResult:
        """Cordon the suspect rank's node first, then restart the whole job: it reschedules elsewhere.

        Nothing is evicted: the gang restart stops every rank, the ones on this node included."""
        s = self._settings
        if not target.node:
            raise PermanentError(f"migrating job {target.key} needs the suspect rank's node")
        async with self._errors("migrate", target):
            async with self._node_lock(target.node):
                async with self._pool_budget(target.node):
                    await cordon_and_taint(
                        self._client,
                        target.node,
                        s.taint_key,
                        reason,
                        self._clock,
                        s.node_patch_attempts,
                        self._guard,
                    )
                left.append(self._left_cordoned(target.node, reason))
        return await self._restart_job(target, reason, cordoned=target.node)

    async def _node_of(self, target: Target) -> str:
        if target.kind == "exporter":
            raise PermanentError("exporter targets are not migrated by the Kubernetes backend")
        if target.node:
            return target.node
        if target.namespace and target.pod:
            try:
                node = PodRef.of(await self._client.get_pod(target.namespace, target.pod)).node
            except KubeNotFound as exc:
                raise PermanentError(f"pod {target.namespace}/{target.pod} no longer exists") from exc
            if node:
                return node
        raise PermanentError(f"cannot tell which node {target.key} runs on")

    async def _pods_to_move(self, target: Target, node: str) -> tuple[list[JSON], dict[str, str], str]:
        """Pods in scope, those already terminating among them: migrate is done only once they are gone."""
        s = self._settings
        on_node = await self._client.list_pods_on_node(node)
        # a pod already terminating is in scope too: a hung kubelet keeps it (and its GPU) on the node
        skipped = {PodRef.of(p).key: why for p in on_node if (why := skip_reason(p)) and why != "terminating"}
        live: list[JSON] = [p for p in on_node if skip_reason(p) in ("", "terminating")]
        if target.kind == "pod" or (target.namespace and target.pod):
            wanted = f"{target.namespace}/{target.pod}"
            return [p for p in live if PodRef.of(p).key == wanted], skipped, f"pod {wanted}"
        if target.kind == "gpu":
            pods, exact = pods_using_gpu(live, target.uuid, s.gpu_resource_prefixes, s.gpu_uuid_annotation)
            how = "annotated" if exact else "all GPU pods on the node"
            return pods, skipped, f"pods using GPU {target.uuid or '?'} ({how})"
        if s.node_scope == "gpu_pods":
            return (
                [p for p in live if requests_gpu(p, s.gpu_resource_prefixes)],
                skipped,
                "GPU pods on the node",
            )
        return live, skipped, "all evictable pods on the node"

    async def _force_delete(self, pods: list[JSON], keys: set[str], now: set[str] | None = None) -> list[str]:
        """Delete the pods of `keys`; those of `now` (already terminating on a node that does not
        confirm) with no grace period, which frees their name and GPU without the kubelet."""
        forced = []
        for pod in pods:
            ref = PodRef.of(pod)
            if ref.key not in keys:
                continue
            self._guard()
            grace = 0 if now and ref.key in now else self._settings.pod_delete_grace_period_seconds
            try:
                await self._client.delete_pod(ref.namespace, ref.name, ref.uid, grace)
            except (KubeNotFound, KubeConflict):
                pass
            forced.append(ref.key)
        return forced

    # --- uncordon (only when configured; otherwise a human's call)

    async def uncordon(self, target: Target, reason: str) -> ActionResult:
        """Remove our taint and cordon after verified recovery, if auto_uncordon is configured."""
        s = self._settings
        if not s.auto_uncordon:
            raise PermanentError("auto_uncordon is off: uncordoning is a human's decision")
        self._guard()
        async with self._errors("uncordon", target):
            node = await self._node_of(target)
            await self._refuse_lemon(node)
        devices = await self._dra_devices(target)
        if devices:
            return await self._release_devices(target, devices)
        async with self._errors("uncordon", target):
            async with self._node_lock(node):
                change = await uncordon(self._client, node, s.taint_key, s.node_patch_attempts, self._guard)
        verb = "uncordoned" if change.changed else "left alone (not cordoned by gpupulse)"
        return ActionResult(
            done=True, summary=f"{verb} {node}", details={"node": node, "changed": change.changed}
        )

    async def _release_devices(self, target: Target, devices: list[Device]) -> ActionResult:
        """Delete our DeviceTaintRules of the target's GPU: the devices serve again."""
        async with self._errors("uncordon", target):
            async with self._node_lock(target.node):
                names = [rule_name(target.node, d) for d in devices]
                removed = [n for n in names if await remove_rule(self._client, n, self._guard)]
        summary = f"removed DeviceTaintRule {' '.join(removed)}" if removed else "no DeviceTaintRule of ours"
        return ActionResult(
            done=True,
            summary=f"{summary} for GPU {target.uuid} on {target.node}",
            details={
                "node": target.node,
                "quarantine": "device",
                "removed": removed,
                "changed": bool(removed),
            },
        )

    async def return_to_service(
        self, target: Target, fault_class: str, incident_id: int, attempt: int
    ) -> ActionResult:
        """Validate a quarantined DRA GPU and, only on a pass, delete its DeviceTaintRules
        (remediation/kube/returning.py); the engine asks once the GPU's alert resolved."""
        validation = self._settings.validation
        if validation is None:
            raise PermanentError(
                "no validation is configured (backend setting validation): the GPU stays out"
            )
        self._guard()
        async with self._errors("return", target):
            await self._refuse_lemon(target.node)
        devices = await self._dra_devices(target)
        if not devices:
            raise PermanentError(f"return to service: {target.key} is no DRA GPU of a ResourceSlice")
        name = validation_name(incident_id, attempt)
        async with self._errors("return", target):
            return await return_device(
                self._client,
                target.node,
                target.uuid,
                devices,
                fault_class,
                name,
                validation,
                self._clock,
                self._guard,
                self._node_lock,
            )

    # --- lemons and pools

    async def mark_lemon(self, node: str, uuids: Sequence[str], detail: str) -> None:
        """Label a lemon's node (remediation/kube/pools.py); uncordon then refuses it."""
        await mark_lemon(self._client, node, uuids, detail, self._guard)

    async def _refuse_lemon(self, node: str) -> None:
        """Nothing on a lemon's node (the gpupulse.io/lemon label) returns to service automatically:
        neither the node nor a device of it; a human removes the label after the repair."""
        lemon = lemon_of(await self._client.get_node(node)) if node else ""
        if lemon:
            raise PermanentError(
                f"node {node} is a lemon ({lemon}): nothing on it returns to service until a human "
                "removes the gpupulse.io/lemon label"
            )

    @asynccontextmanager
    async def _pool_budget(self, node: str) -> AsyncIterator[None]:
        """Refuse, before any write, a cordon that would take more of the node's pool out than its
        budget allows; the refusal changed nothing (TemporaryError nothing_changed), so it is retried
        later and then paged, never counted as an action."""
        s = self._settings
        if s.pools.allowed_out(1) is None:
            yield
            return
        async with self._pool_gate:
            count = await count_pool(self._client, node, s.pool_label, s.taint_key, s.gpu_resource_prefixes)
            why = pool_refusal(s.pools, count.pool, count.total, count.out, node)
            if why:
                raise TemporaryError(why, s.blocked_retry_delay_seconds, nothing_changed=True)
            yield

    # --- shared

    @asynccontextmanager
    async def _node_lock(self, node: str) -> AsyncIterator[None]:
        if not node:
            yield
            return
        try:
            async with self._lock.hold(node):
                yield
        except NodeBusy as exc:
            delay = max(1.0, min(exc.seconds_left, self._settings.api_retry_delay_seconds))
            # the Lease is taken before any write: a locked attempt changed nothing, it is no action
            # (three of them counted as a restart loop and escalated to a migrate)
            raise TemporaryError(str(exc), delay, nothing_changed=True) from exc

    @asynccontextmanager
    async def _errors(self, action: str, target: Target) -> AsyncIterator[None]:
        """Turn API failures into the ladder's permanent / temporary outcomes."""
        delay = self._settings.api_retry_delay_seconds
        try:
            yield
        except NodeConflict as exc:
            raise TemporaryError(str(exc), delay) from exc
        except KubeForbidden as exc:
            raise PermanentError(
                f"{action} {target.key}: forbidden by the API server (RBAC?): {exc}"
            ) from exc
        except KubeInvalid as exc:
            raise PermanentError(f"{action} {target.key}: request rejected: {exc}") from exc
        except KubeNotFound as exc:
            raise PermanentError(f"{action} {target.key}: object gone: {exc}") from exc
        except (KubeConflict, KubeTooManyRequests) as exc:
            # never sooner than the server asked (API Priority and Fairness: the Retry-After header)
            raise TemporaryError(
                f"{action} {target.key}: {exc}", max(delay, exc.retry_after_seconds)
            ) from exc
        except KubeError as exc:
            raise TemporaryError(
                f"{action} {target.key}: API unavailable: {exc}", max(delay, exc.retry_after_seconds)
            ) from exc


def settings_from_mapping(raw: Mapping[str, Any]) -> KubernetesBackendSettings:
    """Build settings from a config mapping (unknown keys are an error, not ignored)."""
    known = set(KubernetesBackendSettings.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown kubernetes backend settings: {', '.join(sorted(unknown))}")
    values = dict(raw)
    for key in ("gpu_resource_prefixes", "dra_drivers"):
        if key in values:
            values[key] = tuple(values[key])
    if values.get("validation") is not None:
        values["validation"] = validation_from_mapping(values["validation"], str(values.get("namespace", "")))
    return KubernetesBackendSettings(**values)
