"""Fault signatures: which alerts mean which fault, and which ladder rungs can fix it.

A signature file is YAML with a top-level `signatures:` list. Every field is validated when the
library loads; an error names the file, the signature and the field. Precedence when several
signatures match one alert (most specific wins), compared in this order:
  1. higher `priority` (default 0);
  2. more exact conditions (alertname + equality labels);
  3. more pattern conditions (label_regex + annotation_regex);
  4. a user signature over a shipped one;
  5. name, alphabetically (so the choice is stable).
A user signature with the same name as a shipped one replaces it.

Longer than our ~500-line mark on purpose: the schema (fields, defaults, validation messages) and
the matcher that reads it are one contract, kept in one file so a field cannot be validated in one
place and interpreted differently in another.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

import yaml

from gpupulse.contract import FAULT_CLASSES
from gpupulse.xid import XID_CLASSES, XidClass, xid_class
from remediation.diagnosis.policy import DiagnosisPolicy, parse_policy
from remediation.errors import SignatureError
from remediation.model import Rung

RUNG_ORDER: tuple[Rung, ...] = ("restart", "migrate", "page")

# The fault_class table of docs/alerts.md, from the one contract module (a test keeps the two in step).
KNOWN_FAULT_CLASSES: frozenset[str] = frozenset(FAULT_CLASSES)

UNKNOWN_SIGNATURE_NAME = "unknown-fault"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_TOP_FIELDS = {"signatures"}
_SIG_FIELDS = {
    "name",
    "description",
    "fault_class",
    "match",
    "ladder",
    "restart_fixes",
    "reason",
    "runbook_url",
    "priority",
    "verify_promql",
    "page_severity",
    "source",
    "diagnosis",
}
_MATCH_FIELDS = {"alertname", "labels", "label_regex", "annotation_regex", "xid_class"}
_LADDER_FIELDS = {
    "rungs",
    "attempts",
    "verify_window_seconds",
    "cooldown_seconds",
    "act_after_seconds",
    "page_on_open",
    "resolution_verifies",
    "human_after_migrate",
    "checkpoint_wait_max_seconds",
}


@dataclass(frozen=True)
class Matcher:
    """Conditions an alert must all meet."""

    alertnames: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    label_regex: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    annotation_regex: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    # an XID class of gpupulse/xid.py: the alert's xid is one of its codes, or it is the
    # gpupulse alert for the class (which may aggregate xid away, as GPUFellOffBus does)
    xid_class: XidClass | None = None

    def matches(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
        """True when every condition holds (label regexes must match the whole value)."""
        if self.alertnames and labels.get("alertname", "") not in self.alertnames:
            return False
        if self.xid_class is not None and not self.xid_class.holds(labels):
            return False
        for name, value in self.labels.items():
            if labels.get(name) != value:
                return False
        for name, pattern in self.label_regex.items():
            if name not in labels or pattern.fullmatch(labels[name]) is None:
                return False
        for name, pattern in self.annotation_regex.items():
            if name not in annotations or pattern.search(annotations[name]) is None:
                return False
        return True

    @property
    def exact_count(self) -> int:
        return (1 if self.alertnames else 0) + len(self.labels)

    @property
    def pattern_count(self) -> int:
        return len(self.label_regex) + len(self.annotation_regex) + (1 if self.xid_class else 0)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.alertnames:
            out["alertname"] = list(self.alertnames)
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.label_regex:
            out["label_regex"] = {k: p.pattern for k, p in self.label_regex.items()}
        if self.annotation_regex:
            out["annotation_regex"] = {k: p.pattern for k, p in self.annotation_regex.items()}
        if self.xid_class is not None:
            out["xid_class"] = self.xid_class.name
        return out


@dataclass(frozen=True)
class LadderSpec:
    """Which rungs apply, how often each is tried and how success is verified."""

    rungs: tuple[Rung, ...]
    attempts: Mapping[str, int]
    verify_window_seconds: float = 300.0
    cooldown_seconds: float = 900.0
    # act only when the alert is still firing this long after the incident opened ("persistent")
    act_after_seconds: float = 0.0
    # send an informational page as soon as the incident opens; the ladder still runs
    page_on_open: bool = False
    # the rungs whose success the alert's resolution proves. An alert over an event window (XIDs,
    # ECC) resolves by itself whatever was done; after the other rungs only the cooldown without
    # recurrence (or the signature's verify_promql) counts. None = every acting rung of the ladder.
    resolution_verifies: tuple[Rung, ...] | None = None
    # what a human must still do once migrate moved the work away (GPU reset, reboot, RMA); when set,
    # a successful migrate pages at once, and that page stays open when the alert resolves
    human_after_migrate: str = ""
    # how long a training job's drain waits for its next step under this signature, in place of the
    # fault class's urgency and --drain.checkpoint-wait-max (remediation/decide/boundary.py); None = those
    checkpoint_wait_max_seconds: float | None = None

    def attempts_for(self, rung: Rung) -> int:
        return self.attempts.get(rung, 1)

    def resolution_verifies_rung(self, rung: str) -> bool:
        """True when the alert resolving shows this rung's action worked."""
        if self.resolution_verifies is None:
            return rung in self.rungs
        return rung in self.resolution_verifies

    def to_dict(self) -> dict[str, Any]:
        acting = [r for r in self.rungs if r != "page"]
        return {
            "rungs": list(self.rungs),
            "attempts": {r: self.attempts_for(r) for r in acting},
            "verify_window_seconds": self.verify_window_seconds,
            "cooldown_seconds": self.cooldown_seconds,
            "act_after_seconds": self.act_after_seconds,
            "page_on_open": self.page_on_open,
            "resolution_verifies": [r for r in acting if self.resolution_verifies_rung(r)],
            **({"human_after_migrate": self.human_after_migrate} if self.human_after_migrate else {}),
            **(
                {"checkpoint_wait_max_seconds": self.checkpoint_wait_max_seconds}
                if self.checkpoint_wait_max_seconds is not None
                else {}
            ),
        }


@dataclass(frozen=True)
class Signature:
    """One fault signature: a matcher, a fault class and its ladder."""

    name: str
    fault_class: str
    matcher: Matcher
    ladder: LadderSpec
    restart_fixes: bool
    reason: str
    description: str = ""
    runbook_url: str = ""
    priority: int = 0
    verify_promql: str = ""
    page_severity: str = ""
    source: str = ""
    origin: str = "builtin"  # "builtin", "user" or "fallback"
    path: str = ""
    # which diagnoses it acts on (remediation/diagnosis/policy.py)
    diagnosis: DiagnosisPolicy = field(default_factory=DiagnosisPolicy)

    def precedence(self) -> tuple[int, int, int, int]:
        """Sort key: bigger is more specific (see the module docstring)."""
        return (
            self.priority,
            self.matcher.exact_count,
            self.matcher.pattern_count,
            1 if self.origin == "user" else 0,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain form for the API, the CLI and YAML files written by `signatures add`."""
        out: dict[str, Any] = {
            "name": self.name,
            "fault_class": self.fault_class,
            "description": self.description,
            "match": self.matcher.to_dict(),
            "ladder": self.ladder.to_dict(),
            "restart_fixes": self.restart_fixes,
            "reason": self.reason,
        }
        for key in ("runbook_url", "verify_promql", "page_severity", "source"):
            value = getattr(self, key)
            if value:
                out[key] = value
        if self.priority:
            out["priority"] = self.priority
        policy = self.diagnosis.to_dict()
        if policy:
            out["diagnosis"] = policy
        return out


def unknown_signature(fault_class: str) -> Signature:
    """The fallback for alerts no signature matches: page, never guess."""
    return Signature(
        name=UNKNOWN_SIGNATURE_NAME,
        fault_class=fault_class or "unknown",
        matcher=Matcher(),
        ladder=LadderSpec(rungs=("page",), attempts={}, verify_window_seconds=0.0, cooldown_seconds=0.0),
        restart_fixes=False,
        reason="no signature matches this alert; the controller never guesses",
        origin="fallback",
    )


class SignatureLibrary:
    """The loaded, validated signatures and the matching rule."""

    def __init__(self, signatures: Iterable[Signature]) -> None:
        by_name: dict[str, Signature] = {}
        for sig in signatures:
            by_name[sig.name] = sig  # later (user) definitions replace earlier ones
        self._signatures = sorted(by_name.values(), key=lambda s: s.name)

    def __len__(self) -> int:
        return len(self._signatures)

    def __iter__(self) -> Any:
        return iter(self._signatures)

    def get(self, name: str) -> Signature | None:
        """The signature with this name, if loaded."""
        for sig in self._signatures:
            if sig.name == name:
                return sig
        return None

    def match(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Signature:
        """The most specific matching signature, or the unknown-fault fallback (which pages)."""
        best: Signature | None = None
        for sig in self._signatures:
            if not sig.matcher.matches(labels, annotations):
                continue
            if best is None or sig.precedence() > best.precedence():
                best = sig
        return best if best is not None else unknown_signature(labels.get("fault_class", ""))

    def candidates(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> list[Signature]:
        """Every matching signature, most specific first (for `signatures test`)."""
        found = [s for s in self._signatures if s.matcher.matches(labels, annotations)]
        return sorted(found, key=lambda s: (s.precedence(), [-ord(c) for c in s.name]), reverse=True)


# ---------------------------------------------------------------------------------------------------
# loading and validation


class _Ctx:
    def __init__(self, path: str, sig: str = "") -> None:
        self.path = path
        self.sig = sig

    def fail(self, fieldname: str, message: str) -> SignatureError:
        where = f"{self.path}"
        if self.sig:
            where += f": signature {self.sig!r}"
        return SignatureError(f"{where}: field {fieldname!r}: {message}")


def _str(ctx: _Ctx, d: Mapping[str, Any], key: str, required: bool = False) -> str:
    if key not in d:
        if required:
            raise ctx.fail(key, "is required")
        return ""
    value = d[key]
    if not isinstance(value, str):
        raise ctx.fail(key, f"must be a string, got {type(value).__name__}")
    return value


def _number(ctx: _Ctx, d: Mapping[str, Any], key: str, default: float, prefix: str = "ladder.") -> float:
    if key not in d:
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ctx.fail(prefix + key, "must be a non-negative number of seconds")
    return float(value)


def _str_map(ctx: _Ctx, d: Mapping[str, Any], key: str, prefix: str = "match.") -> dict[str, str]:
    raw = d.get(key, {})
    if not isinstance(raw, dict):
        raise ctx.fail(prefix + key, "must be a mapping of label name to string")
    out: dict[str, str] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, str | int):
            raise ctx.fail(f"{prefix}{key}.{k}", "must map a name to a string")
        out[k] = str(v)  # `xid: 79` in YAML is an int; labels are strings
    return out


def _regex_map(ctx: _Ctx, d: Mapping[str, Any], key: str) -> dict[str, re.Pattern[str]]:
    out: dict[str, re.Pattern[str]] = {}
    for k, v in _str_map(ctx, d, key).items():
        try:
            out[k] = re.compile(v)
        except re.error as exc:
            raise ctx.fail(f"match.{key}.{k}", f"invalid regular expression: {exc}") from exc
    return out


def _parse_matcher(ctx: _Ctx, raw: Any) -> Matcher:
    if not isinstance(raw, dict):
        raise ctx.fail("match", "must be a mapping")
    unknown = set(raw) - _MATCH_FIELDS
    if unknown:
        raise ctx.fail(f"match.{sorted(unknown)[0]}", f"unknown field (allowed: {sorted(_MATCH_FIELDS)})")
    names_raw = raw.get("alertname", [])
    if isinstance(names_raw, str):
        names_raw = [names_raw]
    if not isinstance(names_raw, list) or not all(isinstance(n, str) and n for n in names_raw):
        raise ctx.fail("match.alertname", "must be a string or a list of strings")
    labels = _str_map(ctx, raw, "labels")
    if "fault_class" in labels and labels["fault_class"] not in KNOWN_FAULT_CLASSES:
        raise ctx.fail("match.labels.fault_class", f"unknown fault_class {labels['fault_class']!r}")
    xid: XidClass | None = None
    if "xid_class" in raw:
        try:
            xid = xid_class(raw["xid_class"]) if isinstance(raw["xid_class"], str) else None
        except KeyError:
            xid = None
        if xid is None:
            known = ", ".join(c.name for c in XID_CLASSES)
            raise ctx.fail("match.xid_class", f"must be one of the XID classes {known}")
    matcher = Matcher(
        alertnames=tuple(names_raw),
        labels=labels,
        label_regex=_regex_map(ctx, raw, "label_regex"),
        annotation_regex=_regex_map(ctx, raw, "annotation_regex"),
        xid_class=xid,
    )
    if matcher.exact_count + matcher.pattern_count == 0:
        raise ctx.fail("match", "needs at least one condition (a signature must not match everything)")
    return matcher


def _parse_ladder(ctx: _Ctx, raw: Any) -> LadderSpec:
    if not isinstance(raw, dict):
        raise ctx.fail("ladder", "must be a mapping")
    unknown = set(raw) - _LADDER_FIELDS
    if unknown:
        raise ctx.fail(f"ladder.{sorted(unknown)[0]}", f"unknown field (allowed: {sorted(_LADDER_FIELDS)})")
    rungs_raw = raw.get("rungs")
    if not isinstance(rungs_raw, list) or not rungs_raw:
        raise ctx.fail("ladder.rungs", "must be a non-empty list of restart, migrate, page")
    for r in rungs_raw:
        if r not in RUNG_ORDER:
            raise ctx.fail("ladder.rungs", f"unknown rung {r!r} (allowed: restart, migrate, page)")
    if len(set(rungs_raw)) != len(rungs_raw):
        raise ctx.fail("ladder.rungs", "lists a rung twice")
    if rungs_raw != [r for r in RUNG_ORDER if r in rungs_raw]:
        raise ctx.fail("ladder.rungs", "must keep the order restart, migrate, page")
    if rungs_raw[-1] != "page":
        raise ctx.fail("ladder.rungs", "must end with page (an unfixed fault always reaches a human)")
    attempts_raw = raw.get("attempts", {})
    if not isinstance(attempts_raw, dict):
        raise ctx.fail("ladder.attempts", "must be a mapping of rung to a count")
    attempts: dict[str, int] = {}
    for rung, count in attempts_raw.items():
        if rung not in ("restart", "migrate"):
            raise ctx.fail(f"ladder.attempts.{rung}", "only restart and migrate take attempts")
        if rung not in rungs_raw:
            raise ctx.fail(f"ladder.attempts.{rung}", "sets attempts for a rung the ladder does not use")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10:
            raise ctx.fail(f"ladder.attempts.{rung}", "must be an integer from 1 to 10")
        attempts[rung] = count
    page_on_open = raw.get("page_on_open", False)
    if not isinstance(page_on_open, bool):
        raise ctx.fail("ladder.page_on_open", "must be true or false")
    acting = [r for r in rungs_raw if r != "page"]
    verify = _number(ctx, raw, "verify_window_seconds", 300.0)
    if acting and verify <= 0:
        raise ctx.fail("ladder.verify_window_seconds", "must be positive when restart or migrate is used")
    verifies: tuple[Rung, ...] | None = None
    if "resolution_verifies" in raw:
        listed = raw["resolution_verifies"]
        if not isinstance(listed, list) or any(r not in acting for r in listed):
            raise ctx.fail(
                "ladder.resolution_verifies", f"must list rungs of this ladder that act (of {acting})"
            )
        verifies = tuple(cast(list[Rung], listed))
    human = raw.get("human_after_migrate", "")
    if not isinstance(human, str):
        raise ctx.fail("ladder.human_after_migrate", "must be a string: what a human must still do")
    if human and "migrate" not in rungs_raw:
        raise ctx.fail("ladder.human_after_migrate", "needs migrate in ladder.rungs")
    wait_max: float | None = None
    if "checkpoint_wait_max_seconds" in raw:
        wait_max = _number(ctx, raw, "checkpoint_wait_max_seconds", 0.0)
        if wait_max < 0:
            raise ctx.fail("ladder.checkpoint_wait_max_seconds", "must not be negative (0 = drain now)")
    return LadderSpec(
        rungs=tuple(cast(list[Rung], rungs_raw)),
        attempts=attempts,
        verify_window_seconds=verify,
        cooldown_seconds=_number(ctx, raw, "cooldown_seconds", 900.0),
        act_after_seconds=_number(ctx, raw, "act_after_seconds", 0.0),
        page_on_open=page_on_open,
        resolution_verifies=verifies,
        human_after_migrate=human.strip(),
        checkpoint_wait_max_seconds=wait_max,
    )


def parse_signature(raw: Any, path: str, origin: str) -> Signature:
    """Validate one signature mapping; raise SignatureError naming file, signature and field."""
    ctx = _Ctx(path)
    if not isinstance(raw, dict):
        raise ctx.fail("signatures[]", "each entry must be a mapping")
    name = _str(ctx, raw, "name", required=True)
    if not _NAME_RE.match(name):
        raise ctx.fail("name", "must be lower-case letters, digits, '.', '_' or '-' (at most 63)")
    ctx.sig = name
    unknown = set(raw) - _SIG_FIELDS
    if unknown:
        raise ctx.fail(sorted(unknown)[0], f"unknown field (allowed: {sorted(_SIG_FIELDS)})")
    fault_class = _str(ctx, raw, "fault_class", required=True)
    if fault_class not in KNOWN_FAULT_CLASSES:
        raise ctx.fail(
            "fault_class",
            f"unknown fault_class {fault_class!r}; docs/alerts.md lists {sorted(KNOWN_FAULT_CLASSES)}",
        )
    if "match" not in raw:
        raise ctx.fail("match", "is required")
    matcher = _parse_matcher(ctx, raw["match"])
    if "ladder" not in raw:
        raise ctx.fail("ladder", "is required")
    ladder = _parse_ladder(ctx, raw["ladder"])
    restart_fixes = raw.get("restart_fixes")
    if not isinstance(restart_fixes, bool):
        raise ctx.fail("restart_fixes", "is required and must be true or false")
    if restart_fixes != ("restart" in ladder.rungs):
        raise ctx.fail(
            "restart_fixes",
            "must be true exactly when ladder.rungs contains restart "
            "(a fault a restart never fixes must not be restarted)",
        )
    reason = _str(ctx, raw, "reason", required=True)
    if not reason.strip():
        raise ctx.fail("reason", "must say why restart does or does not fix this fault")
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ctx.fail("priority", "must be an integer")
    severity = _str(ctx, raw, "page_severity")
    if severity and severity not in ("critical", "error", "warning", "info"):
        raise ctx.fail("page_severity", "must be critical, error, warning or info")
    return Signature(
        name=name,
        fault_class=fault_class,
        matcher=matcher,
        ladder=ladder,
        restart_fixes=restart_fixes,
        reason=reason,
        description=_str(ctx, raw, "description"),
        runbook_url=_str(ctx, raw, "runbook_url"),
        priority=priority,
        verify_promql=_str(ctx, raw, "verify_promql"),
        page_severity=severity,
        source=_str(ctx, raw, "source"),
        origin=origin,
        path=path,
        diagnosis=parse_policy(raw.get("diagnosis"), ctx.fail),
    )


def parse_document(text: str, path: str, origin: str) -> list[Signature]:
    """Parse one YAML file's text into signatures (names unique within the file)."""
    ctx = _Ctx(path)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SignatureError(f"{path}: not valid YAML: {exc}") from exc
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise ctx.fail("signatures", "the file must be a mapping with a top-level 'signatures' list")
    unknown = set(doc) - _TOP_FIELDS
    if unknown:
        raise ctx.fail(sorted(unknown)[0], "unknown top-level field (allowed: signatures)")
    items = doc.get("signatures")
    if not isinstance(items, list):
        raise ctx.fail("signatures", "must be a list")
    out: list[Signature] = []
    seen: set[str] = set()
    for raw in items:
        sig = parse_signature(raw, path, origin)
        if sig.name in seen:
            raise _Ctx(path, sig.name).fail("name", "is defined twice in this file")
        seen.add(sig.name)
        out.append(sig)
    return out


def _yaml_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml"))


def load_builtin() -> list[Signature]:
    """The signatures shipped in remediation/signatures/."""
    out: list[Signature] = []
    root = resources.files("remediation").joinpath("signatures")
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith((".yaml", ".yml")):
            out.extend(parse_document(entry.read_text(encoding="utf-8"), f"builtin:{entry.name}", "builtin"))
    return out


def load_library(dirs: Sequence[Path] = (), include_builtin: bool = True) -> SignatureLibrary:
    """Load shipped and user signatures; raise SignatureError on the first invalid field."""
    sigs: list[Signature] = load_builtin() if include_builtin else []
    for directory in dirs:
        if not directory.is_dir():
            raise SignatureError(f"{directory}: signature directory does not exist")
        names: dict[str, str] = {}
        for path in _yaml_files(directory):
            for sig in parse_document(path.read_text(encoding="utf-8"), str(path), "user"):
                if sig.name in names:
                    raise SignatureError(
                        f"{path}: signature {sig.name!r} is also defined in {names[sig.name]}"
                    )
                names[sig.name] = str(path)
                sigs.append(sig)
    return SignatureLibrary(sigs)


def dump_signatures(sigs: Sequence[Signature]) -> str:
    """YAML text for a signature file (round-trips through parse_document)."""
    return yaml.safe_dump({"signatures": [s.to_dict() for s in sigs]}, sort_keys=False, allow_unicode=True)
