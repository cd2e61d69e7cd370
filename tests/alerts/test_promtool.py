"""promtool validates every rule file and runs every unit test, on both lines (demo/neighbours.py:
Prometheus 3.x and Debian's 2.42), so a rule that holds on one and not the other fails here; a missing
promtool fails too (tests/test_generated.py: the committed files match their source)."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from demo.neighbours import LINES, line
from tests.alerts.ruleset import TESTS_DIR, rule_paths, unit_test_paths


def _run(line_name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(line(line_name).promtool), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize("line_name", LINES)
def test_promtool_check_rules_accepts_every_rule_file(line_name: str) -> None:
    paths = rule_paths()
    assert len(paths) >= 5
    result = _run(line_name, "check", "rules", *map(str, paths))
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_unit_test_files() -> None:
    assert len(unit_test_paths()) >= 5


@pytest.mark.parametrize("name", [p.name for p in unit_test_paths()])
@pytest.mark.parametrize("line_name", LINES)
# memory-leak.test.yaml (production windows, days of 5 m samples) took 257 s on 3.16 and 286 s on 2.42,
# run side by side at load 7-10 on 2 cores. One promtool process per test: scripts/test's workers run
# them side by side (a batch shared in one process would be run again by every worker).
@pytest.mark.timeout(900)
def test_promtool_unit_tests_pass(line_name: str, name: str) -> None:
    result = _run(line_name, "test", "rules", name, cwd=TESTS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 1, result.stdout


def test_every_alert_has_a_firing_case_and_a_quiet_case(alert_rules: list[dict[str, object]]) -> None:
    firing: dict[str, int] = defaultdict(int)
    quiet: dict[str, int] = defaultdict(int)
    for path in unit_test_paths():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                expected = check.get("exp_alerts") or []
                if expected:
                    firing[check["alertname"]] += 1
                    for alert in expected:
                        # full label set and all three annotations, not a partial match
                        assert {"severity", "layer", "fault_class", "target_kind"} <= set(alert["exp_labels"])
                        assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}
                else:
                    quiet[check["alertname"]] += 1
    names = {str(r["alert"]) for r in alert_rules}
    assert names - set(firing) == set(), "alerts without a firing test"
    assert names - set(quiet) == set(), "alerts without a must-not-fire test"


def test_recording_rules_have_value_tests() -> None:
    tested: set[str] = set()
    for path in unit_test_paths():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("promql_expr_test", []):
                # every recorded name the expression reads (a test may wrap one, e.g. in round())
                tested.update(re.findall(r"[a-z_]*:[a-z0-9_]+:[a-z0-9_]+", str(check["expr"])))
    for family in (
        "uuid:gpu_sm_activity:ratio",
        "namespace:gpu_allocated_cost_per_hour:sum",
        "namespace:gpu_idle_allocated:sum",
        ":gpu_gang_slots:sum",
        "namespace_workload:gpu_process_memory_hard_limit_bytes:quantile",
        "namespace_pod_model:inference_kv_cache_hit_ratio:rate",
        "namespace_model:inference_time_to_first_token_seconds:p50",
        "uuid_namespace_pod_model:inference_engine_gpu:share",
        "namespace_model:gpu_energy_joules_per_generated_token:ratio",
        "namespace_model:gpu_cost_per_million_generated_tokens:ratio",
        "uuid_namespace_pod:gpu_usage:share",
    ):
        assert family in tested
