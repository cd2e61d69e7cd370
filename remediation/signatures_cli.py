"""`gpupulse-remediation signatures list|test|add`: read, try and grow the fault-signature library.

`add` is how the library grows: after a human resolved an incident, they record what fixed it
(`--fixed-by restart|migrate|none`) and the next alert of that kind is handled by the ladder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from remediation.errors import CLIError, SignatureError, StoreError
from remediation.ladder import incident_identity, target_from_labels, target_problem
from remediation.ledger import read_incident
from remediation.records import Incident
from remediation.settings import DB_FILENAME
from remediation.signatures import (
    KNOWN_FAULT_CLASSES,
    Signature,
    SignatureLibrary,
    dump_signatures,
    load_library,
    parse_signature,
)

ENV_SIGNATURES = "GPUPULSE_REMEDIATION_SIGNATURES"
ENV_STORAGE = "GPUPULSE_REMEDIATION_STORAGE_PATH"
LADDERS: Mapping[str, list[str]] = {
    "restart": ["restart", "migrate", "page"],
    "migrate": ["migrate", "page"],
    "none": ["page"],
}


def register(subparsers: Any) -> None:
    """Add the `signatures` command (list, test, add) to the controller's CLI."""
    top = subparsers.add_parser("signatures", help="List, test and add fault signatures.")
    sub = top.add_subparsers(dest="signatures_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--signatures",
            action="append",
            default=None,
            metavar="DIR",
            help=f"User signature directory (repeatable; default ${ENV_SIGNATURES}, comma-separated).",
        )
        p.add_argument(
            "--no-builtin", action="store_true", help="Ignore the signatures shipped with gpupulse."
        )

    p_list = sub.add_parser("list", help="Print the signature library.")
    common(p_list)
    p_list.add_argument("--output", choices=("table", "yaml", "json"), default="table")
    p_list.set_defaults(func=cmd_list)

    p_test = sub.add_parser("test", help="Show which signature and ladder an alert would get.")
    common(p_test)
    p_test.add_argument(
        "file",
        help="JSON or YAML: an Alertmanager webhook payload, one alert {labels, annotations}, or a label map "
        "('-' = stdin).",
    )
    p_test.add_argument("--output", choices=("text", "json"), default="text")
    p_test.set_defaults(func=cmd_test)

    p_add = sub.add_parser("add", help="Record a new signature, from a resolved incident or from flags.")
    common(p_add)
    p_add.add_argument("--incident", type=int, help="Incident id in the controller's database to learn from.")
    p_add.add_argument("--db", help="SQLite file (default: <--storage.path>/gpupulse.db).")
    p_add.add_argument(
        "--storage.path", dest="storage_path", help=f"Controller storage dir (${ENV_STORAGE})."
    )
    p_add.add_argument("--name", help="Signature name (default derived from the incident or alertname).")
    p_add.add_argument(
        "--fixed-by",
        required=True,
        choices=sorted(LADDERS),
        help="What fixed it: restart (ladder restart->migrate->page), migrate (migrate->page), "
        "none (page: a restart never helps).",
    )
    p_add.add_argument("--fault-class", choices=sorted(KNOWN_FAULT_CLASSES))
    p_add.add_argument("--alertname", help="Match this alertname.")
    p_add.add_argument(
        "--label", action="append", default=[], metavar="NAME=VALUE", help="Match label equality."
    )
    p_add.add_argument("--label-regex", action="append", default=[], metavar="NAME=REGEX")
    p_add.add_argument("--annotation-regex", action="append", default=[], metavar="NAME=REGEX")
    p_add.add_argument("--reason", help="Why restart does or does not fix this fault.")
    p_add.add_argument("--description", default="")
    p_add.add_argument("--runbook-url", default="")
    p_add.add_argument("--attempts", type=int, default=1, help="Attempts per acting rung.")
    p_add.add_argument("--verify-window", type=float, default=300.0, help="Seconds.")
    p_add.add_argument("--cooldown", type=float, default=900.0, help="Seconds.")
    p_add.add_argument("--priority", type=int, default=0)
    p_add.add_argument(
        "--force", action="store_true", help="Replace an existing user signature of that name."
    )
    p_add.set_defaults(func=cmd_add)


# ---------------------------------------------------------------------------------------------------


def _dirs(ns: argparse.Namespace, environ: Mapping[str, str]) -> list[Path]:
    raw: list[str] = ns.signatures if ns.signatures else [environ.get(ENV_SIGNATURES, "")]
    return [Path(p) for item in raw for p in item.split(",") if p]


def _library(ns: argparse.Namespace, environ: Mapping[str, str]) -> SignatureLibrary:
    return load_library(_dirs(ns, environ), include_builtin=not ns.no_builtin)


def _fail(message: str, err: TextIO) -> int:
    print(f"gpupulse-remediation signatures: error: {message}", file=err)
    return 2


def cmd_list(
    ns: argparse.Namespace,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Print the library (table, yaml or json)."""
    try:
        lib = _library(ns, os.environ if environ is None else environ)
    except SignatureError as exc:
        return _fail(str(exc), err)
    sigs = list(lib)
    if ns.output == "json":
        json.dump([{**s.to_dict(), "origin": s.origin} for s in sigs], out, indent=2)
        out.write("\n")
    elif ns.output == "yaml":
        out.write(dump_signatures(sigs))
    else:
        out.write(f"{'NAME':<28} {'FAULT_CLASS':<20} {'LADDER':<24} {'RESTART_FIXES':<13} ORIGIN\n")
        for s in sigs:
            ladder = "->".join(s.ladder.rungs)
            out.write(f"{s.name:<28} {s.fault_class:<20} {ladder:<24} {s.restart_fixes!s:<13} {s.origin}\n")
        out.write(f"{len(sigs)} signatures\n")
    return 0


def _alerts_from(doc: Any) -> list[tuple[dict[str, str], dict[str, str]]]:
    if isinstance(doc, dict) and isinstance(doc.get("alerts"), list):
        items = doc["alerts"]
    elif isinstance(doc, list):
        items = doc
    else:
        items = [doc]
    out: list[tuple[dict[str, str], dict[str, str]]] = []
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise CLIError(f"alert {n}: each alert must be a mapping")
        if "labels" in item and isinstance(item["labels"], dict):
            labels, annotations = item["labels"], item.get("annotations") or {}
        else:
            labels, annotations = item, {}
        if not isinstance(annotations, dict):
            raise CLIError(f"alert {n}: annotations must be a mapping")
        # every alert Prometheus sends has an alertname: without one this is not an alert at all
        if not labels.get("alertname"):
            raise CLIError(
                f"alert {n} has no alertname label: give an Alertmanager webhook payload, one alert "
                "{labels: {alertname: ..., ...}}, or a label map with alertname"
            )
        for key, value in (*labels.items(), *annotations.items()):
            if isinstance(value, dict | list) or value is None:
                raise CLIError(f"alert {n}: {key!r} must be a string, not {type(value).__name__}")
        out.append(
            ({str(k): str(v) for k, v in labels.items()}, {str(k): str(v) for k, v in annotations.items()})
        )
    return out


def _describe(sig: Signature) -> dict[str, Any]:
    return {
        "signature": sig.name,
        "origin": sig.origin,
        "fault_class": sig.fault_class,
        "ladder": list(sig.ladder.rungs),
        "attempts": {r: sig.ladder.attempts_for(r) for r in sig.ladder.rungs if r != "page"},
        "verify_window_seconds": sig.ladder.verify_window_seconds,
        "cooldown_seconds": sig.ladder.cooldown_seconds,
        "restart_fixes": sig.restart_fixes,
        "reason": sig.reason,
        # what the ladder does not act on, by diagnosis (remediation/diagnosis/policy.py)
        "diagnosis": {
            "acts_on": list(sig.diagnosis.acts_on),
            "not_when": list(sig.diagnosis.effective_not_when(sig.ladder.rungs)),
        },
    }


def cmd_test(
    ns: argparse.Namespace,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run each alert of a file through matching and print the signature and ladder it gets."""
    try:
        lib = _library(ns, os.environ if environ is None else environ)
        text = sys.stdin.read() if ns.file == "-" else Path(ns.file).read_text(encoding="utf-8")
        alerts = _alerts_from(yaml.safe_load(text))
    except (SignatureError, CLIError, OSError, yaml.YAMLError) as exc:
        return _fail(str(exc), err)
    results = []
    for labels, annots in alerts:
        sig = lib.match(labels, annots)
        target, known = target_from_labels(labels)
        results.append(
            {
                "alertname": labels.get("alertname", ""),
                **_describe(sig),
                "target": incident_identity(target),
                "target_problem": target_problem(target, known),
                "also_matched": [s.name for s in lib.candidates(labels, annots) if s.name != sig.name],
            }
        )
    if ns.output == "json":
        json.dump(results, out, indent=2)
        out.write("\n")
        return 0
    for r in results:
        out.write(f"{r['alertname'] or '(no alertname)'} -> {r['signature']} ({r['fault_class']})\n")
        out.write(f"  ladder: {' -> '.join(r['ladder'])}  restart_fixes: {str(r['restart_fixes']).lower()}\n")
        out.write(f"  target: {r['target']}\n")
        if r["target_problem"]:
            out.write(f"  not actionable, pages instead: {r['target_problem']}\n")
        out.write(f"  reason: {r['reason']}\n")
        policy = r["diagnosis"]
        if policy["not_when"]:
            out.write(f"  not acted on when the diagnosis names: {', '.join(policy['not_when'])}\n")
        if policy["acts_on"]:
            out.write(f"  acted on only when the diagnosis names: {', '.join(policy['acts_on'])}\n")
        if r["also_matched"]:
            out.write(f"  also matched (less specific): {', '.join(r['also_matched'])}\n")
    return 0


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CLIError(f"{flag} expects NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _incident(ns: argparse.Namespace, environ: Mapping[str, str]) -> Incident:
    db = ns.db
    if not db:
        storage = ns.storage_path or environ.get(ENV_STORAGE, "")
        if not storage:
            raise CLIError("--incident needs --db or --storage.path")
        db = str(Path(storage) / DB_FILENAME)
    if not Path(db).exists():
        raise CLIError(f"database {db} does not exist")
    try:
        incident = read_incident(Path(db), ns.incident)
    except StoreError as exc:
        raise CLIError(str(exc)) from exc
    if incident is None:
        raise CLIError(f"incident {ns.incident} not found in {db}")
    return incident


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-")[:63] or "signature"


def build_signature(ns: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """The raw signature mapping `add` writes (validated by the caller)."""
    labels: dict[str, str] = {}
    alertname = ns.alertname or ""
    fault_class = ns.fault_class or ""
    source = "recorded with `gpupulse-remediation signatures add`"
    default_name = ""
    if ns.incident is not None:
        inc = _incident(ns, environ)
        if inc.state not in ("closed",):
            raise CLIError(
                f"incident {ns.incident} is {inc.state}; record signatures from resolved incidents"
            )
        inc_labels = inc.labels
        alertname = alertname or inc_labels.get("alertname", "")
        fault_class = fault_class or (
            inc_labels.get("fault_class", "") if inc_labels.get("fault_class") in KNOWN_FAULT_CLASSES else ""
        )
        fault_class = fault_class or (inc.fault_class if inc.fault_class in KNOWN_FAULT_CLASSES else "")
        for key in ("fault_class", "xid"):
            if inc_labels.get(key):
                labels[key] = inc_labels[key]
        source = f"learned from incident {ns.incident} ({inc.signature}, resolved {inc.resolution})"
        default_name = f"learned-{ns.incident}-{alertname}"
    labels.update(_pairs(ns.label, "--label"))
    if not fault_class:
        raise CLIError("--fault-class is required (the incident's alert carries no known fault_class)")
    if labels.get("fault_class") and labels["fault_class"] not in KNOWN_FAULT_CLASSES:
        labels.pop("fault_class")
    match: dict[str, Any] = {}
    if alertname:
        match["alertname"] = alertname
    if labels:
        match["labels"] = labels
    regex = _pairs(ns.label_regex, "--label-regex")
    if regex:
        match["label_regex"] = regex
    ann = _pairs(ns.annotation_regex, "--annotation-regex")
    if ann:
        match["annotation_regex"] = ann
    rungs = LADDERS[ns.fixed_by]
    ladder: dict[str, Any] = {"rungs": rungs}
    acting = [r for r in rungs if r != "page"]
    if acting:
        ladder.update(
            attempts={r: ns.attempts for r in acting},
            verify_window_seconds=ns.verify_window,
            cooldown_seconds=ns.cooldown,
        )
    fixed = {
        "restart": "a restart fixed it",
        "migrate": "moving it fixed it",
        "none": "only a human fixed it",
    }
    raw: dict[str, Any] = {
        "name": ns.name or _slug(default_name or f"user-{alertname or fault_class}"),
        "description": ns.description or f"{alertname or fault_class}: {fixed[ns.fixed_by]}",
        "fault_class": fault_class,
        "match": match,
        "ladder": ladder,
        "restart_fixes": ns.fixed_by == "restart",
        "reason": ns.reason or f"Recorded after a human resolved it: {fixed[ns.fixed_by]}.",
        "source": source,
    }
    if ns.runbook_url:
        raw["runbook_url"] = ns.runbook_url
    if ns.priority:
        raw["priority"] = ns.priority
    return raw


def cmd_add(
    ns: argparse.Namespace,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Validate and write a new user signature file; print what it will match."""
    env = os.environ if environ is None else environ
    dirs = _dirs(ns, env)
    if not dirs:
        return _fail(f"add needs a user signature directory (--signatures DIR or ${ENV_SIGNATURES})", err)
    target_dir = dirs[0]
    try:
        raw = build_signature(ns, env)
        path = target_dir / f"{raw['name']}.yaml"
        sig = parse_signature(raw, str(path), "user")
        target_dir.mkdir(parents=True, exist_ok=True)
        existing = load_library(dirs, include_builtin=not ns.no_builtin)
        current = existing.get(sig.name)
        if current is not None and current.origin == "user" and not ns.force:
            raise CLIError(
                f"signature {sig.name!r} already exists in {current.path}; use --force to replace it"
            )
        if current is not None and current.origin == "user" and current.path != str(path):
            raise CLIError(f"signature {sig.name!r} is defined in {current.path}; edit that file instead")
        tmp = path.with_suffix(".yaml.tmp")
        tmp.write_text(
            f"# {raw['source']}\n" + dump_signatures([sig]),
            encoding="utf-8",
        )
        os.replace(tmp, path)
        load_library(dirs, include_builtin=not ns.no_builtin)  # the library must still load as a whole
    except (SignatureError, CLIError, OSError) as exc:
        return _fail(str(exc), err)
    out.write(f"wrote {path}\n")
    out.write(f"{sig.name}: {sig.fault_class}, ladder {' -> '.join(sig.ladder.rungs)}, ")
    out.write(f"restart_fixes {str(sig.restart_fixes).lower()}\n")
    if current is not None and current.origin == "builtin":
        out.write(f"note: replaces the shipped signature {sig.name!r}\n")
    return 0
