"""`gpupulse-remediation incidents`: the incidents of a controller's ledger with their diagnoses, read
from its SQLite file opened read-only (a running controller is not disturbed)."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from remediation.ladder import incident_identity
from remediation.ledger import Ledger
from remediation.records import DiagnosisRecord, Incident
from remediation.settings import DB_FILENAME

ENV_STORAGE = "GPUPULSE_REMEDIATION_STORAGE_PATH"


def register(subparsers: Any) -> None:
    """Add the `incidents` command to the controller's CLI."""
    p = subparsers.add_parser("incidents", help="List incidents, or show one, with their diagnoses.")
    p.add_argument(
        "what",
        nargs="*",
        metavar="list | [get] ID",
        help="List incidents (the default, or `list`), or show one (`ID` or `get ID`): diagnosis, "
        "evidence and history.",
    )
    p.add_argument("--db", help="SQLite file (default: <--storage.path>/gpupulse.db).")
    p.add_argument("--storage.path", dest="storage_path", help=f"Controller storage dir (${ENV_STORAGE}).")
    p.add_argument("--state", help="Only incidents in this state ('active': every open one).")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_incidents)


def cmd_incidents(
    ns: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    environ = os.environ if environ is None else environ
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        # a Namespace built by a caller may name the incident as `id` directly
        incident_id = getattr(ns, "id", None)
        if incident_id is None:
            incident_id = _which(list(getattr(ns, "what", None) or []))
    except ValueError as exc:
        print(f"gpupulse-remediation incidents: error: {exc}", file=err)
        return 2
    db = ns.db or (
        str(Path(ns.storage_path or environ.get(ENV_STORAGE, "")) / DB_FILENAME)
        if (ns.storage_path or environ.get(ENV_STORAGE))
        else ""
    )
    if not db:
        print("gpupulse-remediation incidents: error: give --db or --storage.path", file=err)
        return 2
    if not Path(db).exists():
        print(f"gpupulse-remediation incidents: error: database {db} does not exist", file=err)
        return 2
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            conn.row_factory = sqlite3.Row
            ledger = Ledger(conn)
            has_diagnoses = _has_table(conn, "rem_diagnoses")
            if incident_id is not None:
                return _show(ledger, incident_id, has_diagnoses, ns.output, out, err)
            rows = ledger.list_incidents(ns.state, max(1, ns.limit))
            latest = ledger.latest_diagnoses([r.id for r in rows]) if has_diagnoses else {}
    except sqlite3.Error as exc:
        print(f"gpupulse-remediation incidents: error: cannot read {db}: {exc}", file=err)
        return 1
    if ns.output == "json":
        items = [{**r.to_dict(), "diagnosis": _brief(latest.get(r.id))} for r in rows]
        json.dump(items, out, indent=2, sort_keys=True)
        out.write("\n")
        return 0
    _table(rows, latest, out)
    return 0


def _which(words: list[str]) -> int | None:
    """The incident `incidents [list | ID | get ID]` names; None lists. ValueError for anything else."""
    if words in ([], ["list"]):
        return None
    if words[:1] == ["get"]:
        words = words[1:]
    if len(words) == 1 and words[0].isdigit():
        return int(words[0])
    raise ValueError(f"expected `list`, an incident ID or `get ID`, got {' '.join(words) or 'get'!r}")


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone()
        is not None
    )


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _brief(rec: DiagnosisRecord | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    d = rec.diagnosis
    return {"at": rec.at, "trigger": rec.trigger, "headline": d.headline, "confident": d.confident}


def _table(rows: Sequence[Incident], latest: Mapping[int, DiagnosisRecord], out: TextIO) -> None:
    header = ("ID", "STATE", "SIGNATURE", "TARGET", "OPENED", "DIAGNOSIS")
    lines = [header]
    for r in rows:
        rec = latest.get(r.id)
        lines.append(
            (
                str(r.id),
                r.state,
                r.signature,
                incident_identity(r.target),
                _when(r.opened_at),
                rec.diagnosis.headline if rec else "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        cells = [c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)]
        out.write("  ".join([*cells, line[-1]]).rstrip() + "\n")


def _show(
    ledger: Ledger, incident_id: int, has_diagnoses: bool, output: str, out: TextIO, err: TextIO
) -> int:
    inc = ledger.incident(incident_id)
    if inc is None:
        print(f"gpupulse-remediation incidents: error: incident {incident_id} not found", file=err)
        return 1
    diagnoses = ledger.diagnoses(incident_id) if has_diagnoses else []
    history = ledger.history(incident_id)
    if output == "json":
        doc = {
            **inc.to_dict(),
            "history": history,
            "diagnosis": diagnoses[-1].to_dict() if diagnoses else None,
            "diagnoses": [_brief(d) for d in diagnoses],
        }
        json.dump(doc, out, indent=2, sort_keys=True)
        out.write("\n")
        return 0
    w = out.write
    w(f"incident {inc.id}: {inc.alertname} on {incident_identity(inc.target)}\n")
    w(f"  signature {inc.signature} ({inc.fault_class}), state {inc.state}, opened {_when(inc.opened_at)}\n")
    if inc.reason:
        w(f"  reason: {inc.reason}\n")
    if not diagnoses:
        w("diagnosis: none recorded\n")
    else:
        rec = diagnoses[-1]
        d = rec.diagnosis
        w(f"diagnosis ({rec.trigger}, {_when(rec.at)}): {d.headline}\n")
        w(f"  {d.reason}\n")
        if d.symptom_onset is not None:
            window = f"{_when(d.window_start)} .. {_when(d.window_end)}"
            w(f"  symptom onset {_when(d.symptom_onset)}; window {window}\n")
        for layer, verdict in d.layers.items():
            w(f"  {layer:<10} {verdict}\n")
        for c in d.candidates:
            w(f"  candidate {c.label} (score {c.score:.2f})\n")
            for e in c.evidence:
                w(f"    {e.title}: {e.note}\n")
        for c in d.rejected:
            w(f"  rejected  {c.label}: {c.evidence[0].note if c.evidence else ''}\n")
        if d.missing:
            w(f"  missing   {'; '.join(d.missing)}\n")
    w("history:\n")
    for h in history:
        label = h.get("rung") or h.get("kind", "")
        w(f"  {_when(h.get('at'))}  {label} {h.get('status', '')}: {h.get('summary', '')}\n")
    return 0
