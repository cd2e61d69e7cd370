"""The ledger's tables (DDL), and the columns added since the first release that older files get on open.

rem_incidents holds one row per incident (remediation/records.py reads it into an Incident);
rem_ledger the intent and outcome of every event and action; rem_handled, rem_alerts and rem_stale
what was seen of each notification; rem_transitions, rem_loops and rem_nodes what loop detection
and the budgets count; rem_state the operator and engine switches (breaker, pause, heartbeat) and
the fault history of each quarantined GPU and node (`faults:*`, remediation/lemons.py);
rem_diagnoses every diagnosis of an incident (remediation/diagnosis), newest last.
"""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS rem_incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    signature TEXT NOT NULL,
    fault_class TEXT NOT NULL,
    alertname TEXT NOT NULL,
    target_kind TEXT NOT NULL,
    target_node TEXT NOT NULL,
    target_namespace TEXT NOT NULL,
    target_pod TEXT NOT NULL,
    target_uuid TEXT NOT NULL,
    target_training_job_kind TEXT NOT NULL DEFAULT '',
    target_training_job TEXT NOT NULL DEFAULT '',
    loop_key TEXT NOT NULL,
    state TEXT NOT NULL,
    rung TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL DEFAULT 0,
    rung_started_at REAL,
    temp_retries INTEGER NOT NULL DEFAULT 0,
    next_at REAL,
    firing_fps TEXT NOT NULL DEFAULT '[]',
    resolved_at REAL,
    opened_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    closed_at REAL,
    resolution TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    page_pending INTEGER NOT NULL DEFAULT 0,
    page_next_at REAL NOT NULL DEFAULT 0,
    paged INTEGER NOT NULL DEFAULT 0,
    page_group TEXT NOT NULL DEFAULT '',
    group_sent INTEGER NOT NULL DEFAULT 0,
    trace_id TEXT NOT NULL DEFAULT '',
    span_id TEXT NOT NULL DEFAULT '',
    evidence_at REAL,
    held INTEGER NOT NULL DEFAULT 0,
    page_sticky INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rem_incidents_key ON rem_incidents (key, state);
CREATE INDEX IF NOT EXISTS rem_incidents_timer ON rem_incidents (state, next_at);
CREATE INDEX IF NOT EXISTS rem_incidents_group ON rem_incidents (page_group, group_sent);
CREATE TABLE IF NOT EXISTS rem_ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id INTEGER NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('event', 'action')),
    rung TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL,
    finished_at REAL,
    summary TEXT NOT NULL DEFAULT '',
    details TEXT NOT NULL DEFAULT '{}',
    target_kind TEXT NOT NULL DEFAULT '',
    loop_key TEXT NOT NULL DEFAULT '',
    node TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS rem_ledger_incident ON rem_ledger (incident_id, id);
CREATE INDEX IF NOT EXISTS rem_ledger_actions ON rem_ledger (kind, rung, status, at);
CREATE INDEX IF NOT EXISTS rem_ledger_loop ON rem_ledger (loop_key, rung, at);
CREATE TABLE IF NOT EXISTS rem_handled (
    dedup_key TEXT PRIMARY KEY,
    incident_id INTEGER,
    at REAL NOT NULL,
    stale INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rem_handled_at ON rem_handled (at);
CREATE TABLE IF NOT EXISTS rem_alerts (
    fingerprint TEXT PRIMARY KEY,
    starts REAL NOT NULL,
    status TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rem_alerts_at ON rem_alerts (at);
CREATE TABLE IF NOT EXISTS rem_stale (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    dedup_key TEXT NOT NULL,
    alertname TEXT NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rem_stale_at ON rem_stale (at);
CREATE TABLE IF NOT EXISTS rem_transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    status TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rem_transitions_key ON rem_transitions (key, at);
CREATE TABLE IF NOT EXISTS rem_loops (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    loop_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    incident_id INTEGER NOT NULL,
    at REAL NOT NULL,
    details TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS rem_state (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rem_nodes (
    node TEXT PRIMARY KEY,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rem_diagnoses (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id INTEGER NOT NULL,
    at REAL NOT NULL,
    trigger TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rem_diagnoses_incident ON rem_diagnoses (incident_id, id);
"""

# columns added after the first release: ledgers created before get them on open
ADDED_COLUMNS = (
    ("rem_incidents", "evidence_at", "REAL"),
    ("rem_incidents", "held", "INTEGER NOT NULL DEFAULT 0"),
    ("rem_handled", "stale", "INTEGER NOT NULL DEFAULT 0"),
    ("rem_incidents", "page_sticky", "INTEGER NOT NULL DEFAULT 0"),
    ("rem_incidents", "target_training_job_kind", "TEXT NOT NULL DEFAULT ''"),
    ("rem_incidents", "target_training_job", "TEXT NOT NULL DEFAULT ''"),
)
