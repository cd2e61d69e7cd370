"""The runbooks can be followed from a phone: each has the on-call's sections, every PromQL block is one
query that the real promtool parses, node commands go through kubectl, the manual path of the default
dry run is the ladder's, no internal references, and the runbook links of the rules and the chart
resolve to runbooks of this repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from alerts.config import load_config
from alerts.rules.promql import base_metric, metric_names
from tests.alerts.promtool_parse import check_queries, fenced_blocks, promtools
from tests.alerts.ruleset import ROOT, RUNBOOKS_DIR, known_metrics

sys.path.insert(0, str(ROOT / "scripts"))
import generate_runbooks

# The sections in the order an on-call reads them.
SECTIONS = (
    "## Dashboards",
    "## Escalation",
    "## Meaning",
    "## Confirm",
    "## Automation",
    "## What did gpupulse do?",
    "## By hand (dry run, the default)",
    "## Stop the automation",
    "## What to do",
)
# commands that need the node: they must run through kubectl exec (driver pod) or the node shell
NODE_COMMANDS = re.compile(r"(?<![\w-])(nvidia-smi|dmesg|lspci|vmstat|iostat|free -h|dcgmi)\b")
PROMETHEUS_INTERNAL = {"up", "time"}


def _runbooks() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(RUNBOOKS_DIR.glob("*.md"))}


def _blocks(text: str, lang: str | None = None) -> list[tuple[str, str]]:
    return fenced_blocks(text, lang)


def _queries() -> dict[str, str]:
    out = {}
    for name, text in _runbooks().items():
        for i, (_, body) in enumerate(_blocks(text, "promql"), 1):
            out[f"runbook:{name}:q{i}"] = body
    return out


def test_every_alert_has_one_runbook_and_every_runbook_an_alert(alert_rules: list[dict[str, Any]]) -> None:
    assert set(_runbooks()) == {r["alert"] for r in alert_rules}


@pytest.mark.parametrize("name", sorted(_runbooks()))
def test_every_runbook_has_the_on_call_sections_in_order(name: str) -> None:
    text = _runbooks()[name]
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS), name
    confirm = text.split("## Confirm", 1)[1].split("\n## ", 1)[0]
    langs = [lang for lang, _ in _blocks(confirm)]
    assert "promql" in langs, f"{name}: Confirm has no ```promql block"
    # an unmarked fence would hide a query from the promtool test below
    assert all(lang in ("promql", "sh") for lang, _ in _blocks(text)), f"{name}: a fence without a language"


@pytest.mark.parametrize("promtool", promtools())
def test_every_promql_block_is_one_query_that_promtool_parses(promtool: str, tmp_path: Path) -> None:
    queries = _queries()
    assert len(queries) >= 3 * len(_runbooks()) - 10  # the extraction finds them
    result = check_queries(promtool, queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


@pytest.mark.parametrize("promtool", promtools())
def test_promtool_refuses_two_queries_in_one_block(promtool: str, tmp_path: Path) -> None:
    # what GPUXidResetRequired's Confirm block held: pasted into Prometheus it is a parse error
    two = 'gpu_remapped_rows_pending{uuid="<uuid>"}, gpu_ecc_errors_total{uuid="<uuid>", type="uncorrected"}'
    lines = 'gpu_up{node="<node>"}\nincrease(gpu_xid_errors_total{node="<node>", xid="79"}[1h])'
    result = check_queries(promtool, {"runbook:x:q1": two, "runbook:x:q2": lines}, tmp_path)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert '"runbook:x:q1": could not parse expression' in out
    assert '"runbook:x:q2": could not parse expression' in out


def test_promql_blocks_select_only_series_gpupulse_has(recording_rules: list[dict[str, Any]]) -> None:
    allowed = known_metrics() | PROMETHEUS_INTERNAL | {r["record"] for r in recording_rules}
    for name, expr in _queries().items():
        used = {n if n in allowed else base_metric(n) for n in metric_names(expr.split("#", 1)[0])}
        assert used and used <= allowed, f"{name}: {expr!r} selects {used - allowed}"


# labels whose values are a closed set the exporter emits: a runbook that names another value reads 0
CLOSED_LABELS = ("type", "cause", "state")
GOLDEN = ROOT / "tests" / "exporter" / "golden"
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"')


def _emitted_values() -> dict[tuple[str, str], set[str]]:
    """(metric, label) -> the values the exporter's golden expositions hold."""
    out: dict[tuple[str, str], set[str]] = {}
    for path in GOLDEN.glob("*.prom"):
        for line in path.read_text().splitlines():
            found = SELECTOR.match(line)
            if found:
                for label, value in MATCHER.findall(found.group(2)):
                    out.setdefault((found.group(1), label), set()).add(value)
    return out


def test_promql_blocks_match_label_values_the_exporter_emits() -> None:
    # the XID 48 runbook's ECC query once read 0 where the alert fired: every literal value of a
    # closed label must be one the exporter writes for that metric
    emitted = _emitted_values()
    checked = 0
    for name, expr in _queries().items():
        for metric, matchers in SELECTOR.findall(expr.split("#", 1)[0]):
            for label, value in MATCHER.findall(matchers):
                if label in CLOSED_LABELS and (metric, label) in emitted:
                    assert value in emitted[(metric, label)], (
                        f"{name}: {metric}{{{label}={value!r}}}: the exporter writes "
                        f"{sorted(emitted[(metric, label)])}"
                    )
                    checked += 1
    assert checked >= 3  # the ECC and row-remap queries at least


def test_the_reset_runbook_confirms_xid_48_with_the_ecc_and_remap_counters() -> None:
    text = _runbooks()["GPUXidResetRequired"]
    queries = [" ".join(body.split("#", 1)[0].split()) for _, body in _blocks(text, "promql")]
    assert 'increase(gpu_ecc_errors_total{uuid="<uuid>", type="uncorrected"}[1h])' in queries
    assert 'increase(gpu_remapped_rows_total{uuid="<uuid>", cause="uncorrectable"}[1h])' in queries


@pytest.mark.parametrize("name", sorted(n for n, text in _runbooks().items() if "py-spy" in text))
def test_py_spy_is_given_the_container_pid_and_the_host_pid_is_explained(name: str) -> None:
    text = _runbooks()[name]
    for _, body in _blocks(text, "sh"):
        for line in body.splitlines():
            if "py-spy" in line and "kubectl exec" in line:
                # NVML reports host PIDs, the series' pid label; inside the container that PID is another
                assert "--pid <container-pid>" in line, f"{name}: {line}"
    assert "**host** PID" in text and "grep NSpid /proc/<pid>/status" in text, name
    assert (
        "kubectl debug node/<node>" in text and "py-spy" in text.split("kubectl debug node/<node>")[1][:200]
    )


@pytest.mark.parametrize("name", sorted(_runbooks()))
def test_escalation_names_who_is_paged_and_what_to_hand_over(name: str) -> None:
    text = _runbooks()[name]
    escalation = text.split("## Escalation", 1)[1].split("\n## ", 1)[0]
    if escalation.lstrip().startswith("`info`"):
        return
    assert "**Who**" in escalation and "**Hand over**" in escalation, name
    if "(it is about the controller)" in escalation:
        assert "gpupulse-remediation status" in escalation, name
    else:
        assert "`controller.pager`" in escalation and "incidents get <id>" in escalation, name


@pytest.mark.parametrize("name", sorted(_runbooks()))
def test_node_commands_run_through_kubectl_not_ssh(name: str) -> None:
    text = _runbooks()[name]
    for _, body in _blocks(text, "sh"):
        for line in body.splitlines():
            if NODE_COMMANDS.search(line):
                assert "kubectl exec" in line or "# in the node shell" in line, f"{name}: {line}"
    if "# in the node shell" in text or "<driver-pod>" in text:
        assert "## On the node" in text and "kubectl debug node/<node>" in text, name


@pytest.mark.parametrize("name", sorted(_runbooks()))
def test_runbooks_cite_no_internal_references(name: str) -> None:
    text = _runbooks()[name]
    assert not re.search(r"\bseed\b|\bcase \d", text, flags=re.IGNORECASE), name


def test_the_manual_path_is_the_ladder_spelled_in_kubectl() -> None:
    from alerts.generate import render_rules
    from remediation.signatures import load_library

    runbooks = _runbooks()
    seen = set()
    for alert in generate_runbooks.facts(render_rules(), load_library()):
        manual = runbooks[alert.name].split("## By hand", 1)[1].split("## Stop the automation", 1)[0]
        rungs = alert.signature.ladder.rungs
        if alert.target_kind == "controller":  # routed past the controller: no ladder to follow by hand
            assert rungs == ("page",), alert.name
            assert "Nothing: this alert is about the controller" in runbooks[alert.name], alert.name
            assert "Follow What to do." in manual, alert.name
            continue
        assert f"its ladder is **{' → '.join(rungs)}**" in runbooks[alert.name], alert.name
        if rungs == ("page",):
            assert "Nothing that gpupulse would do: its ladder only pages" in manual, alert.name
        if "restart" in rungs and alert.target_kind == "pod":
            assert "ownerReferences[?(@.controller==true)]" in manual, alert.name
            assert "kubectl delete pod -n <namespace> <pod>" in manual, alert.name
        if "migrate" in rungs:
            assert "kubectl cordon <node>" in manual, alert.name
        if "migrate" in rungs and alert.target_kind != "job":
            assert "kubectl drain <node> --ignore-daemonsets --delete-emptydir-data" in manual, alert.name
        if alert.target_kind == "job" and set(rungs) & {"restart", "migrate"}:
            assert "jobset.sigs.k8s.io/jobset-name=<job>" in manual, alert.name
        seen.add((rungs, alert.target_kind))
    # the suite covers each shape of manual path
    assert {(("page",), "pod"), (("restart", "migrate", "page"), "pod"), (("migrate", "page"), "gpu")} <= seen
    assert {(("restart", "migrate", "page"), "job"), (("migrate", "page"), "job")} <= seen


def test_a_runbook_without_its_markers_is_an_error_that_names_it() -> None:
    path = PurePosixPath("docs/runbooks/GPUFellOffBus.md")
    text = (ROOT / path).read_text().replace(generate_runbooks.begin_marker("actions"), "")
    with pytest.raises(generate_runbooks.RunbookError, match=r"GPUFellOffBus\.md: the BEGIN/END markers"):
        generate_runbooks.render(text, {"links": "x", "actions": "y"}, path)


def test_the_generated_blocks_keep_the_hand_written_text() -> None:
    path = PurePosixPath("docs/runbooks/GPUFellOffBus.md")
    text = (ROOT / path).read_text()
    again = generate_runbooks.render(text, {"links": "L", "actions": "A"}, path)
    assert generate_runbooks.hand_written(again) == generate_runbooks.hand_written(text)
    assert "\nL\n" in again and "\nA\n" in again


# --- runbook links that resolve


def _chart() -> dict[str, Any]:
    chart: dict[str, Any] = yaml.safe_load((ROOT / "helm" / "gpupulse" / "Chart.yaml").read_text())
    return chart


def _resolves_here(url: str) -> Path:
    """The file of this checkout that a github.com blob URL of the project names."""
    home = str(_chart()["home"]).rstrip("/")
    assert url.startswith(f"{home}/blob/"), url
    ref, _, path = url.removeprefix(f"{home}/blob/").partition("/")
    if (ROOT / ".git").exists():
        known = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        remote = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"origin/{ref}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        assert known.returncode == 0 or remote.returncode == 0, f"{url}: no ref {ref} in this repository"
    return ROOT / path


def test_the_rules_runbook_urls_name_runbooks_of_this_repository(alert_rules: list[dict[str, Any]]) -> None:
    assert load_config().runbook_url_base == f"{_chart()['home']}/blob/main/docs/runbooks/"
    for rule in alert_rules:
        url = rule["annotations"]["runbook_url"]
        assert _resolves_here(url).is_file(), url


def test_a_url_to_a_tag_that_does_not_exist_does_not_resolve() -> None:
    with pytest.raises(AssertionError, match=r"no ref gpupulse-0\.0\.0-never"):
        _resolves_here(f"{_chart()['home']}/blob/gpupulse-0.0.0-never/docs/runbooks/GPUFellOffBus.md")


@pytest.mark.slow
def test_the_charts_default_runbook_urls_resolve_here(tmp_path: Path) -> None:
    from tests.helm.installs import install_values

    inst = install_values(tmp_path, "runbooks", {"prometheusRule": {"enabled": True}})
    alerts = [r for g in inst.one("PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        assert url == load_config().runbook_url(rule["alert"]), url
        assert _resolves_here(url).is_file(), url


# --- what the README says about the alerts


def test_the_readme_gives_each_alert_the_target_kind_of_its_rule(alert_rules: list[dict[str, Any]]) -> None:
    kinds = {r["alert"]: r["labels"]["target_kind"] for r in alert_rules}
    readme = (ROOT / "README.md").read_text()
    claims = []
    # a paragraph or list item that names an alert and a target_kind says that alert has that kind
    for chunk in re.split(r"\n\s*\n|\n\d+\. |\n- ", readme):
        named = [n for n in re.findall(r"`([A-Z][A-Za-z0-9]+)`", chunk) if n in kinds]
        for kind in re.findall(r"target_kind=(\w+)", chunk):
            assert len(set(named)) == 1, f"README: target_kind={kind} next to {named or 'no alert'}"
            claims.append((named[0], kind))
    assert claims, "the README's walk-through names an alert's target_kind"
    for name, kind in claims:
        assert kinds[name] == kind, f"README says {name} has target_kind={kind}; its rule says {kinds[name]}"


@pytest.mark.parametrize("name", sorted(_runbooks()))
def test_dashboard_links_name_boards_and_variables_that_exist(name: str) -> None:
    import json

    boards = {}
    for path in (ROOT / "dashboards" / "json").glob("*.json"):
        board = json.loads(path.read_text())
        boards[board["uid"]] = {v["name"] for v in board["templating"]["list"]}
    links = re.findall(r"`<grafana>/d/([a-z0-9-]+)(?:\?([^`]*))?`", _runbooks()[name])
    assert links and any(uid == "gpupulse-remediation" for uid, _ in links), name
    for uid, query in links:
        assert uid in boards, f"{name}: no dashboard {uid}"
        for param in filter(None, query.split("&")):
            var = param.split("=", 1)[0].removeprefix("var-")
            assert var in boards[uid], f"{name}: {uid} has no variable {var}"
