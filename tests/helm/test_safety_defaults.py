"""One source for the safety budgets: the chart's defaults are the controller's own (scripts/generate
writes values.yaml's controller.safety from remediation/settings.py), so an install of the chart and a
controller started without flags hold the same budgets."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from remediation.cli import build_parser, settings_from_flags
from remediation.settings import BudgetSettings

CHART = Path(__file__).resolve().parents[2] / "helm" / "gpupulse"


def _flags_the_chart_passes(safety: dict[str, object]) -> list[str]:
    """The --safety.* flags of the controller Deployment, filled with these values."""
    text = (CHART / "templates" / "controller-deployment.yaml").read_text()
    flags = re.findall(r"- (--safety\.[a-z-]+)=\{\{ \.Values\.controller\.safety\.(\w+) \}\}", text)
    assert len(flags) == len(safety), (flags, safety)
    return [f"{flag}={safety[key]}" for flag, key in flags]


def test_the_chart_and_the_binary_default_to_the_same_budgets() -> None:
    safety = yaml.safe_load((CHART / "values.yaml").read_text())["controller"]["safety"]
    args = build_parser().parse_args(["serve", "--insecure-no-auth", *_flags_the_chart_passes(safety)])
    assert settings_from_flags(args, {}).engine.budgets == BudgetSettings()


def test_notes_warn_when_pages_go_nowhere(tmp_path: Path) -> None:
    from tests.helm.installs import install_values

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    default = install_values(tmp_path / "a", "gpupulse", {})
    assert "WARNING: controller.pager.kind is none" in default.result["info"]["notes"]
    pager = {"kind": "webhook", "url": "https://pager.example/hook"}
    paging = install_values(tmp_path / "b", "gpupulse", {"controller": {"pager": pager}})
    assert "controller.pager.kind is none" not in paging.result["info"]["notes"]
    (deployment,) = paging.of_kind("Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pager=webhook" in args
