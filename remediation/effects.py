"""The effects a decision asks for: what the runner (remediation/runner.py) carries out after commit.

A decision records its intent in the ledger and returns these; nothing here does I/O. Each effect's
outcome comes back to the transitions as another decision (remediation/transitions/outcomes.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from remediation.model import Page, Rung, Target


@dataclass(frozen=True)
class Act:
    """Run one rung (restart or migrate) through the backend; `entry_id` is its `started` entry."""

    entry_id: int
    incident_id: int
    rung: Rung
    target: Target
    reason: str
    signature: str = ""  # the signature that chose this rung (told in the target's Events)
    # a training job's drain first waits this long at most for its next step (remediation/drain.py)
    boundary_wait_seconds: float = 0.0
    decided_at: float = 0.0
    # taken again after it was left unconfirmed (remediation.model.ResumableBackend): what the earlier
    # try recorded it was about to change ({} when it recorded nothing); None for a first try
    prepared: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class SendPage:
    """Send (or resolve) one incident's own page; with `labels`, its diagnosis is refreshed first."""

    incident_id: int
    entry_id: int
    page: Page
    labels: Mapping[str, str] | None = None
    fired_at: float = 0.0


@dataclass(frozen=True)
class Diagnose:
    """Diagnose an incident that just opened (remediation/diagnosis) and record what was found."""

    incident_id: int
    labels: Mapping[str, str]
    fired_at: float
    trigger: str = "open"


@dataclass(frozen=True)
class SendGroupPage:
    """Send one page that speaks for many incidents (the breaker's group, or a summary page)."""

    group: str
    page: Page
    member_ids: tuple[int, ...]
    # the rem_state row that schedules this group's pages (the breaker's, or a summary's)
    state_key: str = "breaker"


@dataclass(frozen=True)
class CheckPromQL:
    """Ask Prometheus whether a resolved incident's verify query is healthy."""

    incident_id: int
    query: str


@dataclass(frozen=True)
class Announce:
    """Tell the target's owners about a rung that was decided but not run (a dry run): the audit
    trail (Kubernetes Events) then shows what the controller would have done."""

    incident_id: int
    rung: Rung
    target: Target
    signature: str
    summary: str


@dataclass(frozen=True)
class Validate:
    """Validate a quarantined GPU and return it to service only on a pass (the backend's
    return_to_service); `attempt` names the validation Job, so a re-dispatch waits on the same one."""

    incident_id: int
    target: Target
    fault_class: str
    attempt: int


@dataclass(frozen=True)
class MarkLemon:
    """Mark a node that holds a lemon (remediation/lemons.py) where its owners look: the Kubernetes
    backend labels it gpupulse.io/lemon; other backends keep the mark in the ledger only."""

    incident_id: int
    node: str
    uuids: tuple[str, ...]  # the lemon GPUs on it (none when the node itself is the lemon)
    detail: str


Effect = Act | SendPage | SendGroupPage | CheckPromQL | Diagnose | Announce | Validate | MarkLemon
