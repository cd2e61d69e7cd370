"""Which diagnoses a signature acts on: the `diagnosis:` field of a signature, and the pure check the
ladder makes before an acting rung (restart, migrate).

    diagnosis:
      acts_on: [hardware, scheduling.gpu_memory_neighbour]   # act only when the diagnosis names one
      not_when: [host.page_cache_eviction, serving]          # never act when it names one

Each entry is a layer (`hardware`, `host`, `scheduling`, `serving`) or a cause id of the catalogue.
Only a confident diagnosis decides; without one ("no diagnosis", or two layers about even) the
ladder runs as it would without diagnosis. A signature whose ladder restarts and that says nothing
gets `not_when` the causes a restart of ours cannot fix (DEFAULT_NOT_WHEN_RESTARTING): restarting
the pod neither brings the weights back into the page cache nor removes traffic, a rollout or restart
already in progress is made worse by another, and a neighbour that takes the GPU's SM time or the
node's CPU is still there afterwards (its owner is the one to page); each drops the requests in
flight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remediation.diagnosis.catalogue import CAUSE_IDS
from remediation.diagnosis.types import LAYERS, Candidate, Diagnosis

DEFAULT_NOT_WHEN_RESTARTING: tuple[str, ...] = (
    "host.page_cache_eviction",
    "serving.load",
    "serving.rollout",
    "scheduling.gpu_sm_neighbour",
    "host.cpu_contention",
)
_FIELDS = {"acts_on", "not_when"}
KNOWN_SELECTORS: frozenset[str] = frozenset(LAYERS) | CAUSE_IDS


@dataclass(frozen=True)
class DiagnosisPolicy:
    acts_on: tuple[str, ...] = ()
    not_when: tuple[str, ...] | None = None  # None: the default for the signature's ladder

    def effective_not_when(self, rungs: Sequence[str]) -> tuple[str, ...]:
        if self.not_when is not None:
            return self.not_when
        return DEFAULT_NOT_WHEN_RESTARTING if "restart" in rungs else ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.acts_on:
            out["acts_on"] = list(self.acts_on)
        if self.not_when is not None:
            out["not_when"] = list(self.not_when)
        return out


def parse_policy(raw: object, fail: Callable[[str, str], Exception]) -> DiagnosisPolicy:
    """Validate a signature's `diagnosis:` mapping; `fail(field, message)` builds the error to raise."""
    if raw is None:
        return DiagnosisPolicy()
    if not isinstance(raw, Mapping):
        raise fail("diagnosis", "must be a mapping with acts_on and/or not_when")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise fail(f"diagnosis.{sorted(unknown)[0]}", f"unknown field (allowed: {sorted(_FIELDS)})")
    lists: dict[str, tuple[str, ...]] = {}
    for key in _FIELDS & set(raw):
        value = raw[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise fail(f"diagnosis.{key}", "must be a list of layers or cause ids")
        bad = sorted(set(value) - KNOWN_SELECTORS)
        if bad:
            raise fail(
                f"diagnosis.{key}",
                f"unknown layer or cause {bad[0]!r} (layers {list(LAYERS)}; causes {sorted(CAUSE_IDS)})",
            )
        lists[key] = tuple(value)
    overlap = set(lists.get("acts_on", ())) & set(lists.get("not_when", ()))
    if overlap:
        raise fail("diagnosis", f"{sorted(overlap)[0]!r} is in both acts_on and not_when")
    return DiagnosisPolicy(acts_on=lists.get("acts_on", ()), not_when=lists.get("not_when"))


def names(selector: str, candidate: Candidate) -> bool:
    """Whether a policy entry (a layer or a cause id) names this candidate."""
    return selector in (candidate.cause, candidate.layer)


def veto(policy: DiagnosisPolicy, rungs: Sequence[str], diagnosis: Diagnosis | None) -> str:
    """Why the signature must not act on this diagnosis ("" when it may, or when the diagnosis is
    not sure enough to decide anything)."""
    top = diagnosis.top if diagnosis is not None and diagnosis.confident else None
    if top is None:
        return ""
    for selector in policy.effective_not_when(rungs):
        if names(selector, top):
            return (
                f"diagnosis: {top.label} ({top.evidence[0].note if top.evidence else 'no evidence'}); "
                f"this signature does not act on {selector}"
            )
    if policy.acts_on and not any(names(s, top) for s in policy.acts_on):
        return f"diagnosis: {top.label}; this signature acts only on {', '.join(policy.acts_on)}"
    return ""
