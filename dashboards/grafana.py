"""A small typed builder for Grafana dashboard JSON: just the panel kinds and options gpupulse uses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

PanelKind = Literal["timeseries", "stat", "table", "bargauge", "state-timeline"]

DATASOURCE_VAR = "datasource"
DATASOURCE = {"type": "prometheus", "uid": "${" + DATASOURCE_VAR + "}"}
SCHEMA_VERSION = 39
GRID_WIDTH = 24


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False


Color = Literal["green", "orange", "red"]


@dataclass(frozen=True)
class Threshold:
    """From `value` up, the panel shows `color` (a stat's background, a line on a time series)."""

    value: float
    color: Color = "red"


@dataclass(frozen=True)
class Column:
    """A table column: the query's label (or "Value") shown under `title`."""

    field: str
    title: str = ""


@dataclass(frozen=True)
class Link:
    """A data link: a click on a series opens `url`, which may use the series' labels
    (`${__field.labels.node}`) and the dashboard's variables (`${__url_time_range}`)."""

    title: str
    url: str


@dataclass(frozen=True)
class Panel:
    """A panel; `unit` is a Grafana unit id (bytes, percentunit, celsius, s, ...) and is required."""

    title: str
    kind: PanelKind
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    width: int = 12
    height: int = 8
    min_value: float | None = None
    max_value: float | None = None
    stacked: bool = False
    thresholds: tuple[Threshold, ...] = ()
    # below the first threshold: green where more is worse (errors), red where less is (budget left)
    base_color: Color = "green"
    links: tuple[Link, ...] = ()
    # a table's columns in order (the rest, e.g. Time, job, instance, are left out); empty = all
    columns: tuple[Column, ...] = ()
    sort_by: str = ""  # a table's column title, sorted descending (the newest first for a time)


@dataclass(frozen=True)
class Row:
    """A titled row of panels, laid out left to right and wrapped at the grid width."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A query variable (multi-select, with All meaning any value, including empty)."""

    name: str
    label: str
    query: str


@dataclass(frozen=True)
class Annotation:
    """A PromQL annotation query: a mark at each step where `expr` returns a series."""

    name: str
    expr: str
    title: str  # Grafana's titleFormat: {{label}} templates
    text: str = ""
    tags: tuple[str, ...] = ()  # labels shown as tags
    color: str = "orange"
    step: str = "60s"


@dataclass(frozen=True)
class Dashboard:
    """A whole dashboard with a fixed uid, so links and provisioning stay stable."""

    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...] = ()
    tags: tuple[str, ...] = ("gpupulse",)
    links: tuple[str, ...] = field(default=())  # uids of dashboards to link to
    time_from: str = "now-6h"
    annotations: tuple[Annotation, ...] = ()

    def render(self) -> dict[str, Any]:
        """The dashboard as Grafana's JSON model."""
        panels: list[dict[str, Any]] = []
        next_id = 1
        y = 0
        for row in self.rows:
            panels.append(
                {
                    "type": "row",
                    "id": next_id,
                    "title": row.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                    "panels": [],
                }
            )
            next_id += 1
            y += 1
            x, row_height = 0, 0
            for panel in row.panels:
                if x + panel.width > GRID_WIDTH:
                    x, y = 0, y + row_height
                    row_height = 0
                panels.append(_panel(panel, next_id, x, y))
                next_id += 1
                x += panel.width
                row_height = max(row_height, panel.height)
            y += row_height
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": SCHEMA_VERSION,
            "time": {"from": self.time_from, "to": "now"},
            "refresh": "30s",
            "timezone": "",
            "links": [
                {
                    "type": "dashboards",
                    "title": "gpupulse",
                    "tags": ["gpupulse"],
                    "asDropdown": True,
                    "includeVars": True,
                }
            ]
            if self.links
            else [],
            "templating": {"list": [_datasource_variable(), *(_variable(v) for v in self.variables)]},
            "annotations": {"list": [_annotation(a) for a in self.annotations]},
            "panels": panels,
        }


def _annotation(a: Annotation) -> dict[str, Any]:
    return {
        "name": a.name,
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": a.color,
        "expr": a.expr,
        "step": a.step,
        "titleFormat": a.title,
        "textFormat": a.text,
        "tagKeys": ",".join(a.tags),
        "useValueForTime": False,
    }


def _datasource_variable() -> dict[str, Any]:
    return {
        "name": DATASOURCE_VAR,
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
    }


def _variable(v: Variable) -> dict[str, Any]:
    return {
        "name": v.name,
        "label": v.label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": v.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "definition": v.query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        # ".*" rather than Grafana's joined list, so series with an empty label still match All
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def _targets(targets: Sequence[Target], table: bool) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(targets):
        out.append(
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": t.expr,
                "legendFormat": t.legend or "__auto",
                "range": not (t.instant or table),
                "instant": t.instant or table,
                "format": "table" if table else "time_series",
            }
        )
    return out


def _panel(p: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.min_value is not None:
        defaults["min"] = p.min_value
    if p.max_value is not None:
        defaults["max"] = p.max_value
    if p.thresholds:
        steps: list[dict[str, Any]] = [{"color": p.base_color, "value": None}]
        steps += [{"color": t.color, "value": t.value} for t in sorted(p.thresholds, key=lambda t: t.value)]
        defaults["thresholds"] = {"mode": "absolute", "steps": steps}
        by_threshold = p.kind in ("stat", "bargauge")
        defaults["color"] = {"mode": "thresholds" if by_threshold else "palette-classic"}
    if p.links:
        defaults["links"] = [{"title": link.title, "url": link.url} for link in p.links]
    options: dict[str, Any] = {}
    if p.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 10,
            "showPoints": "never",
            "stacking": {"mode": "normal" if p.stacked else "none", "group": "A"},
            # a threshold is a dashed line across the graph: where the alert starts
            **({"thresholdsStyle": {"mode": "dashed"}} if p.thresholds else {}),
        }
        options = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}}
    elif p.kind in ("stat", "bargauge"):
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
        if p.thresholds and p.kind == "stat":
            options["colorMode"] = "background"
        elif p.kind == "bargauge":
            options |= {"displayMode": "basic", "orientation": "horizontal", "showUnfilled": True}
    elif p.kind == "table":
        options = {"showHeader": True}
        if p.sort_by:
            options["sortBy"] = [{"displayName": p.sort_by, "desc": True}]
    return {
        "type": p.kind,
        "id": panel_id,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": _targets(p.targets, table=p.kind == "table"),
        **({"transformations": _table_transformations(p)} if p.kind == "table" else {}),
    }


def _table_transformations(p: Panel) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"id": "merge", "options": {}}]
    if p.columns:
        names = [c.field for c in p.columns]
        steps.append({"id": "filterFieldsByName", "options": {"include": {"names": names}}})
        steps.append(
            {
                "id": "organize",
                "options": {
                    "excludeByName": {},
                    "indexByName": {c.field: i for i, c in enumerate(p.columns)},
                    "renameByName": {c.field: c.title for c in p.columns if c.title},
                },
            }
        )
    return steps
