"""The cluster label flows through rules and dashboards (multi-cluster rulers and Grafana), and
single-cluster queries are unchanged in meaning."""

from __future__ import annotations

import json
import re

import pytest

from alerts.rules.promql import metric_names, with_cluster_label, with_matcher
from dashboards.build import JSON_DIR

SELECTOR = re.compile(r"(?<![A-Za-z0-9_:])([A-Za-z_:][A-Za-z0-9_:]*)\{([^{}]*)\}")


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("sum by (namespace) (x)", "sum by (cluster, namespace) (x)"),
        ("a / on(uuid) group_left(source) b", "a / on(cluster, uuid) group_left(source) b"),
        ("sum(x)", "sum by (cluster) (x)"),
        ("sum(x) by (a)", "sum(x) by (cluster, a)"),
        ("x and on() y", "x and on(cluster) y"),
        ("sum without (pid) (x)", "sum without (pid) (x)"),
        ("a * ignoring(le) b", "a * ignoring(le) b"),
        ("sum by (cluster, a) (x)", "sum by (cluster, a) (x)"),
        # strings, ranges, offsets and functions are left alone
        (
            'label_replace(x, "w", "$1", "pod", "(.+)-[bc]{5}") > on(node) max(y[5m] offset 1d)',
            'label_replace(x, "w", "$1", "pod", "(.+)-[bc]{5}") > on(cluster, node) '
            "max by (cluster) (y[5m] offset 1d)",
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))",
            "histogram_quantile(0.99, sum by (cluster, le) (rate(h_bucket[5m])))",
        ),
    ],
)
def test_rules_keep_the_cluster_label_through_aggregations_and_joins(expr: str, want: str) -> None:
    assert with_cluster_label(expr, "cluster") == want


def test_dashboard_queries_gain_the_cluster_matcher_on_every_selector() -> None:
    expr = 'count(gpu_info{node=~"$node"}) + sum by (n) (rate(a[$__rate_interval])) + :gpu_gang_slots:sum'
    assert with_matcher(expr, 'cluster=~"$cluster"', "cluster") == (
        'count(gpu_info{cluster=~"$cluster", node=~"$node"}) + '
        'sum by (cluster, n) (rate(a{cluster=~"$cluster"}[$__rate_interval])) + '
        ':gpu_gang_slots:sum{cluster=~"$cluster"}'
    )


def test_every_dashboard_has_a_cluster_variable_first_and_every_selector_uses_it() -> None:
    for path in sorted(JSON_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        variables = [v for v in board["templating"]["list"] if v["type"] == "query"]
        assert variables[0]["name"] == "cluster", path.name
        assert variables[0]["allValue"] == ".*"  # matches series without the label (one cluster)
        for v in variables[1:]:
            assert 'cluster=~"$cluster"' in v["query"]["query"], (path.name, v["name"])
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                selectors = {name: body for name, body in SELECTOR.findall(target["expr"])}
                names = metric_names(target["expr"])
                assert names, target["expr"]
                for name in names:
                    assert 'cluster=~"$cluster"' in selectors.get(name, ""), (path.name, name, target["expr"])
