"""The chart lints clean with the real Helm library for every ci/ values file (that its copies of the
rules and dashboards are current is tests/test_generated.py's)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpupulse"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
ERROR_SEVERITY = 3  # helm's support.ErrorSev; 1 is info, 2 warning

helm_missing = importlib.util.find_spec("helm_sdkpy") is None
needs_helm = pytest.mark.skipif(helm_missing, reason="helm-sdkpy is not installed")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _chart_with_values(tmp_path: Path, values_file: Path) -> Path:
    """A copy of the chart whose values.yaml is the defaults overlaid with one ci/ file.

    helm-sdkpy's lint takes no values argument, so this is how `helm lint -f FILE` is reproduced.
    """
    copy = tmp_path / "gpupulse"
    shutil.copytree(CHART, copy)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    extra = yaml.safe_load(values_file.read_text()) or {}
    (copy / "values.yaml").write_text(yaml.safe_dump(_merge(defaults, extra), sort_keys=False))
    return copy


def _lint(chart: Path) -> dict[str, Any]:
    import helm_sdkpy

    async def run() -> dict[str, Any]:
        result: dict[str, Any] = await helm_sdkpy.Lint(helm_sdkpy.Configuration()).run(str(chart))
        return result

    return asyncio.run(run())


def _errors(result: dict[str, Any]) -> list[str]:
    return [m["Path"] for m in (result.get("Messages") or []) if m["Severity"] >= ERROR_SEVERITY]


@needs_helm
@pytest.mark.parametrize("values_file", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_ci_values_lint_clean(values_file: Path, tmp_path: Path) -> None:
    result = _lint(_chart_with_values(tmp_path, values_file))
    assert result["TotalChartsLinted"] == 1
    assert _errors(result) == [], f"helm lint errors in {values_file.name}: {result}"


@needs_helm
def test_lint_catches_a_broken_template(tmp_path: Path) -> None:
    # Proves the lint above is not vacuous: a template error is reported at error severity.
    chart = _chart_with_values(tmp_path, CHART / "ci" / "default-values.yaml")
    (chart / "templates" / "broken.yaml").write_text("{{ if }}\n")
    assert "templates/" in "".join(_errors(_lint(chart)))


@needs_helm
def test_lint_rejects_values_against_schema(tmp_path: Path) -> None:
    bad = tmp_path / "bad-values.yaml"
    bad.write_text("controller:\n  replicas: 7\n")
    (tmp_path / "c").mkdir()
    result = _lint(_chart_with_values(tmp_path / "c", bad))
    assert _errors(result), "a replicas value outside the schema must fail lint"


@pytest.mark.parametrize("values_file", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_ci_values_match_schema(values_file: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    extra = yaml.safe_load(values_file.read_text()) or {}
    jsonschema.validate(_merge(defaults, extra), schema)


def test_schema_rejects_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_merge(defaults, {"exporter": {"prot": 1}}), schema)


def test_every_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    uncommented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("-"):
            continue
        if not re.match(r"^\s*[A-Za-z][\w.-]*:", line):
            continue
        indent = len(line) - len(line.lstrip())
        prev = lines[i - 1].strip() if i else ""
        if indent <= 2 and not prev.startswith("#"):
            uncommented.append(stripped)
    assert uncommented == [], f"values without a comment above them: {uncommented}"


def _cli_flags(*command: str) -> set[str]:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", *command, "--help"], capture_output=True, text=True, check=True
    )
    return set(re.findall(r"--[a-z][\w.-]*", out.stdout))


@pytest.mark.parametrize(
    ("template", "command"),
    [
        ("exporter-daemonset.yaml", ("exporter.cli",)),
        ("controller-deployment.yaml", ("remediation", "serve")),
    ],
)
def test_every_flag_the_chart_passes_exists(template: str, command: tuple[str, ...]) -> None:
    known = _cli_flags(*command)
    text = (CHART / "templates" / template).read_text()
    passed = set(re.findall(r"^\s*- (--[a-z][\w.-]*)", text, flags=re.MULTILINE))
    # `--no-collector.{{ . }}` is checked by its stem against the real collector flags
    passed = {flag.rstrip(".") for flag in passed}
    assert passed, "no flags found in the template"
    unknown = {
        flag for flag in passed if flag not in known and not any(k.startswith(flag + ".") for k in known)
    }
    assert unknown == set(), f"{template} passes flags its program does not have: {unknown}"
