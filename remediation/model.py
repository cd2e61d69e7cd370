"""Types shared by the controller's parts: intake, engine (ladder), backends and API.

Intake turns webhook payloads into AlertEvents and records them durably; the engine consumes them
one at a time and decides; backends act. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from gpupulse.contract import TargetKind as TargetKind

AlertStatus = Literal["firing", "resolved"]
Rung = Literal["restart", "migrate", "page"]


@dataclass(frozen=True)
class AlertEvent:
    """One alert of one Alertmanager notification, as accepted and stored by intake."""

    fingerprint: str
    status: AlertStatus
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime | None
    generator_url: str
    receiver: str
    group_key: str
    received_at: datetime
    # the intake row id; engines use (fingerprint, starts_at, status) for idempotence
    inbox_id: int = 0

    @property
    def dedup_key(self) -> str:
        return f"{self.fingerprint}|{self.starts_at.isoformat()}|{self.status}"


@dataclass(frozen=True)
class Target:
    """What a remediation acts on (see docs/alerts.md for the identity labels per kind)."""

    kind: TargetKind
    node: str = ""
    namespace: str = ""
    pod: str = ""
    uuid: str = ""
    # a job target: its top controller (`Kind.group`, name); node/uuid/pod then name the suspect rank
    training_job_kind: str = ""
    training_job: str = ""

    @property
    def key(self) -> str:
        if self.kind == "job":
            return (
                f"job:{self.namespace}/{self.training_job_kind}/{self.training_job}@{self.node}/{self.uuid}"
            )
        return f"{self.kind}:{self.node}/{self.namespace}/{self.pod}/{self.uuid}"


@dataclass(frozen=True)
class ActionResult:
    """What a backend did; `details` go into the ledger verbatim."""

    done: bool
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)


class ActionBackend(Protocol):
    """Carries out the restart and migrate rungs (local commands, Kubernetes, ...)."""

    name: str

    async def restart(self, target: Target, reason: str) -> ActionResult: ...

    async def migrate(self, target: Target, reason: str) -> ActionResult: ...


@runtime_checkable
class LemonMarker(Protocol):
    """A backend that marks a lemon's node where the cluster's users look (the Kubernetes backend: the
    gpupulse.io/lemon label), and then refuses to return that node to service."""

    async def mark_lemon(self, node: str, uuids: Sequence[str], detail: str) -> None: ...


# records what an action is about to change (the pods' UIDs) before it changes it; returns once stored
Prepare = Callable[[Mapping[str, Any]], Awaitable[None]]


@runtime_checkable
class ResumableBackend(Protocol):
    """A backend some of whose rungs the next leader may carry out again when the last one recorded
    them as started but never their outcome (fenced by a lapsed Lease, or a crash): each such rung
    first records what it is about to change (`prepare`), and taken again with that record
    (`prepared`) it changes only what is still as recorded, so a rung done once is never done twice
    (docs/design/ha.md, "Fenced actions")."""

    def resumable(self, rung: Rung, target: Target) -> bool:
        """Whether this rung on this target may be taken again after it was left unconfirmed."""

    async def act(
        self,
        rung: Rung,
        target: Target,
        reason: str,
        prepared: Mapping[str, Any] | None,
        prepare: Prepare,
    ) -> ActionResult:
        """Take a resumable rung; `prepared`: what an earlier try recorded (empty or None: none did)."""


ActionPhase = Literal["started", "success", "failed", "temporary", "refused", "dry_run"]
# how a validation of a quarantined GPU ended (temporary: ask again later)
ValidationPhase = Literal["passed", "failed", "temporary"]


@dataclass(frozen=True)
class ActionNotice:
    """One action of the ladder, or its outcome, told where the target's owners look (Kubernetes
    Events): which rung, on what, for which incident and signature, and what happened."""

    target: Target
    rung: Rung
    phase: ActionPhase
    incident_id: int
    signature: str
    summary: str


class MigratePreview(Protocol):
    """A backend that can show what a dry-run migrate would touch without acting (the Kubernetes
    backend's DeviceTaintRule with effect None, when configured); None when it has nothing to show."""

    async def preview_migrate(self, target: Target, reason: str) -> ActionResult | None: ...


class ReturnToService(Protocol):
    """A backend that can test a quarantined GPU and lift its quarantine only on a pass."""

    async def return_to_service(
        self, target: Target, fault_class: str, incident_id: int, attempt: int
    ) -> ActionResult: ...


class ActionAudit(Protocol):
    """Tells a cluster's users what the controller does (remediation/kube/events.py); best effort."""

    async def announce(self, notice: ActionNotice) -> None: ...


@dataclass(frozen=True)
class Page:
    """One page to a human, with everything needed to act without opening another tool."""

    dedup_key: str  # one per incident: re-sending updates, never duplicates
    summary: str
    severity: str
    fault_class: str
    signature: str
    runbook_url: str
    target: Target
    history: Sequence[Mapping[str, Any]]  # the ladder so far, oldest first
    resolved: bool = False
    # what changed when the symptom began: headline, top cause, evidence, dashboard link
    # (remediation/decide/pages.py page_diagnosis); None for grouped pages
    diagnosis: Mapping[str, Any] | None = None


class NodeLabels(Protocol):
    """Where the engine reads a Node's labels (for the node selector of its scope)."""

    async def labels(self, node: str) -> Mapping[str, str] | None:
        """The node's labels; None when no such node exists. Raises when they cannot be read now."""
        ...


class Pager(Protocol):
    name: str

    async def send(self, page: Page) -> None: ...


class Engine(Protocol):
    """The decision maker behind intake and the API."""

    async def handle(self, event: AlertEvent) -> None:
        """Process one accepted alert; must be idempotent on event.dedup_key."""
        ...

    async def tick(self) -> None:
        """Advance timers: verification windows, cooldowns, retries of temporary failures."""
        ...

    def list_incidents(
        self, state: str | None = None, limit: int = 100, signature: str | None = None
    ) -> Sequence[Mapping[str, Any]]: ...

    def get_incident(self, incident_id: int) -> Mapping[str, Any] | None: ...

    def list_signatures(self) -> Sequence[Mapping[str, Any]]: ...

    def stats(self) -> Mapping[str, Any]: ...

    def pause(self, by: str) -> Mapping[str, Any]: ...

    def resume(self, by: str) -> Mapping[str, Any]: ...

    def reset_breaker(self, by: str) -> Mapping[str, Any]: ...
