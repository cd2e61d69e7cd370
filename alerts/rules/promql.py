"""Small PromQL text helpers shared by the rule modules, the dashboards and the lint tests."""

from __future__ import annotations

import re

_AGGREGATORS = frozenset(
    {
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
# Words that look like identifiers in PromQL but are not metric names (aggregators among them, which
# may be followed by `by (...)` before their parenthesis).
_KEYWORDS = (
    frozenset(
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
        }
    )
    | _AGGREGATORS
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_:]*\}?")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def num(value: float) -> str:
    """A number as PromQL text without a trailing `.0` (85, 0.3, 2.5); an install-time tunable's token."""
    token = getattr(value, "token", None)
    if isinstance(token, str):
        return token
    return f"{value:g}" if float(value) != int(value) else str(int(value))


def histogram_quantile_of(q: float | str, histogram: str, by: str, window: str, selector: str = "") -> str:
    """The q-quantile of a histogram by `by`, from its classic `_bucket` series or else from the native
    histogram Prometheus 3 stores in their place (`convert_classic_histograms_to_nhcb`).

    Both halves drop `le`, so where Prometheus keeps both (`always_scrape_classic_histograms`) the `or`
    matches equal label sets and the classic answer wins, once. Prometheus 2.40+ parses both halves."""
    quantile = q if isinstance(q, str) else num(q)
    matchers = "{" + selector + "}" if selector else ""
    # `by ()` rather than none: a query rewritten for several clusters gains the label in both halves
    grouping = f" by ({by})"
    bucket_grouping = f" by ({by}, le)" if by else " by (le)"
    classic = f"sum{bucket_grouping} (rate({histogram}_bucket{matchers}[{window}]))"
    native = f"sum{grouping} (rate({histogram}{matchers}[{window}]))"
    return f"histogram_quantile({quantile}, {classic})\nor\nhistogram_quantile({quantile}, {native})"


def histogram_count_rate(histogram: str, window: str, selector: str = "") -> str:
    """Per-series rate of observations of a histogram: its classic `_count`, or else the count of the
    native histogram stored in its place; both keep the series' labels, so `or` keeps one per series."""
    matchers = "{" + selector + "}" if selector else ""
    return (
        f"rate({histogram}_count{matchers}[{window}])"
        f" or histogram_count(rate({histogram}{matchers}[{window}]))"
    )


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


# --- multi-cluster ---------------------------------------------------------------------------------

_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_IDENT_START = re.compile(r"[A-Za-z_:]")
_IDENT_REST = re.compile(r"[A-Za-z0-9_:]*")
_NUMBER = re.compile(r"[0-9.][0-9A-Za-z_.]*")
_VARIABLE = re.compile(r"\$(\{[^}]*\}|[A-Za-z0-9_]*)")
_SPACE = re.compile(r"\s*")


def _string_end(expr: str, i: int) -> int:
    """Index just past the string literal starting at i."""
    quote = expr[i]
    j = i + 1
    while j < len(expr) and expr[j] != quote:
        j += 2 if expr[j] == "\\" and quote != "`" else 1
    return j + 1


def _closing(expr: str, i: int, open_char: str, close_char: str) -> int:
    """Index just past the bracket closing the one at i, skipping string literals."""
    depth, j = 0, i
    while j < len(expr):
        ch = expr[j]
        if ch in "\"'`":
            j = _string_end(expr, j)
            continue
        if ch == open_char:
            depth += 1
        elif ch == close_char:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ValueError(f"unbalanced {open_char!r} in {expr!r}")


def _with_label(labels: str, label: str) -> str:
    """A `(a, b)` label list with `label` first, unless it is there already."""
    inner = labels[1:-1]
    names = [n.strip() for n in inner.split(",") if n.strip()]
    if label in names:
        return labels
    return "(" + ", ".join([label, *names]) + ")"


def _rewrite(expr: str, label: str, group_aggregations: bool, matcher: str | None) -> str:
    out: list[str] = []
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch in "\"'`":
            j = _string_end(expr, i)
            out.append(expr[i:j])
            i = j
        elif ch == "#":
            j = expr.find("\n", i)
            j = len(expr) if j < 0 else j
            out.append(expr[i:j])
            i = j
        elif ch == "{":
            j = _closing(expr, i, "{", "}")
            body = expr[i:j]
            if matcher is not None:
                inner = body[1:-1].strip()
                body = "{" + matcher + (", " + inner if inner else "") + "}"
            out.append(body)
            i = j
        elif ch == "[":
            j = _closing(expr, i, "[", "]")
            out.append(expr[i:j])
            i = j
        elif ch == "$":
            m = _VARIABLE.match(expr, i)
            assert m is not None
            out.append(m.group(0))
            i = m.end()
        elif ch.isdigit() or (ch == "." and i + 1 < len(expr) and expr[i + 1].isdigit()):
            m = _NUMBER.match(expr, i)
            assert m is not None
            out.append(m.group(0))
            i = m.end()
        elif _IDENT_START.match(ch):
            m = _IDENT_REST.match(expr, i + 1)
            assert m is not None
            word = expr[i : m.end()]
            space = _SPACE.match(expr, m.end())
            assert space is not None
            after = space.end()
            nxt = expr[after] if after < len(expr) else ""
            out.append(word)
            i = m.end()
            if word in _GROUPING:
                if nxt == "(":
                    j = _closing(expr, after, "(", ")")
                    labels = expr[after:j]
                    if word in ("by", "on"):
                        labels = _with_label(labels, label)
                    out.append(expr[i:after] + labels)
                    i = j
            elif word in _AGGREGATORS and nxt == "(" and group_aggregations:
                j = _closing(expr, after, "(", ")")
                trailing = _SPACE.match(expr, j)
                assert trailing is not None
                follows = expr[trailing.end() : trailing.end() + 8]
                if not re.match(r"(by|without)\s*\(", follows):
                    out.append(f" by ({label}) ")
                    i = after
            elif nxt != "(" and word.lower() not in _KEYWORDS and word not in ("atan2",):
                # a metric name: the selector gains the matcher
                if matcher is not None and nxt != "{":
                    out.append("{" + matcher + "}")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def with_cluster_label(expr: str, label: str) -> str:
    """Keep `label` through every aggregation and join, as multi-cluster rulers need.

    `by (...)` and `on(...)` lists gain the label; an aggregation without grouping gains
    `by (<label>)`. On single-cluster data the label is absent and every result is unchanged.
    """
    return _rewrite(expr, label, group_aggregations=True, matcher=None)


def with_matcher(expr: str, matcher: str, label: str) -> str:
    """Add a label matcher to every vector selector and the label to every `by`/`on` list (dashboards)."""
    return _rewrite(expr, label, group_aggregations=False, matcher=matcher)
