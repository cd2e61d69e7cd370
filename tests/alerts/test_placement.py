"""Where each rule runs under sharded scrapes: the PromQL analysis of alerts/rules/placement.py, the
scope every group declares, and the failures a wrong declaration gets at build time."""

from __future__ import annotations

import dataclasses

import pytest

from alerts.config import ConfigError, load_config
from alerts.rules import Alert, Group, Record, RuleFile, rule_files
from alerts.rules.placement import PlacementError, fleet_reasons, placements


@pytest.fixture(scope="module")
def files() -> tuple[RuleFile, ...]:
    return rule_files(load_config())


@pytest.fixture(scope="module")
def placed(files: tuple[RuleFile, ...]) -> dict[str, tuple[str, ...]]:
    return placements(files)


def _where(files: tuple[RuleFile, ...], placed: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {
        (r.record if isinstance(r, Record) else r.alert): scope
        for f in files
        for g in f.groups
        for r, scope in zip(g.rules, placed[g.name], strict=True)
    }


def _alert(name: str, expr: str) -> Alert:
    return Alert(name, expr, "1m", "warning", "hardware", "thermal", "gpu", "s", "d", "r")


# --- the analysis


@pytest.mark.parametrize(
    "expr",
    [
        "sum by (cluster, namespace) (gpu_memory_used_bytes)",  # per-namespace cost: pods on many nodes
        "count by (cluster, training_job) (max by (training_job, rank) (gpu_training_rank_info))",  # ranks
        "quantile by (training_job) (0.5, rank:gpu_sm_clock:hertz)",  # a gang's median
        "sum(gpu_up)",  # fleet capacity
        "max without (node, uuid) (gpu_temperature_celsius)",
        "rank:gpu_sm_clock:hertz < on(cluster, training_job) group_left() job_median",  # join over the gang
        "gpu_up unless ignoring(node) other",
        "absent(gpu_up)",
        "sum by (cluster, namespace, model, le) (rate(inference_request_latency_seconds_bucket[5m]))",
        "2-sum by (cluster) (gpu_up)",  # a number glued to an aggregation
        "1e-05*count(gpu_up)",
    ],
)
def test_a_rule_that_drops_node_over_several_nodes_needs_the_fleet(expr: str) -> None:
    assert fleet_reasons(expr, {}) != []


@pytest.mark.parametrize(
    "expr",
    [
        "max by (cluster, node, uuid, gpu) (gpu_temperature_celsius) > 85",
        "max by (cluster, uuid) (gpu_tensor_active_ratio)",  # a GPU sits on one node
        "sum by (cluster, namespace, pod) (gpu_process_sm_utilization_ratio)",  # so does a pod
        "max without (gpu) (gpu_temperature_celsius)",
        "a * on(cluster, uuid) group_left(namespace, pod) b",
        "time() - max by (cluster, node, instance, job) (gpupulse_last_sample_timestamp_seconds)",
        "rate(gpu_xid_errors_total[5m]) > 0 and on(cluster, node) max by (cluster, node) (gpu_up offset 5m)",
    ],
)
def test_a_rule_that_keeps_one_node_through_every_aggregation_runs_on_the_shard(expr: str) -> None:
    assert fleet_reasons(expr, {}) == []


def test_words_inside_matchers_strings_and_comments_are_not_read_as_promql() -> None:
    expr = (
        'gpu_clock_event_active{reason="sum by (namespace)"}  # sum by (namespace) would need the fleet\n'
        '+ on(cluster, uuid) label_replace(gpu_up, "x", "count(y)", "node", ".*")'
    )
    assert fleet_reasons(expr, {}) == []


def test_reading_a_record_made_in_the_global_layer_needs_the_global_layer() -> None:
    expr = "namespace:gpu_allocated:sum * 2.5"
    assert fleet_reasons(expr, {"namespace:gpu_allocated:sum": "fleet"}) == [
        "reads namespace:gpu_allocated:sum, recorded in the global layer"
    ]
    assert fleet_reasons(expr, {"namespace:gpu_allocated:sum": "node"}) == []


def test_malformed_promql_is_a_clear_error() -> None:
    with pytest.raises(PlacementError, match="unbalanced"):
        fleet_reasons("max by (node) (gpu_up", {})
    with pytest.raises(PlacementError, match="unbalanced"):
        fleet_reasons('gpu_up{node="a"', {})


def test_a_record_read_before_the_group_that_makes_it_takes_that_groups_place() -> None:
    # the first group reads a fleet record of the second: resolved to a fixed point, not in file order
    reader = Group("reader", (_alert("ReadsLater", "later:x:sum > 1"),), scope="fleet")
    maker = Group("maker", (Record("later:x:sum", "sum by (cluster) (gpu_up)"),), scope="fleet")
    assert placements([RuleFile("f", (reader, maker))]) == {"reader": ("fleet",), "maker": ("fleet",)}


# --- declarations against the PromQL


def _with_rule(files: tuple[RuleFile, ...], group: str, index: int, expr: str) -> list[RuleFile]:
    out = []
    for f in files:
        groups = []
        for g in f.groups:
            if g.name == group:
                rules = list(g.rules)
                rules[index] = dataclasses.replace(rules[index], expr=expr)
                g = dataclasses.replace(g, rules=tuple(rules))
            groups.append(g)
        out.append(dataclasses.replace(f, groups=tuple(groups)))
    return out


def test_a_node_group_whose_rule_drops_node_fails_the_build_naming_the_rule(
    files: tuple[RuleFile, ...],
) -> None:
    bad = _with_rule(
        files, "gpupulse.hardware", 0, "max by (cluster, namespace) (gpu_temperature_celsius) > 85"
    )
    with pytest.raises(
        PlacementError, match=r"gpupulse.hardware is declared scope='node'.*GPUTemperatureHigh.*namespace"
    ):
        placements(bad)


def test_a_node_group_reading_a_global_record_fails_the_build(files: tuple[RuleFile, ...]) -> None:
    bad = _with_rule(
        files, "gpupulse.serving", 0, "namespace_model:inference_request_latency_seconds:p99 > 1"
    )
    with pytest.raises(PlacementError, match="reads namespace_model:inference_request_latency_seconds:p99"):
        placements(bad)


def test_the_build_fails_on_a_wrong_declaration_before_writing_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import alerts.rules as rules_package
    from alerts.rules import hardware

    real = hardware.hardware_file

    def gang_on_the_shards(c: object) -> RuleFile:
        f = real(c)  # type: ignore[arg-type]
        (g,) = f.groups
        gang = _alert("GangOnShard", "count by (cluster, training_job) (gpu_training_rank_info) < 2")
        return dataclasses.replace(f, groups=(dataclasses.replace(g, rules=(*g.rules, gang)),))

    monkeypatch.setattr(rules_package, "hardware_file", gang_on_the_shards)
    with pytest.raises(ConfigError, match="GangOnShard"):
        rules_package.rule_files(load_config())


def test_a_fleet_group_of_node_rules_must_say_node() -> None:
    group = Group("g", (_alert("A", "max by (node) (gpu_up) == 0"),), scope="fleet")
    with pytest.raises(PlacementError, match="declare 'node'"):
        placements([RuleFile("f", (group,))])


def test_per_prometheus_names_only_rules_that_need_it() -> None:
    rule = _alert("A", "max by (node) (gpu_up) == 0")
    with pytest.raises(PlacementError, match="does not hold"):
        placements([RuleFile("f", (Group("g", (rule,), scope="node", per_prometheus=("B",)),))])
    with pytest.raises(PlacementError, match="drop it from per_prometheus"):
        placements([RuleFile("f", (Group("g", (rule,), scope="node", per_prometheus=("A",)),))])


# --- what ships


def test_gang_and_fleet_rules_run_in_the_global_layer(
    files: tuple[RuleFile, ...], placed: dict[str, tuple[str, ...]]
) -> None:
    where = _where(files, placed)
    for name in (
        "TrainingJobHung",
        "TrainingRankStraggler",
        "TrainingJobDegraded",
        "training_job:gpu_training_ranks:count",
        ":gpu_free:sum",
        ":gpu_gang_slots:sum",
        "namespace:gpu_allocated_cost_per_hour:sum",
        "namespace_model:inference_request_latency_seconds:p99",
        "namespace_workload:gpu_process_memory_soft_limit_bytes:quantile",
        "GPUProcessMemoryAboveSoftLimit",
    ):
        assert where[name] == "fleet", name


def test_hardware_and_exporter_alerts_run_on_the_shards(
    files: tuple[RuleFile, ...], placed: dict[str, tuple[str, ...]]
) -> None:
    # they must fire with the global layer down, so every rule they read is recorded on the shards too
    by_name = {g.name: g for f in files for g in f.groups}
    for name in ("gpupulse.hardware", "gpupulse.observability", "gpupulse.serving"):
        assert by_name[name].scope == "node"
        assert set(placed[name]) == {"node"}
    where = _where(files, placed)
    for name in (
        "TrainingJobNodeFault",
        "uuid_namespace_pod:gpu_allocation:sole",
        "rank:gpu_training_busy_idle:bool",
    ):
        assert where[name] == "node", name


def test_every_rule_on_the_shards_reads_only_what_the_shards_record(
    files: tuple[RuleFile, ...], placed: dict[str, tuple[str, ...]]
) -> None:
    from alerts.rules.promql import metric_names

    where = _where(files, placed)
    for f in files:
        for g in f.groups:
            for r, scope in zip(g.rules, placed[g.name], strict=True):
                if scope == "node":
                    read = {n for n in metric_names(r.expr) if n in where}
                    assert {n for n in read if where[n] != "node"} == set(), (g.name, r)


def test_every_group_declares_a_scope_its_rules_agree_with(
    files: tuple[RuleFile, ...], placed: dict[str, tuple[str, ...]]
) -> None:
    for f in files:
        for g in f.groups:
            assert g.scope in ("node", "fleet")
            assert (g.scope == "fleet") == ("fleet" in placed[g.name]), g.name
