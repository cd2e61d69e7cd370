"""The ledger's write-through to a shared store: what a decision changed, as snapshots, and the way back.

In cluster mode the leader's SQLite ledger is a cache of the incidents kept in the cluster (see
docs/design/ha.md). `TrackedLedger` notes which incidents and switches each write touched;
`collect` turns them into snapshots (full rows, decoded as stored, so a column added later travels
without code here); the engine hands those to a `LedgerMirror` before it runs the decision's effects,
so the intent is shared before anything happens. `restore` fills a fresh ledger from snapshots.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from remediation.diagnosis.types import Diagnosis
from remediation.ledger import INBOX_PAIR, Ledger

# newest ledger entries and handled keys an incident carries to the shared store (etcd objects are
# at most 1.5 MiB; budgets and loops look back hours, far fewer entries than this)
MAX_ENTRIES = 200
MAX_HANDLED = 200
MAX_DIAGNOSES = 3  # each carries its evidence; the newest decides, older ones are history


@dataclass(frozen=True)
class IncidentSnapshot:
    """One incident as a shared store keeps it: its row, newest entries, handled keys, alert states."""

    id: int
    row: Mapping[str, Any]
    entries: Sequence[Mapping[str, Any]]
    handled: Sequence[Mapping[str, Any]]
    alerts: Sequence[Mapping[str, Any]]
    diagnoses: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class Snapshot:
    """What to write: changed incidents, and every shared switch (None: the switches did not change)."""

    incidents: Sequence[IncidentSnapshot] = ()
    switches: Mapping[str, Mapping[str, Any]] | None = None

    def __bool__(self) -> bool:
        return bool(self.incidents) or self.switches is not None


class LedgerMirror(Protocol):
    """A shared store the engine writes through to (remediation/kube/incidents.py over the API server)."""

    async def write(self, snapshot: Snapshot, defer: bool = False) -> None:
        """Store the snapshot; raise ReplicationLost (Fenced) when that cannot be done. `defer`: the
        decision has no effects, so the store may coalesce it with later ones (written within its
        interval, and before any later decision with effects)."""

    def may_act(self) -> bool:
        """Whether this replica may still carry out effects (the fencing rule)."""


@dataclass
class _Pending:
    lock: threading.Lock = field(default_factory=threading.Lock)
    incidents: set[int] = field(default_factory=set)
    switches: bool = False
    tx_fingerprints: set[str] = field(default_factory=set)
    fingerprints: dict[int, set[str]] = field(default_factory=dict)


class TrackedLedger(Ledger):
    """A Ledger that remembers what was written until `written()` is told it reached the shared store."""

    def __init__(self, conn: sqlite3.Connection, pending: _Pending | None = None) -> None:
        super().__init__(conn)
        self._pending = pending if pending is not None else _Pending()

    def sibling(self, conn: sqlite3.Connection) -> TrackedLedger:
        """Another connection's ledger sharing this one's record of changes (the operator's writes)."""
        return TrackedLedger(conn, self._pending)

    def _touch(self, incident_id: int | None) -> None:
        if incident_id is None:
            return
        with self._pending.lock:
            self._pending.incidents.add(incident_id)
            # the alerts seen in this transaction belong to the incident it touched
            if self._pending.tx_fingerprints:
                self._pending.fingerprints.setdefault(incident_id, set()).update(
                    self._pending.tx_fingerprints
                )

    def insert_incident(self, values: Mapping[str, Any]) -> int:
        incident_id = super().insert_incident(values)
        self._touch(incident_id)
        return incident_id

    def update_incident(self, incident_id: int, **values: Any) -> None:
        super().update_incident(incident_id, **values)
        self._touch(incident_id)

    def add_entry(self, incident_id: int, at: float, kind: str, status: str, summary: str, **kw: Any) -> int:
        entry_id = super().add_entry(incident_id, at, kind, status, summary, **kw)
        self._touch(incident_id)
        return entry_id

    def finish_entry(
        self, entry_id: int, status: str, at: float, summary: str, details: Mapping[str, Any]
    ) -> None:
        super().finish_entry(entry_id, status, at, summary, details)
        entry = self.entry(entry_id)
        self._touch(entry.incident_id if entry is not None else None)

    def note_entry(self, entry_id: int, details: Mapping[str, Any]) -> None:
        super().note_entry(entry_id, details)
        entry = self.entry(entry_id)
        self._touch(entry.incident_id if entry is not None else None)

    def mark_handled(self, dedup_key: str, incident_id: int | None, at: float, stale: bool = False) -> None:
        super().mark_handled(dedup_key, incident_id, at, stale)
        self._touch(incident_id)

    def add_diagnosis(self, incident_id: int, at: float, trigger: str, diagnosis: Diagnosis) -> int:
        diagnosis_id = super().add_diagnosis(incident_id, at, trigger, diagnosis)
        self._touch(incident_id)
        return diagnosis_id

    def set_alert_state(self, fingerprint: str, starts: float, status: str, at: float) -> None:
        super().set_alert_state(fingerprint, starts, status, at)
        with self._pending.lock:
            self._pending.tx_fingerprints.add(fingerprint)

    def set_state(self, name: str, value: Mapping[str, Any]) -> None:
        super().set_state(name, value)
        if name != INBOX_PAIR:  # which inbox a ledger pairs with is one replica's fact
            with self._pending.lock:
                self._pending.switches = True

    def delete_state(self, name: str) -> None:
        super().delete_state(name)
        with self._pending.lock:
            self._pending.switches = True

    def end_transaction(self) -> None:
        """Forget which alerts the finished transaction saw (call after each commit or rollback)."""
        with self._pending.lock:
            self._pending.tx_fingerprints.clear()

    def collect(self) -> Snapshot:
        """Snapshots of everything changed and not yet written (read on the decision thread)."""
        with self._pending.lock:
            ids = sorted(self._pending.incidents)
            switches = self._pending.switches
            fps = {i: set(self._pending.fingerprints.get(i, ())) for i in ids}
        incidents = [s for s in (self._snapshot(i, fps[i]) for i in ids) if s is not None]
        return Snapshot(tuple(incidents), self._switches() if switches else None)

    def written(self, snapshot: Snapshot) -> None:
        """The snapshot reached the shared store: stop tracking what it holds."""
        with self._pending.lock:
            for inc in snapshot.incidents:
                self._pending.incidents.discard(inc.id)
            if snapshot.switches is not None:
                self._pending.switches = False

    def _rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cur = self.conn.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def _snapshot(self, incident_id: int, fingerprints: set[str]) -> IncidentSnapshot | None:
        rows = self._rows("SELECT * FROM rem_incidents WHERE id = ?", (incident_id,))
        if not rows:
            return None
        row = rows[0]
        entries = self._rows(
            "SELECT * FROM (SELECT * FROM rem_ledger WHERE incident_id = ? ORDER BY id DESC LIMIT ?) "
            "ORDER BY id",
            (incident_id, MAX_ENTRIES),
        )
        handled = self._rows(
            "SELECT * FROM rem_handled WHERE incident_id = ? ORDER BY at DESC LIMIT ?",
            (incident_id, MAX_HANDLED),
        )
        fps = sorted(fingerprints | set(json.loads(row.get("firing_fps") or "[]")))
        marks = ", ".join("?" for _ in fps)
        alerts = self._rows(f"SELECT * FROM rem_alerts WHERE fingerprint IN ({marks})", fps) if fps else []
        diagnoses = self._rows(
            "SELECT * FROM (SELECT * FROM rem_diagnoses WHERE incident_id = ? ORDER BY id DESC LIMIT ?) "
            "ORDER BY id",
            (incident_id, MAX_DIAGNOSES),
        )
        return IncidentSnapshot(incident_id, row, entries, handled, alerts, diagnoses)

    def _switches(self) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.states("").items() if k != INBOX_PAIR}


def restore(ledger: Ledger, snapshot: Snapshot) -> int:
    """Fill an empty ledger from a shared store's snapshot, in one transaction; returns incidents restored.

    Columns the ledger does not have (an object written by a newer controller) are dropped; columns
    the object lacks (an older controller) take the table's defaults.
    """
    with ledger.transaction():
        for inc in snapshot.incidents:
            _insert(ledger.conn, "rem_incidents", inc.row)
            for entry in inc.entries:
                _insert(ledger.conn, "rem_ledger", entry)
            for handled in inc.handled:
                _insert(ledger.conn, "rem_handled", handled, upsert=True)
            for alert in inc.alerts:
                _insert(ledger.conn, "rem_alerts", alert, upsert=True)
            for diagnosis in inc.diagnoses:
                _insert(ledger.conn, "rem_diagnoses", diagnosis)
        for name, value in (snapshot.switches or {}).items():
            if name != INBOX_PAIR:
                ledger.set_state(name, value)
    return len(snapshot.incidents)


def _insert(conn: sqlite3.Connection, table: str, values: Mapping[str, Any], upsert: bool = False) -> None:
    have = [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]
    cols = [c for c in have if c in values]
    verb = "INSERT OR REPLACE" if upsert else "INSERT"
    conn.execute(
        f"{verb} INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
        tuple(values[c] for c in cols),
    )
