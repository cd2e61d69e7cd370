"""Firing episodes as what reaches a human: per alert, how many, per 1,000 GPU-days, pages or not.

A firing is a page when its severity is critical, or when Alertmanager routes it to the controller
(the chart's route: a fault_class and severity critical|warning) and the signature it matches there
pages (a `page` rung, at a page severity other than info). Otherwise it is a warning (severity
warning) or information (ticket, info)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bench.benign.evaluate import Firing
from remediation.signatures import SignatureLibrary, load_library

ROUTED_SEVERITIES = ("critical", "warning")  # the chart's controller route (demo/configs.py)


@dataclass(frozen=True)
class Row:
    alertname: str
    severity: str
    signature: str
    kind: str  # page | warning | info
    firings: int
    per_1000_gpu_days: float


def kind_of(labels: Mapping[str, str], library: SignatureLibrary) -> tuple[str, str]:
    """(page | warning | info, the signature matched or '-' where the alert is not routed)."""
    severity = labels.get("severity", "")
    routed = bool(labels.get("fault_class")) and severity in ROUTED_SEVERITIES
    if not routed:
        return ("page" if severity == "critical" else "info"), "-"
    sig = library.match(labels, {})
    pages = "page" in sig.ladder.rungs and (sig.page_severity or severity or "critical") != "info"
    if severity == "critical" or pages:
        return "page", sig.name
    return ("warning" if severity == "warning" else "info"), sig.name


def rows(firings: Iterable[Firing], gpu_days: float, library: SignatureLibrary | None = None) -> list[Row]:
    """One row per (alert, severity, signature, kind), most firings first."""
    lib = library if library is not None else load_library()
    counts: dict[tuple[str, str, str, str], int] = {}
    for f in firings:
        kind, sig = kind_of(f.labels, lib)
        key = (f.labels.get("alertname", "?"), f.labels.get("severity", ""), sig, kind)
        counts[key] = counts.get(key, 0) + f.episodes
    out = [Row(*key, n, 1000.0 * n / gpu_days) for key, n in counts.items()]
    return sorted(out, key=lambda r: (-r.firings, r.alertname))


def totals(table: Sequence[Row], gpu_days: float) -> dict[str, float]:
    """Pages and warnings per 1,000 GPU-days (the targets of issue 40: 0 and at most 1)."""
    out = {}
    for kind in ("page", "warning", "info"):
        n = sum(r.firings for r in table if r.kind == kind)
        out[kind] = 1000.0 * n / gpu_days
    return out


def markdown(table: Sequence[Row], gpu_days: float) -> str:
    lines = [
        "| alert | severity | signature | counts as | firings | per 1,000 GPU-days |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in table:
        lines.append(
            f"| {r.alertname} | {r.severity} | {r.signature} | {r.kind} | {r.firings} "
            f"| {r.per_1000_gpu_days:.0f} |"
        )
    if not table:
        lines.append("| (nothing fired) | | | | 0 | 0 |")
    t = totals(table, gpu_days)
    lines.append(
        f"\npages: {t['page']:.0f}, warnings: {t['warning']:.0f}, info: {t['info']:.0f} per 1,000 GPU-days "
        f"({gpu_days:g} GPU-days)"
    )
    return "\n".join(lines)
