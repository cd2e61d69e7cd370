"""Cut a release: the OCI image and the Helm chart, tagged with one version and pushed to one registry.

    scripts/release                                   build and package; print what would be pushed
    scripts/release --push                            also push both to ghcr.io/gpupulse
    scripts/release --registry HOST[:PORT]/NAMESPACE --push [--plain-http]

The image is scripts/build-image's (Debian packages, the locked wheels), tagged
`<registry>/gpupulse:<version>`; the chart is helm/gpupulse packaged with its default image pointing
at that same reference, pushed as `oci://<registry>/charts/gpupulse:<chart version>`. The version is
pyproject's, which must equal the chart's appVersion (a release of a chart whose default image was
never built is the mistake this refuses). Registry credentials are the tools' own: `buildah login`
and a Helm registry login (`~/.config/helm/registry/config.json`) beforehand.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "gpupulse"
DEFAULT_REGISTRY = "ghcr.io/gpupulse"
IMAGE_NAME = "gpupulse"
# HOST[:PORT]/NAMESPACE[/...]: what both `buildah push docker://` and `helm push oci://` accept
REGISTRY_RE = re.compile(r"^[a-z0-9.-]+(:[0-9]{1,5})?(/[a-z0-9._-]+)+$")


class ReleaseError(Exception):
    """The release cannot go ahead; the message says why and what to do."""


@dataclass(frozen=True)
class Plan:
    """What one release builds and where it goes."""

    version: str
    chart_version: str
    registry: str

    @property
    def host(self) -> str:
        return self.registry.split("/", 1)[0]

    @property
    def namespace(self) -> str:
        return self.registry.split("/", 1)[1]

    @property
    def image(self) -> str:
        return f"{self.registry}/{IMAGE_NAME}:{self.version}"

    @property
    def chart_remote(self) -> str:
        return f"oci://{self.registry}/charts"

    @property
    def chart_ref(self) -> str:
        return f"{self.chart_remote}/gpupulse:{self.chart_version}"


def plan(registry: str, root: Path = ROOT) -> Plan:
    """The versions and references of a release from this tree, or why there can be none."""
    if not REGISTRY_RE.match(registry):
        raise ReleaseError(f"--registry {registry!r} is not HOST[:PORT]/NAMESPACE (e.g. ghcr.io/gpupulse)")
    version = str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])
    chart = yaml.safe_load((root / "helm" / "gpupulse" / "Chart.yaml").read_text())
    app_version, chart_version = str(chart["appVersion"]), str(chart["version"])
    if app_version != version:
        raise ReleaseError(
            f"pyproject.toml says version {version} but helm/gpupulse/Chart.yaml says appVersion "
            f"{app_version}: the chart's default image would not be the one built; make them equal"
        )
    return Plan(version=version, chart_version=chart_version, registry=registry)


def staged_chart(p: Plan, into: Path) -> Path:
    """A copy of the chart whose default image is the release's (registry, repository; tag = appVersion)."""
    staged = into / "gpupulse"
    shutil.copytree(CHART, staged, ignore=shutil.ignore_patterns("ci"))
    values_path = staged / "values.yaml"
    text = values_path.read_text()
    # edit the two lines in place: values.yaml's comments are the chart's documentation
    text, n_registry = re.subn(r"(?m)^(image:\n(?:  .*\n)*?  registry: ).*$", rf"\g<1>{p.host}", text)
    text, n_repo = re.subn(
        r"(?m)^(image:\n(?:  .*\n)*?  repository: ).*$", rf"\g<1>{p.namespace}/{IMAGE_NAME}", text
    )
    if n_registry != 1 or n_repo != 1:
        raise ReleaseError("helm/gpupulse/values.yaml has no image.registry / image.repository to set")
    values_path.write_text(text)
    image = yaml.safe_load(text)["image"]
    assert f"{image['registry']}/{image['repository']}:{p.version}" == p.image
    return staged


def _run(argv: list[str], what: str, timeout_seconds: float) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_seconds, check=False)
    except FileNotFoundError as exc:
        raise ReleaseError(f"{what}: {argv[0]} is not installed (scripts/setup installs it)") from exc
    except subprocess.TimeoutExpired as exc:
        raise ReleaseError(f"{what}: no answer in {timeout_seconds:.0f} s") from exc
    if done.returncode != 0:
        raise ReleaseError(f"{what} failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout


def build_image(p: Plan) -> None:
    """Build (or reuse) the image with scripts/build-image and tag it with the release's reference."""
    out = _run([str(ROOT / "scripts" / "build-image")], "scripts/build-image", 1800)
    _run([*_buildah(), "tag", out.strip().splitlines()[-1], p.image], "buildah tag", 120)


def _buildah() -> list[str]:
    image_dir = ROOT / ".work" / "image"
    return ["buildah", "--root", str(image_dir / "storage"), "--runroot", str(image_dir / "run"),
            "--storage-driver", "vfs"]  # fmt: skip


async def package_chart(p: Plan, out: Path) -> Path:
    """The chart archive, packaged by the Helm library (helm-sdkpy)."""
    import helm_sdkpy

    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpupulse-release-") as tmp:
        staged = staged_chart(p, Path(tmp))
        config = helm_sdkpy.Configuration()
        archive = await helm_sdkpy.Package(config).run(str(staged), dest_dir=str(out))
    return Path(archive)


async def push(p: Plan, archive: Path, plain_http: bool) -> None:
    """Push the image (buildah) and the chart (Helm) to the registry."""
    import helm_sdkpy

    tls = ["--tls-verify=false"] if plain_http else []
    _run([*_buildah(), "push", "--quiet", *tls, p.image, f"docker://{p.image}"], "buildah push", 900)
    try:
        # the Helm library's registry client is made with the configuration: plain HTTP is set on both
        config = helm_sdkpy.Configuration(plain_http=plain_http)
        await helm_sdkpy.Push(config).run(str(archive), p.chart_remote, plain_http=plain_http)
    except helm_sdkpy.HelmError as exc:
        raise ReleaseError(f"helm push to {p.chart_remote} failed: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/release", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--registry", default=DEFAULT_REGISTRY, help="HOST[:PORT]/NAMESPACE (default: %(default)s)"
    )
    parser.add_argument(
        "--push", action="store_true", help="Push the image and the chart (default: build only)."
    )
    parser.add_argument("--plain-http", action="store_true", help="The registry speaks HTTP (a local one).")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="Where the chart archive goes.")
    parser.add_argument("--skip-image", action="store_true", help="Package the chart only.")
    args = parser.parse_args(argv)
    try:
        p = plan(args.registry)
        if not args.skip_image:
            build_image(p)
            print(f"image  {p.image}")
        archive = asyncio.run(package_chart(p, args.out))
        print(f"chart  {archive} -> {p.chart_ref}")
        if args.push:
            if args.skip_image:
                raise ReleaseError("--push needs the image: drop --skip-image")
            asyncio.run(push(p, archive, args.plain_http))
            print(f"pushed {p.image} and {p.chart_ref}")
        else:
            print("not pushed (give --push)")
    except ReleaseError as exc:
        print(f"scripts/release: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
