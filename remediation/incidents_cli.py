"""`gpupulse-remediation incidents [list | get ID]`: the controller's incidents with their diagnoses,
kubectl-style (`-o table|wide|json|yaml`).

By default they are read from the running controller's operator API (`GET /api/v1/incidents`), with
the same URL and token flags as `status`: one answer whatever the ledger behind it, a local SQLite
file or, in cluster mode, the GpuIncident objects the leader keeps. `--db FILE` or `--storage.path
DIR` read a ledger file instead, opened read-only (a stopped controller, or a copy of its volume).

`-o json` is the operator API's document as it is, for scripts: Unix seconds, every field, every
sample of the evidence series; it stays so. `-o yaml` is for reading: RFC 3339 times, without the
fields that are empty and without the evidence's samples (how many there were instead); `--full`
keeps them all, still with RFC 3339 times.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

import yaml

from remediation.control_cli import add_connection_flags, client_from_flags
from remediation.diagnosis.types import Diagnosis
from remediation.errors import CLIError, ConfigError
from remediation.ladder import incident_identity
from remediation.ledger import Ledger
from remediation.model import Target
from remediation.operations import diagnosis_brief
from remediation.settings import DB_FILENAME

PROG = "gpupulse-remediation incidents"
ENV_STORAGE = "GPUPULSE_REMEDIATION_STORAGE_PATH"
OUTPUTS = ("table", "wide", "json", "yaml")


class IncidentSource(Protocol):
    """Where incidents are read from; both answer in the operator API's shape."""

    def list(self, state: str | None, limit: int) -> list[dict[str, Any]]: ...

    def get(self, incident_id: int) -> dict[str, Any] | None: ...


class ApiSource:
    """The running controller's operator API."""

    def __init__(self, ns: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self._client = client_from_flags(ns, environ)

    def list(self, state: str | None, limit: int) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"limit": limit, **({"state": state} if state else {})})
        doc = self._client.call("GET", f"/api/v1/incidents?{query}")
        return [dict(i) for i in doc.get("incidents") or []]

    def get(self, incident_id: int) -> dict[str, Any] | None:
        try:
            return self._client.call("GET", f"/api/v1/incidents/{incident_id}")
        except CLIError as exc:
            if "answered 404" in str(exc):
                return None
            raise


class LedgerFileSource:
    """A ledger file, opened read-only; the same dictionaries the API builds (remediation/operations.py)."""

    def __init__(self, db: Path) -> None:
        if not db.exists():
            raise ConfigError(f"database {db} does not exist")
        self._db = db

    def _read(self, fn: Any) -> Any:
        try:
            with closing(sqlite3.connect(f"file:{self._db}?mode=ro", uri=True)) as conn:
                conn.row_factory = sqlite3.Row
                has_diagnoses = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='rem_diagnoses'"
                ).fetchone()
                return fn(Ledger(conn), has_diagnoses is not None)
        except sqlite3.Error as exc:
            raise CLIError(f"cannot read {self._db}: {exc}") from None

    def list(self, state: str | None, limit: int) -> list[dict[str, Any]]:
        def read(ledger: Ledger, has_diagnoses: bool) -> list[dict[str, Any]]:
            rows = ledger.list_incidents(state, limit)
            latest = ledger.latest_diagnoses([r.id for r in rows]) if has_diagnoses else {}
            out = []
            for r in rows:
                rec = latest.get(r.id)
                out.append({**r.to_dict(), "diagnosis": diagnosis_brief(rec.to_dict()) if rec else None})
            return out

        return list(self._read(read))

    def get(self, incident_id: int) -> dict[str, Any] | None:
        def read(ledger: Ledger, has_diagnoses: bool) -> dict[str, Any] | None:
            inc = ledger.incident(incident_id)
            if inc is None:
                return None
            diagnoses = ledger.diagnoses(incident_id) if has_diagnoses else []
            return {
                **inc.to_dict(),
                "history": ledger.history(incident_id),
                "diagnosis": diagnoses[-1].to_dict() if diagnoses else None,
                "diagnoses": [diagnosis_brief(d.to_dict()) for d in diagnoses],
            }

        found: dict[str, Any] | None = self._read(read)
        return found


def register(subparsers: Any) -> None:
    """Add the `incidents` command to the controller's CLI."""
    p = subparsers.add_parser(
        "incidents",
        help="List incidents, or show one, with their diagnoses (from the running controller's API, "
        "or a ledger file with --db).",
    )
    p.add_argument(
        "what",
        nargs="*",
        metavar="list | [get] ID",
        help="List incidents (the default, or `list`), or show one (`ID` or `get ID`): diagnosis, "
        "evidence and history.",
    )
    add_connection_flags(p)
    p.add_argument("--db", help="Read this ledger file instead of the API (read-only).")
    p.add_argument(
        "--storage.path",
        dest="storage_path",
        help=f"Read <DIR>/{DB_FILENAME} instead of the API (${ENV_STORAGE}).",
    )
    p.add_argument("--state", help="Only incidents in this state ('active': every open one).")
    p.add_argument("--limit", type=int, default=50, help="At most this many, newest first (default 50).")
    p.add_argument(
        "--output",
        "-o",
        choices=OUTPUTS,
        default="table",
        help="Output format (default table). json: the API's document unchanged (Unix seconds, every "
        "field), stable for scripts; yaml: for reading (RFC 3339 times, no empty fields, evidence "
        "without its samples).",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="With -o yaml: every field, the evidence series' samples too.",
    )
    p.set_defaults(func=cmd_incidents)


def source_from_flags(ns: argparse.Namespace, environ: Mapping[str, str]) -> IncidentSource:
    """A ledger file when --db or --storage.path (or its variable) names one, else the API."""
    storage = getattr(ns, "storage_path", None) or environ.get(ENV_STORAGE)
    db = getattr(ns, "db", None) or (str(Path(storage) / DB_FILENAME) if storage else "")
    if db:
        return LedgerFileSource(Path(db))
    return ApiSource(ns, environ)


def cmd_incidents(
    ns: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    environ = os.environ if environ is None else environ
    out = out or sys.stdout
    err = err or sys.stderr
    output = getattr(ns, "output", "table")
    try:
        # a Namespace built by a caller may name the incident as `id` directly
        incident_id = getattr(ns, "id", None)
        if incident_id is None:
            incident_id = _which(list(getattr(ns, "what", None) or []))
        if not 1 <= ns.limit <= 10_000:
            raise ValueError("--limit must be within 1..10000")
        source = source_from_flags(ns, environ)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return 2
    try:
        if incident_id is not None:
            found = source.get(incident_id)
            if found is None:
                print(f"{PROG}: error: incident {incident_id} not found", file=err)
                return 1
            full = bool(getattr(ns, "full", False))
            _write(found, output, out, lambda: _show(found, out), full)
        else:
            rows = source.list(ns.state, ns.limit)
            full = bool(getattr(ns, "full", False))
            _write(rows, output, out, lambda: _table(rows, wide=output == "wide", out=out), full)
    except CLIError as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return 1
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


def _write(doc: Any, output: str, out: TextIO, text: Any, full: bool = False) -> None:
    if output == "json":
        json.dump(doc, out, indent=2, sort_keys=True)
        out.write("\n")
    elif output == "yaml":
        yaml.safe_dump(for_reading(doc, full), out, sort_keys=True, default_flow_style=False)
    else:
        text()


# the fields that hold Unix seconds in the operator API's documents (records, diagnoses, evidence)
_TIME_KEYS = frozenset({"at", "symptom_onset", "window_start", "window_end"})


def _is_time_key(key: str) -> bool:
    return key in _TIME_KEYS or key.endswith("_at")


def rfc3339(ts: float) -> str:
    """Unix seconds as RFC 3339 in UTC: whole seconds when whole, else milliseconds."""
    when = datetime.fromtimestamp(ts, tz=UTC)
    spec = "seconds" if float(ts).is_integer() else "milliseconds"
    return when.isoformat(timespec=spec).replace("+00:00", "Z")


def for_reading(doc: Any, full: bool = False) -> Any:
    """The API's document as a human reads it in YAML: times in RFC 3339; unless `full`, without
    empty fields (a time of 0 is one: never set) and with each evidence series' samples replaced by
    their count."""
    if isinstance(doc, Mapping):
        out: dict[str, Any] = {}
        for key, value in doc.items():
            k = str(key)
            if k == "points" and isinstance(value, list):
                if full:
                    out[k] = [
                        [rfc3339(p[0]), p[1]] if isinstance(p, list) and len(p) == 2 and _number(p[0]) else p
                        for p in value
                    ]
                elif value:
                    out["samples"] = len(value)
                continue
            if _is_time_key(k) and _number(value):
                if value > 0:
                    out[k] = rfc3339(float(value))
                elif full:
                    out[k] = value  # 0: never set (page_next_at before any page)
                continue
            shown = for_reading(value, full)
            if full or shown not in (None, "", [], {}):
                out[k] = shown
        return out
    if isinstance(doc, list):
        return [for_reading(v, full) for v in doc]
    return doc


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


_TARGET_FIELDS = set(Target.__dataclass_fields__)


def _target(doc: Mapping[str, Any]) -> str:
    given = (doc.get("target") or {}).items()
    fields = {k: str(v) for k, v in given if k in _TARGET_FIELDS and v is not None}
    return incident_identity(Target(**fields))  # type: ignore[arg-type]


def _headline(doc: Mapping[str, Any]) -> str:
    brief = doc.get("diagnosis") or {}
    return str(brief.get("headline") or "-")


def _table(rows: Sequence[Mapping[str, Any]], wide: bool, out: TextIO) -> None:
    header = ["ID", "STATE", "SIGNATURE", "TARGET", "OPENED"]
    if wide:
        header += ["RUNG", "ATTEMPT", "ALERT", "RESOLUTION", "REASON"]
    header.append("DIAGNOSIS")
    lines = [tuple(header)]
    for r in rows:
        cells = [str(r.get(k)) for k in ("id", "state", "signature")]
        cells += [_target(r), _when(r.get("opened_at"))]
        if wide:
            cells += [
                str(r.get("rung") or "-"),
                str(r.get("attempt") or "-"),
                str(r.get("alertname") or "-"),
                str(r.get("resolution") or "-"),
                str(r.get("reason") or "-"),
            ]
        cells.append(_headline(r))
        lines.append(tuple(cells))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        padded = [c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)]
        out.write("  ".join([*padded, line[-1]]).rstrip() + "\n")


def _show(doc: Mapping[str, Any], out: TextIO) -> None:
    w = out.write
    w(f"incident {doc.get('id')}: {doc.get('alertname')} on {_target(doc)}\n")
    w(
        f"  signature {doc.get('signature')} ({doc.get('fault_class')}), state {doc.get('state')}, "
        f"opened {_when(doc.get('opened_at'))}\n"
    )
    if doc.get("reason"):
        w(f"  reason: {doc['reason']}\n")
    raw = doc.get("diagnosis")
    if not raw:
        w("diagnosis: none recorded\n")
    else:
        d = Diagnosis.from_dict(raw)
        w(f"diagnosis ({raw.get('trigger', '?')}, {_when(raw.get('at'))}): {d.headline}\n")
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
    for h in doc.get("history") or []:
        label = h.get("rung") or h.get("kind", "")
        w(f"  {_when(h.get('at'))}  {label} {h.get('status', '')}: {h.get('summary', '')}\n")
