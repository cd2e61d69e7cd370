"""The chart installed with the real Helm library into the in-process API server (tests/fakes/helm_api.py):
what every tests/helm module asserts on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.helm_api import FakeHelmAPI

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpupulse"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "pulse"
JSON = dict[str, Any]


@dataclass
class Installed:
    """What one `helm install` left in its fake cluster."""

    values: JSON
    result: JSON
    objects: list[JSON]
    api: FakeHelmAPI

    def of_kind(self, kind: str) -> list[JSON]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> JSON:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
        return found[0]

    def named(self, kind: str, name: str, namespace: str | None = None) -> JSON | None:
        """The object of that kind and name (in the release namespace unless another is given)."""
        namespace = namespace or self.result["namespace"]
        return next(
            (
                o
                for o in self.of_kind(kind)
                if o["metadata"]["name"] == name and o["metadata"].get("namespace", namespace) == namespace
            ),
            None,
        )


def merge(base: JSON, extra: JSON) -> JSON:
    """Helm's values overlay: mappings merge, everything else replaces."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def effective_values(extra: JSON) -> JSON:
    """The chart's defaults overlaid with `extra`."""
    return merge(yaml.safe_load((CHART / "values.yaml").read_text()), extra)


async def install(
    api: FakeHelmAPI, tls_dir: Path, namespace: str, values: JSON, release: str = RELEASE
) -> JSON:
    """`helm install <release> helm/gpupulse -n <namespace>` with these values into `api`."""
    import helm_sdkpy

    await api.start(tls_dir)
    try:
        kubeconfig = api.write_kubeconfig(tls_dir / "kubeconfig", namespace)
        config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=str(kubeconfig))
        action = helm_sdkpy.Install(config)
        result: JSON = await action.run(
            release, str(CHART), values=values, wait=False, timeout=30, disable_openapi_validation=True
        )
        return result
    finally:
        await api.stop()


def install_values(tls_dir: Path, namespace: str, values: JSON) -> Installed:
    """Install with these values into a fresh fake cluster; the objects it created."""
    api = FakeHelmAPI(namespaces={namespace})
    result = asyncio.run(install(api, tls_dir, namespace, values))
    return Installed(effective_values(values), result, api.chart_objects(), api)


def ci_namespace(values_file: Path) -> str:
    return "ci-" + values_file.name.removesuffix("-values.yaml")


def watches_pods(exporter: dict[str, Any]) -> bool:
    """Whether the chart's exporter watches its node's pods (the chart's gpupulse.exporter.watchesPods)."""
    return bool(
        exporter["engines"]["discoverPods"]
        or exporter["trainingRanks"]["podWatch"]
        or exporter["trainingProgress"]["enabled"]
    )
