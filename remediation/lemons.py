"""Lemons: the quarantine history of each GPU and node, and the rule that keeps a repeat offender out.

A quarantine is a migrate that cordoned a node (its outcome `success`). Each one is written to the
history of the GPU it named (by UUID, with its serial when the alert carried one) and of its node,
as rows of the ledger's rem_state (`faults:gpu:<uuid>`, `faults:node:<node>`). Those rows are the
engine's switches: SQLite keeps them across restarts and, in cluster mode, the write-through carries
them to the GpuRemediationState object and a new leader restores them (docs/design/lemons.md says
why no new table or resource). A GPU or node quarantined `quarantines` times within `window_seconds`
becomes a lemon, once: it is never returned to service automatically and its incident pages for RMA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from gpupulse.durations import format_duration
from remediation.ledger import Ledger
from remediation.model import Target
from remediation.settings import LemonSettings

PREFIX = "faults:"
# quarantines kept per GPU or node: the evidence an RMA needs, bounded so the switches object stays small
MAX_HISTORY = 20

LemonKind = Literal["gpu", "node"]


@dataclass(frozen=True)
class Quarantine:
    """One quarantine of a GPU or node: when, by which incident and signature."""

    at: float
    incident_id: int
    signature: str
    fault_class: str
    node: str
    uuid: str = ""
    serial: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "incident": self.incident_id,
            "signature": self.signature,
            "fault_class": self.fault_class,
            "node": self.node,
            "uuid": self.uuid,
            "serial": self.serial,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Quarantine:
        return cls(
            at=float(raw.get("at") or 0.0),
            incident_id=int(raw.get("incident") or 0),
            signature=str(raw.get("signature") or ""),
            fault_class=str(raw.get("fault_class") or ""),
            node=str(raw.get("node") or ""),
            uuid=str(raw.get("uuid") or ""),
            serial=str(raw.get("serial") or ""),
        )


@dataclass(frozen=True)
class Lemon:
    """A GPU or node that became a lemon: what it is, where, and the quarantines that made it one."""

    kind: LemonKind
    ident: str  # the GPU's UUID or the node's name
    node: str
    serial: str
    history: tuple[Quarantine, ...]

    def describe(self, window_seconds: float) -> str:
        what = f"GPU {self.ident}" + (f" (serial {self.serial})" if self.serial else "")
        what += f" on node {self.node}" if self.kind == "gpu" else ""
        if self.kind == "node":
            what = f"node {self.ident}"
        steps = "; ".join(
            f"{_utc(q.at)} incident {q.incident_id} {q.signature} ({q.fault_class})" for q in self.history
        )
        return (
            f"{what} quarantined {len(self.history)} times within {format_duration(window_seconds)}: {steps}"
        )


def is_lemon_due(history: Sequence[Quarantine], now: float, settings: LemonSettings) -> bool:
    """Whether this history makes a lemon: `quarantines` of them within the window before now."""
    if settings.quarantines <= 0:
        return False
    recent = [q for q in history if q.at >= now - settings.window_seconds]
    return len(recent) >= settings.quarantines


def row_name(kind: LemonKind, ident: str) -> str:
    return f"{PREFIX}{kind}:{ident}"


class LemonBook:
    """The quarantine histories and lemon marks over one Ledger (call inside a decision's transaction)."""

    def __init__(self, ledger: Ledger, settings: LemonSettings) -> None:
        self.ledger = ledger
        self.settings = settings

    def history(self, kind: LemonKind, ident: str) -> list[Quarantine]:
        raw = self.ledger.get_state(row_name(kind, ident)).get("history") or []
        return [Quarantine.from_dict(r) for r in raw]

    def lemon(self, kind: LemonKind, ident: str) -> Mapping[str, Any]:
        """The lemon mark of a GPU or node ({} when it is none)."""
        state = self.ledger.get_state(row_name(kind, ident))
        return state if state.get("lemon") else {}

    def refusal(self, target: Target) -> str:
        """Why this target must not be returned to service automatically ("" when it may be):
        auto-uncordon and validation ask this before they return a node or GPU."""
        if target.uuid and self.lemon("gpu", target.uuid):
            return f"GPU {target.uuid} is a lemon: {self.lemon('gpu', target.uuid).get('why', '')}"
        if target.node and self.lemon("node", target.node):
            return f"node {target.node} is a lemon: {self.lemon('node', target.node).get('why', '')}"
        return ""

    def record(self, quarantine: Quarantine, now: float) -> list[Lemon]:
        """Add one quarantine to its GPU's and node's histories; returns those that became lemons now
        (a GPU or node already a lemon is not returned again: it pages once)."""
        self._prune(now)
        found: list[Lemon] = []
        keys: list[tuple[LemonKind, str]] = []
        if quarantine.uuid:
            keys.append(("gpu", quarantine.uuid))
        if quarantine.node:
            keys.append(("node", quarantine.node))
        for kind, ident in keys:
            name = row_name(kind, ident)
            state = self.ledger.get_state(name)
            history = [*self.history(kind, ident), quarantine][-MAX_HISTORY:]
            # a serial names a GPU; a node's row keeps each quarantine's serial in its history only
            serial = (quarantine.serial or str(state.get("serial") or "")) if kind == "gpu" else ""
            value: dict[str, Any] = {
                **state,
                "kind": kind,
                "id": ident,
                "node": quarantine.node,
                "serial": serial,
                "history": [q.to_dict() for q in history],
            }
            if not state.get("lemon") and is_lemon_due(history, now, self.settings):
                recent = tuple(q for q in history if q.at >= now - self.settings.window_seconds)
                lemon = Lemon(kind, ident, quarantine.node, serial, recent)
                value.update(lemon=True, lemon_at=now, why=lemon.describe(self.settings.window_seconds))
                found.append(lemon)
            self.ledger.set_state(name, value)
        return found

    def lemons(self) -> list[dict[str, Any]]:
        """Every lemon, oldest first: what, where, since when, how many quarantines, whether marked."""
        found = [
            {
                "kind": str(state.get("kind") or ""),
                "id": str(state.get("id") or ""),
                "node": str(state.get("node") or ""),
                "serial": str(state.get("serial") or ""),
                "since": float(state.get("lemon_at") or 0.0),
                "quarantines": len(state.get("history") or []),
                "marked": bool(state.get("marked")),
            }
            for state in self.ledger.states(PREFIX).values()
            if state.get("lemon")
        ]
        return sorted(found, key=lambda lemon: (lemon["since"], lemon["kind"], lemon["id"]))

    def unmarked(self) -> dict[str, tuple[list[str], list[str]]]:
        """Lemons whose node does not carry the mark yet, by node: (their GPUs' UUIDs, why)."""
        out: dict[str, tuple[list[str], list[str]]] = {}
        for state in self.ledger.states(PREFIX).values():
            if state.get("lemon") and not state.get("marked") and state.get("node"):
                uuids, whys = out.setdefault(str(state["node"]), ([], []))
                if state.get("kind") == "gpu":
                    uuids.append(str(state.get("id")))
                whys.append(str(state.get("why") or ""))
        return out

    def marked(self, node: str, now: float) -> None:
        """The node carries the mark of its lemons now: a restart need not mark it again."""
        for name, state in self.ledger.states(PREFIX).items():
            if state.get("lemon") and state.get("node") == node and not state.get("marked"):
                self.ledger.set_state(name, {**state, "marked": True, "marked_at": now})

    def _prune(self, now: float) -> None:
        """Forget histories with nothing inside the window that are no lemon (a lemon's stays)."""
        cutoff = now - self.settings.window_seconds
        for name, state in self.ledger.states(PREFIX).items():
            newest = max((float(r.get("at") or 0.0) for r in state.get("history") or []), default=0.0)
            if not state.get("lemon") and newest < cutoff:
                self.ledger.delete_state(name)


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
