"""Generated Prometheus, Alertmanager, rule and signature files of the demo."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from demo.configs import EXPORTER_JOB, ScrapeTarget, alertmanager_config, prometheus_config, write_yaml
from demo.neighbours import LINES, line
from demo.rules import DEMO_RULE_OVERRIDES, demo_rules, write_demo_rules
from demo.signatures import DEMO_LADDERS, demo_signatures, write_demo_signatures
from remediation.signatures import load_library

ALERTS_DIR = Path(__file__).resolve().parents[2] / "alerts"
SHORTENED = set(DEMO_RULE_OVERRIDES["for"])


def _alerts(texts: dict[str, str]) -> dict[str, dict[str, object]]:
    out = {}
    for text in texts.values():
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule
    return out


def test_demo_rules_shorten_only_the_incident_alerts() -> None:
    committed = _alerts({p.name: p.read_text() for p in ALERTS_DIR.glob("*.rules.yaml")})
    fast = _alerts(demo_rules())
    assert set(fast) == set(committed)
    for name, rule in fast.items():
        if name in SHORTENED:
            assert rule["for"] == DEMO_RULE_OVERRIDES["for"][name]
        else:
            assert rule["for"] == committed[name]["for"], name
    assert "[6s]" in str(fast["GPUXidResetRequired"]["expr"])


def test_writing_demo_rules_leaves_alerts_untouched(tmp_path: Path) -> None:
    before = {p.name: p.read_text() for p in ALERTS_DIR.glob("*.yaml")}
    paths = write_demo_rules(tmp_path)
    assert {p.parent for p in paths} == {tmp_path}
    assert {p.name: p.read_text() for p in ALERTS_DIR.glob("*.yaml")} == before


def test_prometheus_config_labels_each_exporter_with_its_node(tmp_path: Path) -> None:
    doc = prometheus_config(
        [ScrapeTarget("127.0.0.1:1", "demo-node-0"), ScrapeTarget("127.0.0.1:2", "gpu-host")],
        "127.0.0.1:3",
        "127.0.0.1:4",
        [tmp_path / "a.rules.yaml"],
    )
    assert doc["global"]["evaluation_interval"] == "1s"
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert [c["labels"]["node"] for c in jobs[EXPORTER_JOB]["static_configs"]] == ["demo-node-0", "gpu-host"]
    # the exporter-health alerts select job=~"gpupulse.*": the controller's job must not match
    assert not any(name.startswith("gpupulse") for name in jobs if name != EXPORTER_JOB)


def test_alertmanager_routes_only_actionable_alerts_to_the_controller(tmp_path: Path) -> None:
    doc = alertmanager_config("http://127.0.0.1:5/api/v1/alerts", tmp_path / "token")
    route = doc["route"]
    assert (route["group_wait"], route["group_interval"]) == ("1s", "2s")
    (sub,) = route["routes"]
    assert sub["matchers"] == ['fault_class=~".+"', 'severity=~"critical|warning"']
    receiver = next(r for r in doc["receivers"] if r["name"] == sub["receiver"])
    (hook,) = receiver["webhook_configs"]
    assert hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["credentials_file"] == str(tmp_path / "token")


def test_demo_signatures_keep_shipped_rungs_and_load_in_the_controller(tmp_path: Path) -> None:
    sigs = {s["name"]: s for s in demo_signatures()}
    assert set(sigs) == set(DEMO_LADDERS)
    assert sigs["xid-reset-gpu"]["ladder"]["rungs"] == ["migrate", "page"]
    assert sigs["xid-restart-app"]["ladder"]["attempts"]["restart"] == 3
    write_demo_signatures(tmp_path)
    library = load_library((tmp_path,))
    leak = library.get("gpu-memory-leak")
    assert leak is not None
    assert leak.ladder.verify_window_seconds == 10 and leak.ladder.rungs == ("restart", "migrate", "page")
    # the gang ladder acts in the demo: the job is restarted once, with the demo's timers, then pages
    # (its migrate needs a suspect node that comes back, which TrainingJobHung never names)
    hung = library.get("training-job-hung")
    assert hung is not None and hung.ladder.rungs == ("restart", "migrate", "page")
    assert (hung.ladder.verify_window_seconds, hung.ladder.cooldown_seconds) == (10, 15)


@pytest.mark.integration
@pytest.mark.parametrize("line_name", LINES)
def test_generated_files_pass_promtool_and_amtool(tmp_path: Path, line_name: str) -> None:
    tools = line(line_name)
    rules = write_demo_rules(tmp_path / "rules")
    token = tmp_path / "token"
    token.write_text("t\n")
    prom = write_yaml(
        tmp_path / "prometheus.yml",
        prometheus_config([ScrapeTarget("127.0.0.1:1", "n")], "127.0.0.1:2", "127.0.0.1:3", rules),
    )
    am = write_yaml(tmp_path / "alertmanager.yml", alertmanager_config("http://127.0.0.1:2/x", token))
    for argv in (
        [str(tools.promtool), "check", "config", str(prom)],
        [str(tools.amtool), "check-config", str(am)],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
