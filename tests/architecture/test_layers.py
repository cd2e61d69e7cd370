"""The layer contracts in pyproject.toml [tool.importlinter] hold, all of them, and they bite.

`lint-imports` (import-linter) runs as a subprocess on the real tree: it must keep every contract,
and the contracts must be exactly the ones listed here, so deleting or renaming one fails this test
until the list is changed on purpose. Then, on a copy of the tree, one forbidden import per contract
is planted and lint-imports must report that contract broken.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# Every contract by id. The in-service layer contracts of issue 15 (L1: exporter, L2: remediation)
# are added to pyproject.toml and here together.
EXPECTED_CONTRACTS = {
    "kernel",
    "services-independent",
    "services-below-rules",
    "dashboards-on-kernel",
    "alerts-on-kernel",
    "report-on-kernel",
    "remediation-layers",
    "remediation-decide-pure",
    "exporter-layers",
    "progress-own-pods",
}
# (contract id, module planted in the copy, the forbidden import it holds)
PLANTED = [
    ("kernel", "gpupulse/_planted.py", "import exporter.config"),
    ("kernel", "gpupulse/_planted.py", "import tests.fakes.clock"),  # tests is not a root package
    ("services-independent", "exporter/_planted.py", "import remediation.model"),
    ("services-independent", "remediation/_planted.py", "from exporter import nvml"),
    ("services-below-rules", "remediation/_planted.py", "import dashboards.grafana"),
    ("services-below-rules", "exporter/_planted.py", "import demo.cli"),
    ("dashboards-on-kernel", "dashboards/_planted.py", "import remediation.metrics"),
    ("alerts-on-kernel", "alerts/_planted.py", "import dashboards.grafana"),
    ("alerts-on-kernel", "alerts/rules/_planted.py", "from exporter import catalog"),
    ("report-on-kernel", "costreport/_planted.py", "import exporter.config"),
    ("kernel", "gpupulse/_planted.py", "import costreport.usage"),
    # a lower layer reaching up (the state machine into the engine), and the pure rules into a store
    ("remediation-layers", "remediation/transitions/_planted.py", "import remediation.engine"),
    ("remediation-layers", "remediation/decide/_planted.py", "import remediation.server"),
    ("remediation-decide-pure", "remediation/decide/_planted.py", "import remediation.ledger"),
    # exporter: a host reader above the collectors, two plug-ins that know each other, a collector
    # that drives the sampler, the simulated NVML built on the seam it replaces
    ("exporter-layers", "exporter/host/_planted.py", "import exporter.collectors.base"),
    ("exporter-layers", "exporter/engines/_planted.py", "from exporter.attribution import resolve"),
    ("exporter-layers", "exporter/collectors/_planted.py", "import exporter.sampler"),
    ("exporter-layers", "exporter/sim/_planted.py", "import exporter.nvml"),
    # the transports know nothing of the plug-ins that use them
    ("exporter-layers", "exporter/wire/_planted.py", "import exporter.engines.collector"),
    # progress is a plug-in like the others: it shares the text format with engines, not engines' code
    ("exporter-layers", "exporter/progress/_planted.py", "import exporter.engines.collector"),
    ("exporter-layers", "exporter/exposition/_planted.py", "import exporter.engines.vllm"),
    # progress back on attribution's pod metadata, or on the engines' pod watch
    ("progress-own-pods", "exporter/progress/_planted.py", "from exporter.attribution import podmeta"),
    ("progress-own-pods", "exporter/progress/_planted.py", "import exporter.engines.kube_pods"),
]


def _config() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return config


def _contracts() -> list[dict[str, object]]:
    contracts = _config()["contracts"]
    assert isinstance(contracts, list)
    return contracts


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.exists(), "lint-imports is missing: scripts/setup installs import-linter (dev deps)"
    # --no-cache: the copy and the real tree must each be read afresh
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_contracts_are_the_ones_we_keep() -> None:
    ids = [str(c.get("id", "")) for c in _contracts()]
    assert len(ids) == len(set(ids)), "two contracts share an id"
    assert set(ids) == EXPECTED_CONTRACTS


def test_lint_imports_keeps_every_contract_on_the_tree() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    kept = re.search(r"Contracts: (\d+) kept, (\d+) broken", done.stdout)
    assert kept, done.stdout[-2000:]
    assert (int(kept[1]), int(kept[2])) == (len(EXPECTED_CONTRACTS), 0)


def test_alerts_is_a_checked_package() -> None:
    assert (ROOT / "alerts" / "__init__.py").exists()
    assert "alerts" in _config()["root_packages"], 'add "alerts" to root_packages in pyproject.toml'
    sources = {m for c in _contracts() for m in c.get("source_modules", [])}  # type: ignore[attr-defined]
    assert "alerts" in sources, "uncomment the alerts-on-kernel contract in pyproject.toml"


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages and pyproject.toml, copied without caches or generated bulk."""
    dest = tmp_path_factory.mktemp("tree")
    skip = shutil.ignore_patterns("__pycache__", "*.json", "*.yaml", "*.prom", "*.md")
    for package in _config()["root_packages"]:  # type: ignore[attr-defined]
        shutil.copytree(ROOT / package, dest / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


@pytest.mark.parametrize(("contract", "module", "statement"), PLANTED)
def test_a_forbidden_import_breaks_its_contract(
    tree_copy: Path, contract: str, module: str, statement: str
) -> None:
    planted = tree_copy / module
    planted.write_text(f'"""A forbidden import planted by test_layers."""\n\n{statement}  # noqa: F401\n')
    try:
        done = _lint_imports(tree_copy)
    finally:
        planted.unlink()
    assert done.returncode != 0, done.stdout[-3000:]
    (name,) = [str(c["name"]) for c in _contracts() if c.get("id") == contract]
    broken = re.sub(r"\s+", " ", done.stdout)
    assert f"{name} BROKEN" in broken, done.stdout[-3000:]
    assert module.replace("/", ".").removesuffix(".py") in broken
