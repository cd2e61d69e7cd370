"""The report as text for a terminal, CSV for a spreadsheet, or Markdown for a ticket or wiki.

CSV carries exact numbers (energy in joules, as Prometheus has it) and one row per line item with a
`section` column, so one file loads into one sheet; text and Markdown round for people (energy in
kWh)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime

from costreport.usage import Report

FORMATS = ("text", "csv", "markdown")
JOULES_PER_KWH = 3.6e6
IDLE_TITLE = "Largest idle allocations"
# what a table with no rows says instead (text and Markdown)
EMPTY = {IDLE_TITLE: "no idle GPUs: no allocated GPU's SM activity was under the idle threshold"}


def render(report: Report, fmt: str) -> str:
    if fmt == "csv":
        return _csv(report)
    tables = _tables(report)
    if fmt == "markdown":
        return _markdown(report, tables)
    return _text(report, tables)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _show_cluster(report: Report) -> bool:
    return any(n.cluster for n in report.namespaces)


Table = tuple[str, list[str], list[list[str]]]


def _tables(report: Report) -> list[Table]:
    cur = report.currency or "cost"
    with_cluster = _show_cluster(report)
    lead = ["cluster"] if with_cluster else []

    def first(cluster: str) -> list[str]:
        return [cluster] if with_cluster else []

    ns_rows = [
        [
            *first(n.cluster),
            n.namespace,
            _num(n.gpu_hours),
            _num(n.idle_gpu_hours),
            _num(n.energy_joules / JOULES_PER_KWH),
            _num(n.cost),
            _num(n.idle_cost),
        ]
        for n in report.namespaces
    ]
    ns_rows.append(
        [
            *first(""),
            "(total)",
            _num(sum(n.gpu_hours for n in report.namespaces)),
            _num(sum(n.idle_gpu_hours for n in report.namespaces)),
            _num(sum(n.energy_joules for n in report.namespaces) / JOULES_PER_KWH),
            _num(sum(n.cost for n in report.namespaces)),
            _num(sum(n.idle_cost for n in report.namespaces)),
        ]
    )
    for cluster, joules in sorted(report.unallocated_energy_joules.items()):
        if joules > 0:
            ns_rows.append(
                [
                    *first(cluster),
                    "(no pod: unallocated GPUs)",
                    "-",
                    "-",
                    _num(joules / JOULES_PER_KWH),
                    "-",
                    "-",
                ]
            )
    tables: list[Table] = [
        (
            "Per namespace",
            [
                *lead,
                "namespace",
                "GPU-hours",
                "idle GPU-hours",
                "energy kWh",
                f"cost {cur}",
                f"idle cost {cur}",
            ],
            ns_rows,
        )
    ]
    if report.models:
        tables.append(
            (
                "Per model",
                [
                    *lead,
                    "namespace",
                    "model",
                    "GPU-hours",
                    "energy kWh",
                    f"cost {cur}",
                    "generated tokens",
                    f"{cur} per 1M tokens",
                ],
                [
                    [
                        *first(m.cluster),
                        m.namespace,
                        m.model,
                        _num(m.gpu_hours),
                        _num(m.energy_joules / JOULES_PER_KWH),
                        _num(m.cost),
                        _num(m.generated_tokens, 0),
                        _num(m.cost_per_million_tokens, 4),
                    ]
                    for m in report.models
                ],
            )
        )
    # always shown: an empty list says so, rather than leaving the reader to wonder whether it ran
    tables.append(
        (
            IDLE_TITLE,
            [*lead, "namespace", "pod", "idle GPU-hours", "GPU-hours held", "idle share"],
            [
                [
                    *first(i.cluster),
                    i.namespace,
                    i.pod,
                    _num(i.idle_gpu_hours),
                    _num(i.gpu_hours),
                    f"{i.idle_gpu_hours / i.gpu_hours:.0%}" if i.gpu_hours else "-",
                ]
                for i in report.idle
            ],
        )
    )
    return tables


def _heading(report: Report) -> list[str]:
    price = report.price_per_gpu_hour
    return [
        f"GPU usage {_when(report.start)} to {_when(report.end)} (step {report.step_seconds:g} s)",
        f"price per GPU-hour in the rules: {_num(price)} {report.currency}".rstrip(),
    ]


def _text(report: Report, tables: Sequence[Table]) -> str:
    out = [*_heading(report), ""]
    for title, header, rows in tables:
        out.append(title)
        if not rows:
            out += [EMPTY.get(title, "none"), ""]
            continue
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
        for row in [header, *rows]:
            # names left, numbers right
            cells = [c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths, strict=True)]
            out.append("  ".join(cells).rstrip())
        out.append("")
    return "\n".join(out)


def _numeric(cell: str) -> bool:
    return cell == "-" or cell.replace(",", "").replace(".", "", 1).rstrip("%").lstrip("-").isdigit()


def _markdown(report: Report, tables: Sequence[Table]) -> str:
    out = [f"# {_heading(report)[0]}", "", _heading(report)[1], ""]
    for title, header, rows in tables:
        if not rows:
            out += [f"## {title}", "", EMPTY.get(title, "none"), ""]
            continue
        out += [
            f"## {title}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|",
        ]
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        out.append("")
    return "\n".join(out)


def _csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "section",
            "cluster",
            "namespace",
            "model",
            "pod",
            "gpu_hours",
            "idle_gpu_hours",
            "energy_joules",
            "cost",
            "idle_cost",
            "currency",
            "generated_tokens",
            "cost_per_million_tokens",
            "period_start",
            "period_end",
        ]
    )
    period = [_when(report.start), _when(report.end)]

    def blank(value: float | None) -> str:
        return "" if value is None else repr(value)

    for n in report.namespaces:
        w.writerow(
            [
                "namespace",
                n.cluster,
                n.namespace,
                "",
                "",
                n.gpu_hours,
                n.idle_gpu_hours,
                n.energy_joules,
                n.cost,
                n.idle_cost,
                report.currency,
                "",
                "",
                *period,
            ]
        )
    for cluster, joules in sorted(report.unallocated_energy_joules.items()):
        w.writerow(["unallocated", cluster, "", "", "", "", "", joules, "", "", "", "", "", *period])
    for m in report.models:
        w.writerow(
            [
                "model",
                m.cluster,
                m.namespace,
                m.model,
                "",
                m.gpu_hours,
                "",
                m.energy_joules,
                blank(m.cost),
                "",
                report.currency,
                blank(m.generated_tokens),
                blank(m.cost_per_million_tokens),
                *period,
            ]
        )
    for i in report.idle:
        w.writerow(
            [
                "idle_allocation",
                i.cluster,
                i.namespace,
                "",
                i.pod,
                i.gpu_hours,
                i.idle_gpu_hours,
                "",
                "",
                "",
                "",
                "",
                "",
                *period,
            ]
        )
    return buf.getvalue()
