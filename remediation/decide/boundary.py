"""How long a training job's drain may wait for its next step or checkpoint: the fault's urgency decides.

A fatal fault (a GPU off the bus, a reset-class XID, a hung gang) drains now: the job makes no more
progress worth keeping, so a wait only burns GPU hours. A degrading one (a slow or throttled rank, a
throughput drop) still trains, slower: draining right after its next step or checkpoint loses less
work than evicting a rank mid-step, so it may wait up to `drain.checkpoint_wait_max_seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from remediation.model import Rung, Target
from remediation.settings import EngineDrainSettings

Urgency = Literal["fatal", "degrading"]

# The fault classes under which a job still progresses (gpupulse/contract.py FAULT_CLASSES). Every
# other class is fatal: an unknown one drains at once, as before drains waited at all.
DEGRADING_FAULT_CLASSES: frozenset[str] = frozenset(
    {"training_straggler", "training_degraded", "thermal", "memory_pressure", "host_starvation"}
)


@dataclass(frozen=True)
class BoundaryWait:
    """The decided wait: 0 s = drain now; `why` says which rule chose it (for the ledger)."""

    seconds: float
    urgency: Urgency
    why: str


def urgency_of(fault_class: str) -> Urgency:
    return "degrading" if fault_class in DEGRADING_FAULT_CLASSES else "fatal"


def boundary_wait(
    rung: Rung,
    target: Target,
    fault_class: str,
    settings: EngineDrainSettings,
    signature_wait_max_seconds: float | None = None,
) -> BoundaryWait:
    """The wait before this rung drains `target` (only a job's restart or migrate ever waits); a
    signature's own `ladder.checkpoint_wait_max_seconds` replaces the urgency rule and the tunable."""
    urgency = urgency_of(fault_class)
    if target.kind != "job" or rung not in ("restart", "migrate"):
        return BoundaryWait(0.0, urgency, "not a training job: drained as today")
    if signature_wait_max_seconds is not None:
        return BoundaryWait(
            signature_wait_max_seconds,
            urgency,
            f"the signature waits at most {signature_wait_max_seconds:.0f} s for the job's next step",
        )
    if urgency == "fatal":
        return BoundaryWait(0.0, urgency, f"fatal fault ({fault_class}): drained now")
    if settings.checkpoint_wait_max_seconds <= 0:
        return BoundaryWait(0.0, urgency, "drain.checkpoint_wait_max is off: drained now")
    return BoundaryWait(
        settings.checkpoint_wait_max_seconds,
        urgency,
        f"degrading fault ({fault_class}): waits for the job's next step, at most "
        f"{settings.checkpoint_wait_max_seconds:.0f} s",
    )
