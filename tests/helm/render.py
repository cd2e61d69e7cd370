"""`python -m tests.helm.render [-f VALUES]... [-n NAMESPACE] [--release NAME]`: the chart's manifest, as
`helm template` prints it, where no helm binary is installed: the real Helm library (helm-sdkpy, which
scripts/setup installs) installs the chart into the in-process API server the chart tests use
(tests/fakes/helm_api.py), and the release's manifest is printed. docs/helm.md says when to use it."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml

from gpupulse.cliargs import Parser
from tests.fakes.helm_api import FakeHelmAPI
from tests.helm.installs import RELEASE, merge


def render(values: dict[str, object], namespace: str, release: str) -> str:
    """The manifest Helm renders for these values (Helm's schema checks and `fail`s included)."""
    from tests.helm.installs import install

    with tempfile.TemporaryDirectory(prefix="gpupulse-render-") as tls_dir:
        api = FakeHelmAPI(namespaces={namespace})
        result = asyncio.run(install(api, Path(tls_dir), namespace, values, release))
    return str(result["manifest"])


def main(argv: Sequence[str] | None = None) -> int:
    p: argparse.ArgumentParser = Parser(
        prog="python -m tests.helm.render", description="Print the chart's manifest without a helm binary."
    )
    p.add_argument(
        "-f", "--values", action="append", default=[], metavar="FILE", help="values file (repeatable)"
    )
    p.add_argument("-n", "--namespace", default="default", help="release namespace (default: default)")
    p.add_argument("--release", default=RELEASE, help=f"release name (default: {RELEASE})")
    args = p.parse_args(argv)
    try:
        import helm_sdkpy  # noqa: F401
    except ImportError:
        print(f"{p.prog}: error: helm-sdkpy is not installed (scripts/setup installs it)", file=sys.stderr)
        return 1
    values: dict[str, object] = {}
    for name in args.values:
        try:
            values = merge(values, yaml.safe_load(Path(name).read_text()) or {})
        except (OSError, yaml.YAMLError) as exc:
            print(f"{p.prog}: error: {name}: {exc}", file=sys.stderr)
            return 2
    try:
        sys.stdout.write(render(values, args.namespace, args.release))
    except Exception as exc:  # Helm's own refusal (a schema error, a `fail`): one line, as helm says it
        print(f"{p.prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
