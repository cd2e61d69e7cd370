"""Two releases of the chart in one namespace: each controller campaigns on a Lease of its own and
keeps its incidents under an instance of its own (issue 23), so neither leads nor reads for the other."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from tests.fakes.helm_api import FakeHelmAPI
from tests.helm.installs import CHART, JSON

NS = "gpupulse"


async def _install_both(api: FakeHelmAPI, tls_dir: Path, values: JSON, releases: list[str]) -> None:
    import helm_sdkpy

    await api.start(tls_dir)
    try:
        kubeconfig = api.write_kubeconfig(tls_dir / "kubeconfig", NS)
        for release in releases:
            config = helm_sdkpy.Configuration(namespace=NS, kubeconfig=str(kubeconfig))
            await helm_sdkpy.Install(config).run(
                release, str(CHART), values=values, wait=False, timeout=30, disable_openapi_validation=True
            )
    finally:
        await api.stop()


def _flag(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


def test_two_releases_in_one_namespace_pass_their_own_lease_and_instance(tmp_path: Path) -> None:
    pytest.importorskip("helm_sdkpy")
    values = yaml.safe_load((CHART / "ci" / "cluster-values.yaml").read_text())
    api = FakeHelmAPI(namespaces={NS})
    asyncio.run(_install_both(api, tmp_path, values, ["alpha", "beta"]))
    sets = [o for o in api.chart_objects() if o["kind"] == "StatefulSet"]
    flags = {
        s["metadata"]["name"]: (
            _flag(args := s["spec"]["template"]["spec"]["containers"][0]["args"], "kube.lease-name"),
            _flag(args, "kube.instance"),
        )
        for s in sets
    }
    assert flags == {
        "alpha-gpupulse-controller": ("alpha-gpupulse-controller-leader", "alpha-gpupulse"),
        "beta-gpupulse-controller": ("beta-gpupulse-controller-leader", "beta-gpupulse"),
    }


def test_a_sqlite_ledger_release_names_its_lease_and_keeps_no_instance(tmp_path: Path) -> None:
    """Without cluster mode the incidents are in the release's own volume: only the Lease is named."""
    pytest.importorskip("helm_sdkpy")
    values = yaml.safe_load((CHART / "ci" / "ha-values.yaml").read_text())
    api = FakeHelmAPI(namespaces={NS})
    asyncio.run(_install_both(api, tmp_path, values, ["alpha"]))
    (deploy,) = [
        o for o in api.chart_objects() if o["kind"] == "Deployment" and "controller" in o["metadata"]["name"]
    ]
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _flag(args, "kube.lease-name") == "alpha-gpupulse-controller-leader"
    assert _flag(args, "kube.instance") is None
