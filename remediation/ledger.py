"""The engine's durable state in SQLite: incidents, their ledger (intent before action, outcome after),
handled dedup keys, alert transitions, detected loops and the operator switches (breaker, pause).

Tables are created with CREATE TABLE IF NOT EXISTS on a connection from `remediation.sqlitedb.open_db`
(autocommit mode: every write goes through `Ledger.transaction()`, one BEGIN IMMEDIATE ... COMMIT).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from remediation.diagnosis.types import Diagnosis
from remediation.errors import StoreCorrupt, StoreError
from remediation.ledger_schema import ADDED_COLUMNS, SCHEMA
from remediation.records import (
    AlertSeen,
    DiagnosisRecord,
    HandledEvent,
    Incident,
    LedgerEntry,
    encode_incident_fields,
)
from remediation.sqlitedb import check_integrity, is_corruption, open_db

OPEN_STATES = ("open", "acting", "verifying", "cooldown", "retry_wait", "paged", "validating")
ACTION_RUNGS = ("restart", "migrate")
# ledger statuses of actions that count as "really done or possibly done" for loops and budgets;
# "refused" (a TemporaryError with nothing_changed: the server did not act) is deliberately absent
REAL_ACTION_STATUSES = ("started", "success", "failed", "temporary", "interrupted")


INBOX_PAIR = "inbox"


def connect(db_path: Path, verify: bool = False) -> sqlite3.Connection:
    """Open the ledger (sqlitedb.open_db: WAL, synchronous=FULL) and create our tables.

    With verify, SQLite's integrity check runs first; a damaged or foreign file raises StoreCorrupt
    naming it, never a raw sqlite3 traceback.
    """
    conn = open_db(db_path)
    try:
        if verify:
            check_integrity(conn, db_path)
        conn.row_factory = sqlite3.Row
        _add_missing_columns(conn)
        conn.executescript(SCHEMA)
    except StoreError:
        conn.close()
        raise
    except sqlite3.DatabaseError as e:
        conn.close()
        if is_corruption(e):
            raise StoreCorrupt(f"{db_path}: {e}") from e
        raise StoreError(f"{db_path}: {e}") from e
    return conn


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    for table, column, decl in ADDED_COLUMNS:
        have = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
        if have and column not in have:  # an empty set: the table does not exist yet
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def pair_inbox(db_path: Path, inbox_id: str, now: float, accept_new: bool) -> str:
    """Check that the ledger pairs with this inbox, pairing a new ledger with it.

    A ledger that remembers another inbox means the inbox was emptied, truncated, deleted or
    replaced: accepted alerts not yet processed may be gone. That raises StoreError unless
    accept_new, which re-pairs; the return value is then the warning to log ("" when all is well).
    """
    conn = connect(db_path, verify=True)
    try:
        ledger = Ledger(conn)
        known = ledger.get_state(INBOX_PAIR)
        if known.get("id") == inbox_id:
            return ""
        warning = ""
        if known:
            warning = (
                f"the inbox next to {db_path} is not the one this ledger paired with on "
                f"{known.get('paired_at')} (ledger expects inbox {known.get('id')}, found {inbox_id}): it "
                "was emptied, truncated, deleted or replaced, and alerts accepted but not processed "
                "before that are lost"
            )
            if not accept_new:
                raise StoreError(
                    warning + "; start with --storage.accept-new-inbox to pair with the new inbox"
                )
        with ledger.transaction():
            ledger.set_state(INBOX_PAIR, {"id": inbox_id, "paired_at": now, "previous": known.get("id", "")})
        return warning
    finally:
        conn.close()


def read_incident(db_path: Path, incident_id: int) -> Incident | None:
    """One incident read from a ledger file opened read-only (tables are neither created nor touched).

    Raises StoreError when the file cannot be read as a ledger.
    """
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from exc
    conn.row_factory = sqlite3.Row
    try:
        return Ledger(conn).incident(incident_id)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read incidents from {db_path}: {exc}") from exc
    finally:
        conn.close()


def _loads(text: str) -> Any:
    return json.loads(text) if text else {}


class Ledger:
    """Typed access to the engine tables on one connection (one thread uses one Ledger)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic write: BEGIN IMMEDIATE ... COMMIT (ROLLBACK on any error)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back (disk full): a transaction left open would make
            # every later BEGIN fail, so the engine could never recover once space returns
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
            raise

    # -- handled keys ---------------------------------------------------------------------------

    def is_handled(self, dedup_key: str) -> bool:
        return self.handled(dedup_key) is not None

    def handled(self, dedup_key: str) -> HandledEvent | None:
        """The record of an event already handled (its incident, and whether it was too old to act)."""
        row: sqlite3.Row | None = self.conn.execute(
            "SELECT * FROM rem_handled WHERE dedup_key = ?", (dedup_key,)
        ).fetchone()
        if row is None:
            return None
        return HandledEvent(row["dedup_key"], row["incident_id"], row["at"], bool(row["stale"]))

    def mark_handled(self, dedup_key: str, incident_id: int | None, at: float, stale: bool = False) -> None:
        # a key first handled as too old is handled again when it comes back fresh: replace it
        self.conn.execute(
            "INSERT INTO rem_handled (dedup_key, incident_id, at, stale) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (dedup_key) DO UPDATE SET incident_id = excluded.incident_id,"
            " at = excluded.at, stale = excluded.stale",
            (dedup_key, incident_id, at, 1 if stale else 0),
        )

    # -- the latest state of each alert, and evidence too stale to act on -----------------------

    def alert_state(self, fingerprint: str) -> AlertSeen | None:
        """The newest (startsAt, status) seen for this alert fingerprint."""
        row: sqlite3.Row | None = self.conn.execute(
            "SELECT * FROM rem_alerts WHERE fingerprint = ?", (fingerprint,)
        ).fetchone()
        if row is None:
            return None
        return AlertSeen(row["fingerprint"], float(row["starts"]), row["status"], float(row["at"]))

    def set_alert_state(self, fingerprint: str, starts: float, status: str, at: float) -> None:
        self.conn.execute(
            "INSERT INTO rem_alerts (fingerprint, starts, status, at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (fingerprint) DO UPDATE SET starts = excluded.starts, status = excluded.status,"
            " at = excluded.at",
            (fingerprint, starts, status, at),
        )

    def add_stale(self, at: float, dedup_key: str, alertname: str, reason: str, detail: str) -> None:
        self.conn.execute(
            "INSERT INTO rem_stale (at, dedup_key, alertname, reason, detail) VALUES (?, ?, ?, ?, ?)",
            (at, dedup_key, alertname, reason, detail),
        )

    def stale_counts(self) -> dict[str, int]:
        rows = self.conn.execute("SELECT reason, COUNT(*) FROM rem_stale GROUP BY reason")
        return {str(r[0]): int(r[1]) for r in rows}

    def _incidents(self, sql: str, params: Sequence[Any] = ()) -> list[Incident]:
        return [Incident.from_row(r) for r in self.conn.execute(sql, params)]

    def holdable_incidents(self) -> list[Incident]:
        """Open incidents whose next step may act (everything but paged ones)."""
        return self._incidents(
            "SELECT * FROM rem_incidents WHERE held = 0 "
            "AND state IN ('open', 'acting', 'verifying', 'cooldown', 'retry_wait') ORDER BY id"
        )

    # -- incidents --------------------------------------------------------------------------------

    def insert_incident(self, values: Mapping[str, Any]) -> int:
        """A new incident from field values (a `target`, JSON fields as Python values)."""
        fields = encode_incident_fields(values)
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        cur = self.conn.execute(
            f"INSERT INTO rem_incidents ({cols}) VALUES ({marks})", tuple(fields.values())
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def update_incident(self, incident_id: int, **values: Any) -> None:
        fields = encode_incident_fields(values)
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.conn.execute(f"UPDATE rem_incidents SET {sets} WHERE id = ?", (*fields.values(), incident_id))

    def incident(self, incident_id: int) -> Incident | None:
        found = self._incidents("SELECT * FROM rem_incidents WHERE id = ?", (incident_id,))
        return found[0] if found else None

    def open_incident_for(self, key: str) -> Incident | None:
        marks = ", ".join("?" for _ in OPEN_STATES)
        found = self._incidents(
            f"SELECT * FROM rem_incidents WHERE key = ? AND state IN ({marks}) ORDER BY id DESC LIMIT 1",
            (key, *OPEN_STATES),
        )
        return found[0] if found else None

    def due_incidents(self, now: float) -> list[Incident]:
        return self._incidents(
            "SELECT * FROM rem_incidents WHERE next_at IS NOT NULL AND next_at <= ? "
            "AND state IN ('open', 'verifying', 'cooldown', 'retry_wait', 'paged', 'validating') "
            "ORDER BY next_at, id",
            (now,),
        )

    def pending_pages(self, now: float) -> list[Incident]:
        return self._incidents(
            "SELECT * FROM rem_incidents WHERE page_pending = 1 AND page_next_at <= ? ORDER BY id", (now,)
        )

    def count_open(self) -> int:
        marks = ", ".join("?" for _ in OPEN_STATES)
        row = self.conn.execute(f"SELECT COUNT(*) FROM rem_incidents WHERE state IN ({marks})", OPEN_STATES)
        return int(row.fetchone()[0])

    def list_incidents(self, state: str | None, limit: int, signature: str | None = None) -> list[Incident]:
        where: list[str] = []
        params: list[Any] = []
        if state == "active":
            where.append(f"state IN ({', '.join('?' for _ in OPEN_STATES)})")
            params.extend(OPEN_STATES)
        elif state is not None:
            where.append("state = ?")
            params.append(state)
        if signature is not None:
            where.append("signature = ?")
            params.append(signature)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        return self._incidents(
            f"SELECT * FROM rem_incidents {clause}ORDER BY id DESC LIMIT ?", (*params, limit)
        )

    def group_members(self, group: str, unsent_only: bool) -> list[Incident]:
        sql = "SELECT * FROM rem_incidents WHERE page_group = ?"
        if unsent_only:
            sql += " AND group_sent = 0"
        return self._incidents(sql + " ORDER BY id", (group,))

    # -- ledger entries ---------------------------------------------------------------------------

    def add_entry(
        self,
        incident_id: int,
        at: float,
        kind: str,
        status: str,
        summary: str,
        *,
        rung: str = "",
        attempt: int = 0,
        details: Mapping[str, Any] | None = None,
        target_kind: str = "",
        loop_key: str = "",
        node: str = "",
        finished_at: float | None = None,
    ) -> int:
        cur = self.conn.execute(
            "INSERT INTO rem_ledger (incident_id, at, kind, rung, attempt, status, finished_at, summary, "
            "details, target_kind, loop_key, node) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                incident_id,
                at,
                kind,
                rung,
                attempt,
                status,
                finished_at,
                summary,
                json.dumps(dict(details or {}), sort_keys=True, default=str),
                target_kind,
                loop_key,
                node,
            ),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def finish_entry(
        self, entry_id: int, status: str, at: float, summary: str, details: Mapping[str, Any]
    ) -> None:
        self.conn.execute(
            "UPDATE rem_ledger SET status = ?, finished_at = ?, summary = ?, details = ? WHERE id = ?",
            (status, at, summary, json.dumps(dict(details), sort_keys=True, default=str), entry_id),
        )

    def note_entry(self, entry_id: int, details: Mapping[str, Any]) -> None:
        """Add to an entry's details (an action's record of what it is about to change)."""
        merged = {**self.entry_details(entry_id), **details}
        self.conn.execute(
            "UPDATE rem_ledger SET details = ? WHERE id = ?",
            (json.dumps(merged, sort_keys=True, default=str), entry_id),
        )

    def entry_details(self, entry_id: int) -> dict[str, Any]:
        row = self.conn.execute("SELECT details FROM rem_ledger WHERE id = ?", (entry_id,)).fetchone()
        if row is None or not row[0]:
            return {}
        value = json.loads(row[0])
        return value if isinstance(value, dict) else {}

    def entry(self, entry_id: int) -> LedgerEntry | None:
        row: sqlite3.Row | None = self.conn.execute(
            "SELECT * FROM rem_ledger WHERE id = ?", (entry_id,)
        ).fetchone()
        return LedgerEntry.from_row(row) if row is not None else None

    def add_diagnosis(self, incident_id: int, at: float, trigger: str, diagnosis: Diagnosis) -> int:
        """Store one diagnosis of an incident (its whole record, evidence included)."""
        body = json.dumps(diagnosis.to_dict(), sort_keys=True, allow_nan=False)
        cur = self.conn.execute(
            "INSERT INTO rem_diagnoses (incident_id, at, trigger, body) VALUES (?, ?, ?, ?)",
            (incident_id, at, trigger, body),
        )
        return int(cur.lastrowid or 0)

    def latest_diagnosis(self, incident_id: int) -> DiagnosisRecord | None:
        row = self.conn.execute(
            "SELECT * FROM rem_diagnoses WHERE incident_id = ? ORDER BY id DESC LIMIT 1", (incident_id,)
        ).fetchone()
        return DiagnosisRecord.from_row(row) if row is not None else None

    def diagnoses(self, incident_id: int) -> list[DiagnosisRecord]:
        """Every diagnosis of an incident, oldest first."""
        rows = self.conn.execute(
            "SELECT * FROM rem_diagnoses WHERE incident_id = ? ORDER BY id", (incident_id,)
        ).fetchall()
        return [DiagnosisRecord.from_row(r) for r in rows]

    def latest_diagnoses(self, incident_ids: Sequence[int]) -> dict[int, DiagnosisRecord]:
        """The newest diagnosis of each of these incidents (those that have one)."""
        out: dict[int, DiagnosisRecord] = {}
        ids = list(incident_ids)
        for i in range(0, len(ids), 500):  # under SQLite's host-parameter limit
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            rows = self.conn.execute(
                f"SELECT * FROM rem_diagnoses WHERE id IN (SELECT MAX(id) FROM rem_diagnoses "
                f"WHERE incident_id IN ({marks}) GROUP BY incident_id)",
                chunk,
            ).fetchall()
            for r in rows:
                rec = DiagnosisRecord.from_row(r)
                out[rec.incident_id] = rec
        return out

    def history(self, incident_id: int) -> list[dict[str, Any]]:
        """The ledger of one incident, oldest first, as plain dicts (for pages and the API)."""
        rows = self.conn.execute("SELECT * FROM rem_ledger WHERE incident_id = ? ORDER BY id", (incident_id,))
        out: list[dict[str, Any]] = []
        for r in rows:
            out.append(
                {
                    "at": r["at"],
                    "kind": r["kind"],
                    "rung": r["rung"],
                    "attempt": r["attempt"],
                    "status": r["status"],
                    "finished_at": r["finished_at"],
                    "summary": r["summary"],
                    "details": _loads(r["details"]),
                }
            )
        return out

    def started_actions(self) -> list[LedgerEntry]:
        rows = self.conn.execute("SELECT * FROM rem_ledger WHERE kind = 'action' AND status = 'started'")
        return [LedgerEntry.from_row(r) for r in rows]

    # A training job's drain that still waits for its next step (remediation/drain.py): its action is
    # `started`, a waiting_for_checkpoint event follows it, and no drain_* event (the wait's end) yet.
    _WAITING_DRAIN = (
        "EXISTS (SELECT 1 FROM rem_ledger w WHERE w.incident_id = a.incident_id AND w.id > a.id "
        "AND w.kind = 'event' AND w.status = 'waiting_for_checkpoint') AND NOT EXISTS (SELECT 1 FROM "
        "rem_ledger d WHERE d.incident_id = a.incident_id AND d.id > a.id AND d.kind = 'event' "
        "AND d.status LIKE 'drain\\_%' ESCAPE '\\')"
    )

    def count_waiting_drains(self) -> int:
        """Started actions that still wait for a job's next step: nothing was done to the cluster yet."""
        row = self.conn.execute(
            "SELECT COUNT(*) FROM rem_ledger a WHERE a.kind = 'action' AND a.status = 'started' AND "
            + self._WAITING_DRAIN
        ).fetchone()
        return int(row[0])

    def waiting_drain(self, entry_id: int) -> dict[str, Any] | None:
        """The waiting_for_checkpoint details of a started action still waiting (None otherwise)."""
        row = self.conn.execute(
            "SELECT (SELECT w.details FROM rem_ledger w WHERE w.incident_id = a.incident_id AND "
            "w.id > a.id AND w.kind = 'event' AND w.status = 'waiting_for_checkpoint' ORDER BY w.id "
            "DESC LIMIT 1) FROM rem_ledger a WHERE a.id = ? AND a.status = 'started' AND "
            + self._WAITING_DRAIN,
            (entry_id,),
        ).fetchone()
        return None if row is None else dict(_loads(row[0]) or {})

    def count_actions(self, rungs: Sequence[str], since: float, *, statuses: Sequence[str]) -> int:
        rm = ", ".join("?" for _ in rungs)
        sm = ", ".join("?" for _ in statuses)
        row = self.conn.execute(
            f"SELECT COUNT(*) FROM rem_ledger WHERE kind = 'action' AND rung IN ({rm}) AND status IN ({sm}) "
            "AND at >= ?",
            (*rungs, *statuses, since),
        ).fetchone()
        return int(row[0])

    def count_loop_actions(self, loop_key: str, rung: str, since: float) -> int:
        sm = ", ".join("?" for _ in REAL_ACTION_STATUSES)
        row = self.conn.execute(
            f"SELECT COUNT(*) FROM rem_ledger WHERE kind = 'action' AND loop_key = ? AND rung = ? "
            f"AND status IN ({sm}) AND at >= ?",
            (loop_key, rung, *REAL_ACTION_STATUSES, since),
        ).fetchone()
        return int(row[0])

    def migrated_nodes(self, since: float, statuses: Sequence[str] = REAL_ACTION_STATUSES) -> set[str]:
        sm = ", ".join("?" for _ in statuses)
        rows = self.conn.execute(
            f"SELECT DISTINCT node FROM rem_ledger WHERE kind = 'action' AND rung = 'migrate' "
            f"AND target_kind IN ('gpu', 'node', 'job') AND node != '' AND status IN ({sm}) AND at >= ?",
            (*statuses, since),
        )
        return {str(r[0]) for r in rows}

    # -- transitions, loops, nodes ----------------------------------------------------------------

    def add_transition(self, key: str, status: str, at: float) -> None:
        self.conn.execute("INSERT INTO rem_transitions (key, status, at) VALUES (?, ?, ?)", (key, status, at))

    def count_transitions(self, key: str, since: float) -> int:
        row = self.conn.execute(
            "SELECT COUNT(*) FROM rem_transitions WHERE key = ? AND at >= ?", (key, since)
        ).fetchone()
        return int(row[0])

    def prune(self, transitions_before: float, handled_before: float) -> None:
        self.conn.execute("DELETE FROM rem_transitions WHERE at < ?", (transitions_before,))
        self.conn.execute("DELETE FROM rem_handled WHERE at < ?", (handled_before,))
        self.conn.execute("DELETE FROM rem_alerts WHERE at < ?", (handled_before,))
        self.conn.execute("DELETE FROM rem_stale WHERE at < ?", (handled_before,))

    def add_loop(
        self, loop_key: str, kind: str, incident_id: int, at: float, details: Mapping[str, Any]
    ) -> None:
        self.conn.execute(
            "INSERT INTO rem_loops (loop_key, kind, incident_id, at, details) VALUES (?, ?, ?, ?, ?)",
            (loop_key, kind, incident_id, at, json.dumps(dict(details), sort_keys=True)),
        )

    def count_loops(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM rem_loops").fetchone()[0])

    def see_node(self, node: str, at: float) -> None:
        self.conn.execute(
            "INSERT INTO rem_nodes (node, last_seen) VALUES (?, ?) "
            "ON CONFLICT(node) DO UPDATE SET last_seen = excluded.last_seen",
            (node, at),
        )

    def known_nodes(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM rem_nodes").fetchone()[0])

    # -- operator switches ------------------------------------------------------------------------

    def get_state(self, name: str) -> dict[str, Any]:
        row = self.conn.execute("SELECT value FROM rem_state WHERE name = ?", (name,)).fetchone()
        return dict(json.loads(row[0])) if row is not None else {}

    def set_state(self, name: str, value: Mapping[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO rem_state (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (name, json.dumps(dict(value), sort_keys=True)),
        )

    def states(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every operator/engine state row whose name starts with prefix."""
        rows = self.conn.execute(
            "SELECT name, value FROM rem_state WHERE name LIKE ? ORDER BY name", (prefix + "%",)
        )
        return {str(r[0]): dict(json.loads(r[1])) for r in rows}

    def delete_state(self, name: str) -> None:
        self.conn.execute("DELETE FROM rem_state WHERE name = ?", (name,))

    def paged_incidents_since(self, since: float, signature: str | None = None) -> int:
        """Incidents (of one signature, or of all) that requested a page of their own since `since`
        (re-sends not counted twice)."""
        query = (
            "SELECT COUNT(DISTINCT l.incident_id) FROM rem_ledger l WHERE l.kind = 'event' "
            "AND l.rung = '' AND l.status = 'page_requested' AND l.at >= ?"
        )
        params: tuple[object, ...] = (since,)
        if signature is not None:
            query += " AND l.incident_id IN (SELECT id FROM rem_incidents WHERE signature = ?)"
            params = (since, signature)
        return int(self.conn.execute(query, params).fetchone()[0])

    def paged_incidents_by_signature_since(self, since: float) -> dict[str, int]:
        """paged_incidents_since(since, signature) for every signature that paged, in one query."""
        rows = self.conn.execute(
            "SELECT i.signature, COUNT(DISTINCT l.incident_id) FROM rem_ledger l "
            "JOIN rem_incidents i ON i.id = l.incident_id WHERE l.kind = 'event' AND l.rung = '' "
            "AND l.status = 'page_requested' AND l.at >= ? GROUP BY i.signature",
            (since,),
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def newest_open_incidents(self, limit: int) -> list[Incident]:
        """The `limit` newest open incidents, newest first. The ids come from the (state, next_at)
        index alone, so only those rows are read however many are open (list_incidents("active")
        reads and sorts them all: 40 ms at 10,000 open, this 6 ms)."""
        marks = ", ".join("?" for _ in OPEN_STATES)
        return self._incidents(
            f"SELECT * FROM rem_incidents WHERE id IN (SELECT id FROM rem_incidents WHERE state IN ({marks}) "
            "ORDER BY id DESC LIMIT ?) ORDER BY id DESC",
            (*OPEN_STATES, limit),
        )

    def recent_actions(self, limit: int) -> list[LedgerEntry]:
        """The last `limit` actions that have an outcome (pages included), newest first."""
        rows = self.conn.execute(
            "SELECT * FROM rem_ledger WHERE kind = 'action' AND status != 'started' ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [LedgerEntry.from_row(r) for r in rows]

    def open_group_members(self, group: str) -> int:
        marks = ", ".join("?" for _ in OPEN_STATES)
        row = self.conn.execute(
            f"SELECT COUNT(*) FROM rem_incidents WHERE page_group = ? AND state IN ({marks})",
            (group, *OPEN_STATES),
        ).fetchone()
        return int(row[0])

    # -- statistics -------------------------------------------------------------------------------

    def resolution_counts(self) -> dict[str, int]:
        rows = self.conn.execute(
            "SELECT resolution, COUNT(*) FROM rem_incidents WHERE state IN ('closed', 'ignored') "
            "GROUP BY resolution"
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def resolution_by_signature(self) -> dict[str, dict[str, int]]:
        rows = self.conn.execute(
            "SELECT signature, resolution, COUNT(*) FROM rem_incidents WHERE state = 'closed' "
            "GROUP BY signature, resolution"
        )
        out: dict[str, dict[str, int]] = {}
        for r in rows:
            out.setdefault(str(r[0]), {})[str(r[1])] = int(r[2])
        return out
