"""Fixtures: every ci/ values file installed once per session (tests/helm/installs.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from tests.helm.installs import CI_VALUES, Installed, ci_namespace, install_values


@pytest.fixture(scope="session")
def installs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Installed]:
    """Every ci/ values file installed once, each into its own fake cluster and namespace."""
    pytest.importorskip("helm_sdkpy")
    out: dict[str, Installed] = {}
    for values_file in CI_VALUES:
        values = yaml.safe_load(values_file.read_text()) or {}
        tls_dir = tmp_path_factory.mktemp(values_file.name.removesuffix("-values.yaml"))
        out[values_file.name] = install_values(tls_dir, ci_namespace(values_file), values)
    return out


@pytest.fixture(params=[p.name for p in CI_VALUES])
def inst(request: pytest.FixtureRequest, installs: dict[str, Installed]) -> Iterator[Installed]:
    yield installs[request.param]
