"""scripts/release against a real OCI registry (CNCF distribution's `registry`, built from its Go module
by scripts/neighbours) on 127.0.0.1: the image and the chart are pushed under one version, and the
chart read back from the registry names that very image as its default. Bad registries and versions
that disagree are refused with a clear message."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from demo.neighbours import neighbour_binary
from tests.fakes.prometheus_process import free_port

ROOT = Path(__file__).resolve().parents[2]


def _release_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpupulse_release", ROOT / "scripts" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


release = _release_module()


def test_the_charts_default_image_is_what_a_default_release_pushes() -> None:
    values = yaml.safe_load((ROOT / "helm" / "gpupulse" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "helm" / "gpupulse" / "Chart.yaml").read_text())
    p = release.plan(release.DEFAULT_REGISTRY)
    assert p.image == f"{values['image']['registry']}/{values['image']['repository']}:{chart['appVersion']}"
    assert p.image in (ROOT / "README.md").read_text()  # the README names the image a release pushes


def test_a_chart_whose_app_version_is_not_the_packages_is_refused(tmp_path: Path) -> None:
    (tmp_path / "helm" / "gpupulse").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "gpupulse"\nversion = "0.3.0"\n')
    (tmp_path / "helm" / "gpupulse" / "Chart.yaml").write_text('version: 0.4.0\nappVersion: "0.2.0"\n')
    with pytest.raises(release.ReleaseError, match=r"appVersion 0\.2\.0"):
        release.plan("ghcr.io/gpupulse", root=tmp_path)


@pytest.mark.parametrize("registry", ["", "ghcr.io", "GHCR.io/x", "host:port/x", "a b/c", "oci://ghcr.io/x"])
def test_a_registry_that_is_not_host_and_namespace_is_refused_before_anything_is_built(registry: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "release.py"), "--registry", registry, "--push"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "is not HOST[:PORT]/NAMESPACE" in done.stderr and "Traceback" not in done.stderr


# --- against the real registry: builds (or reuses) the image


def _get(url: str, accept: str = "") -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body: bytes = resp.read()
        return body


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real registry on a free loopback port, its storage in a temp dir; stopped afterwards."""
    workdir = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(workdir / "data")}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    (workdir / "config.yml").write_text(yaml.safe_dump(config))
    log = (workdir / "registry.log").open("w")
    proc = subprocess.Popen(
        [str(neighbour_binary("registry")), "serve", str(workdir / "config.yml")], stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (workdir / "registry.log").read_text()[-2000:]
            try:
                _get(f"http://127.0.0.1:{port}/v2/")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the registry did not answer /v2/ in 30 s"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _tags(host: str, repository: str) -> list[str]:
    doc: dict[str, Any] = json.loads(_get(f"http://{host}/v2/{repository}/tags/list"))
    return list(doc.get("tags") or [])


@pytest.mark.image
@pytest.mark.timeout(1800)
def test_a_release_pushes_the_image_and_a_chart_that_names_it(registry: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "release"), "--registry", f"{registry}/acme", "--push", "--plain-http",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1700, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    p = release.plan(f"{registry}/acme")
    assert p.version in _tags(registry, "acme/gpupulse")
    assert p.chart_version in _tags(registry, "acme/charts/gpupulse")
    # the chart as the registry serves it: its one layer is the chart archive
    manifest = json.loads(
        _get(
            f"http://{registry}/v2/acme/charts/gpupulse/manifests/{p.chart_version}",
            "application/vnd.oci.image.manifest.v1+json",
        )
    )
    [layer] = [x for x in manifest["layers"] if x["mediaType"].endswith("helm.chart.content.v1.tar+gzip")]
    blob = _get(f"http://{registry}/v2/acme/charts/gpupulse/blobs/{layer['digest']}")
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        member = tar.extractfile("gpupulse/values.yaml")
        assert member is not None
        values = yaml.safe_load(member.read())
        chart = yaml.safe_load(tar.extractfile("gpupulse/Chart.yaml").read())  # type: ignore[union-attr]
    image = values["image"]
    assert f"{image['registry']}/{image['repository']}:{chart['appVersion']}" == p.image
    # and that image is in the registry, as an image (a config blob and layers), under that tag
    pushed = json.loads(
        _get(
            f"http://{registry}/v2/acme/gpupulse/manifests/{p.version}",
            "application/vnd.oci.image.manifest.v1+json,"
            " application/vnd.docker.distribution.manifest.v2+json",
        )
    )
    assert pushed["layers"] and pushed["config"]["digest"].startswith("sha256:")


@pytest.mark.image
@pytest.mark.timeout(1800)
def test_a_push_to_a_registry_that_does_not_answer_fails_clearly(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "release"), "--registry", f"127.0.0.1:{free_port()}/acme", "--push",
         "--plain-http", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1700, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "scripts/release: error: buildah push failed" in done.stderr
    assert "Traceback" not in done.stderr
