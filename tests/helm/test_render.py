"""`python -m tests.helm.render`, the chart rendered where no helm binary is installed (docs/helm.md):
the manifest of a values file, and Helm's own refusal of bad values as one line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helm.installs import CHART, ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("helm_sdkpy") is None, reason="helm-sdkpy is not installed"
)


def _render(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.helm.render", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_documented_command_prints_the_manifest() -> None:
    assert (
        "python -m tests.helm.render -f my-values.yaml -n gpupulse" in (ROOT / "docs" / "helm.md").read_text()
    )
    done = _render("-f", str(CHART / "ci" / "default-values.yaml"), "-n", "gpupulse", "--release", "gp")
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    kinds = {d["kind"] for d in objects}
    assert {"DaemonSet", "Deployment", "ClusterRole", "Service"} <= kinds
    assert all(d["metadata"]["name"].startswith("gp-") for d in objects if d["kind"] == "Deployment")
    assert {d["metadata"].get("namespace", "gpupulse") for d in objects} == {"gpupulse"}


def test_values_helm_refuses_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("controller:\n  scope:\n    namespaces: [Not_A_Name]\n")
    done = _render("-f", str(bad))
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("python -m tests.helm.render: error: ")
