"""controller.lemon and controller.pools: the chart passes the binary's own defaults, a pool budget
reaches the controller's flags, and values the controller would refuse are refused by the schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from remediation.cli import build_parser, settings_from_flags
from remediation.settings import LemonSettings, PoolSettings
from tests.helm.installs import install_values

CHART = Path(__file__).resolve().parents[2] / "helm" / "gpupulse"


def _values() -> dict[str, object]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def _controller_args(tmp_path: Path, controller: dict[str, object]) -> list[str]:
    objects = install_values(tmp_path, "gpupulse", {"controller": controller}).objects
    [deploy] = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-controller")
    ]
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


def test_the_chart_and_the_binary_default_to_the_same_lemon_rule_and_no_pool_budget(tmp_path: Path) -> None:
    args = [a for a in _controller_args(tmp_path, {}) if re.match(r"--(lemon|pools)\.", a)]
    assert not any(a.startswith("--pools.") for a in args)
    parsed = build_parser().parse_args(["serve", "--insecure-no-auth", *args])
    engine = settings_from_flags(parsed, {}).engine
    assert engine.lemons == LemonSettings() and engine.pools == PoolSettings()


def test_a_pool_budget_and_a_lemon_rule_reach_the_controller(tmp_path: Path) -> None:
    controller = {
        "lemon": {"quarantines": 2, "window": "7d"},
        "pools": {"label": "cloud.google.com/gke-nodepool", "maxUnavailable": "10%"},
    }
    args = _controller_args(tmp_path, controller)
    assert {"--lemon.quarantines=2", "--lemon.window=7d", "--pools.max-unavailable=10%"} <= set(args)
    assert "--pools.label=cloud.google.com/gke-nodepool" in args
    ours = [a for a in args if re.match(r"--(lemon|pools)\.", a)]
    parsed = build_parser().parse_args(["serve", "--insecure-no-auth", *ours])
    engine = settings_from_flags(parsed, {}).engine
    assert (engine.lemons.quarantines, engine.pools.allowed_out(10)) == (2, 1)


@pytest.mark.parametrize(
    "controller",
    [
        {"pools": {"maxUnavailable": "ten"}},
        {"pools": {"maxUnavailable": "150%"}},
        {"lemon": {"quarantines": -1}},
        {"lemon": {"window": "a week"}},
        {"lemon": {"quarantine": 2}},
    ],
)
def test_the_schema_refuses_what_the_controller_would(controller: dict[str, object]) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = _values()
    ctl = dict(values["controller"])  # type: ignore[arg-type]
    for key, extra in controller.items():
        ctl[key] = {**ctl[key], **extra}  # type: ignore[dict-item]
    values["controller"] = ctl
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, schema)
