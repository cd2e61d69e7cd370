"""Small PromQL text helpers shared by the rule modules, the dashboards and the lint tests."""

from __future__ import annotations

import re

# Words that look like identifiers in PromQL but are not metric names.
_KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "inf",
        "nan",
        # aggregators, which may be followed by `by (...)` before their parenthesis
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "group",
        "topk",
        "bottomk",
        "quantile",
        "stddev",
        "stdvar",
        "count_values",
    }
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_:]*\}?")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def num(value: float) -> str:
    """A number as PromQL text without a trailing `.0` (85, 0.3, 2.5)."""
    return f"{value:g}" if float(value) != int(value) else str(int(value))


def metric_names(expr: str) -> set[str]:
    """Metric (and recording-rule) names that a PromQL expression selects."""
    text = _GRAFANA_VAR.sub("1", expr)
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(r"\1", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def base_metric(name: str) -> str:
    """The family name of a histogram series (`x_bucket` -> `x`); other names unchanged."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
