"""The README's compatibility table names what the tests really run: every pin of
scripts/neighbours.pins at its release version, the Debian line's versions, and the chart's
kubeVersion."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from demo.neighbours import pins

ROOT = Path(__file__).resolve().parents[1]
SECTION = (ROOT / "README.md").read_text().split("### Compatibility", 1)[1].split("\n## ", 1)[0]


def _release(module: str, version: str) -> str:
    """The release a module version is (Prometheus tags its Go module v0.3MM.P for 3.MM.P)."""
    if module == "github.com/prometheus/prometheus":
        _, minor, patch = version.removeprefix("v").split(".")
        return f"3.{int(minor) - 300}.{patch}"
    return version.removeprefix("v")


@pytest.mark.parametrize("name", sorted(pins()))
def test_every_pinned_neighbour_is_in_the_table_at_its_version(name: str) -> None:
    pin = pins()[name]
    assert _release(pin.module, pin.version) in SECTION, (name, pin.version)


def test_the_charts_kube_version_is_the_one_named() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "gpupulse" / "Chart.yaml").read_text())
    assert f"`{chart['kubeVersion']}`" in SECTION


@pytest.mark.parametrize(("binary", "named"), [("prometheus", "2.42"), ("prometheus-alertmanager", "0.25")])
def test_the_debian_line_is_the_version_named(binary: str, named: str) -> None:
    path = shutil.which(binary)
    assert path is not None, f"{binary} is missing (scripts/setup installs Debian's)"
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    version = re.search(r"version (\d+\.\d+)", out.stdout + out.stderr)
    assert version is not None and version.group(1) == named
    assert f"Debian's {named}" in SECTION


def test_the_uninstall_notes_name_every_crd_the_chart_leaves_behind() -> None:
    text = (ROOT / "helm" / "gpupulse" / "README.md").read_text().split("## Uninstall", 1)[1]
    for path in (ROOT / "helm" / "gpupulse" / "crds").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                assert doc["metadata"]["name"] in text.split("## ", 1)[0]
