"""Typed records the ledger returns: an incident, a ledger entry, a handled event, an alert's latest state.

The ledger (remediation/ledger.py) is the only code that sees SQLite rows; it turns each row into one
of these frozen dataclasses here, so the row -> record mapping (the incident's target columns above
all) is written once. JSON columns arrive decoded: labels and annotations as mappings, the firing
fingerprints as a tuple.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, cast

import orjson

from remediation.diagnosis.types import Diagnosis
from remediation.model import Target, TargetKind

# the incident columns stored as JSON text, and how each reads back
_JSON_COLUMNS = ("firing_fps", "labels", "annotations")


def target_columns(target: Target) -> dict[str, str]:
    """The rem_incidents columns that hold an incident's target (the one mapping, both ways)."""
    return {
        "target_kind": target.kind,
        "target_node": target.node,
        "target_namespace": target.namespace,
        "target_pod": target.pod,
        "target_uuid": target.uuid,
        "target_training_job_kind": target.training_job_kind,
        "target_training_job": target.training_job,
    }


def encode_incident_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """Column values for an INSERT or UPDATE: a Target becomes its columns, JSON columns are dumped."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name == "target":
            out.update(target_columns(cast(Target, value)))
        elif name == "firing_fps":
            out[name] = json.dumps(sorted(value), sort_keys=True)
        elif name in _JSON_COLUMNS:
            out[name] = json.dumps(dict(value), sort_keys=True)
        else:
            out[name] = value
    return out


@dataclass(slots=True)
class Incident:
    """One incident as stored in rem_incidents (columns in schema order; JSON columns decoded)."""

    id: int
    key: str
    signature: str
    fault_class: str
    alertname: str
    target: Target
    loop_key: str
    state: str
    rung: str  # a Rung, or "" before the first rung
    attempt: int
    rung_started_at: float | None
    temp_retries: int
    next_at: float | None
    firing_fps: tuple[str, ...]
    resolved_at: float | None
    opened_at: float
    updated_at: float
    closed_at: float | None
    resolution: str
    reason: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    page_pending: bool
    page_next_at: float
    paged: bool
    page_group: str
    group_sent: bool
    trace_id: str
    span_id: str
    evidence_at: float | None
    held: int  # 0, or remediation.decide.HELD / HELD_DUE
    page_sticky: bool

    @classmethod
    def from_row(cls, sql_row: sqlite3.Row) -> Incident:
        # spelled out, not looped over fields(), and read from a dict: sqlite3.Row looks names up one
        # by one, and the engine reads many rows per decision
        row = dict(zip(sql_row.keys(), sql_row, strict=True))
        return cls(
            id=row["id"],
            key=row["key"],
            signature=row["signature"],
            fault_class=row["fault_class"],
            alertname=row["alertname"],
            target=Target(
                kind=cast(TargetKind, row["target_kind"]),
                node=row["target_node"],
                namespace=row["target_namespace"],
                pod=row["target_pod"],
                uuid=row["target_uuid"],
                training_job_kind=row["target_training_job_kind"],
                training_job=row["target_training_job"],
            ),
            loop_key=row["loop_key"],
            state=row["state"],
            rung=row["rung"],
            attempt=row["attempt"],
            rung_started_at=row["rung_started_at"],
            temp_retries=row["temp_retries"],
            next_at=row["next_at"],
            firing_fps=tuple(orjson.loads(row["firing_fps"])),
            resolved_at=row["resolved_at"],
            opened_at=row["opened_at"],
            updated_at=row["updated_at"],
            closed_at=row["closed_at"],
            resolution=row["resolution"],
            reason=row["reason"],
            labels=orjson.loads(row["labels"]),
            annotations=orjson.loads(row["annotations"]),
            page_pending=bool(row["page_pending"]),
            page_next_at=row["page_next_at"],
            paged=bool(row["paged"]),
            page_group=row["page_group"],
            group_sent=bool(row["group_sent"]),
            trace_id=row["trace_id"],
            span_id=row["span_id"],
            evidence_at=row["evidence_at"],
            held=row["held"],
            page_sticky=bool(row["page_sticky"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """The operator API's view: every column by its stored name, JSON decoded, plus `target`."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "target":
                out.update(target_columns(value))
            elif f.name == "firing_fps":
                out[f.name] = list(value)
            elif f.name in _JSON_COLUMNS:
                out[f.name] = dict(value)
            elif f.name in ("page_pending", "paged", "group_sent", "page_sticky"):
                out[f.name] = int(value)
            else:
                out[f.name] = value
        out["target"] = {k.removeprefix("target_"): v for k, v in target_columns(self.target).items()}
        return out


@dataclass(frozen=True)
class LedgerEntry:
    """One rem_ledger entry: an event, or an action with its intent and (once known) outcome."""

    id: int
    incident_id: int
    at: float
    kind: str  # "event" | "action"
    rung: str
    attempt: int
    status: str
    finished_at: float | None
    summary: str

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> LedgerEntry:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class HandledEvent:
    """An event already handled: its incident (if any), and whether it came too old to act on."""

    dedup_key: str
    incident_id: int | None
    at: float
    stale: bool


@dataclass(frozen=True)
class AlertSeen:
    """The newest (startsAt, status) seen for one alert fingerprint."""

    fingerprint: str
    starts: float
    status: str
    at: float


@dataclass(frozen=True)
class DiagnosisRecord:
    """One diagnosis of an incident: when, why it ran ("open" or "page"), and what it found."""

    id: int
    incident_id: int
    at: float
    trigger: str
    diagnosis: Diagnosis

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> DiagnosisRecord:
        return cls(
            id=row["id"],
            incident_id=row["incident_id"],
            at=row["at"],
            trigger=row["trigger"],
            diagnosis=Diagnosis.from_dict(orjson.loads(row["body"])),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "trigger": self.trigger, **self.diagnosis.to_dict()}
