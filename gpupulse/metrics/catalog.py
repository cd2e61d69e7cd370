"""Every metric gpupulse exports, the exporter's and the controller's, gathered by plain imports.

`python -m gpupulse.metrics.catalog --markdown > docs/metrics.md` regenerates the reference page;
without arguments it lists naming problems (exit 1 when there are any).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpupulse.metrics.attribution import ATTRIBUTION_METRICS
from gpupulse.metrics.controller import CONTROLLER_METRICS
from gpupulse.metrics.engines import ENGINE_METRICS
from gpupulse.metrics.exporter_self import SELF_METRICS
from gpupulse.metrics.gpu import GPU_METRICS
from gpupulse.metrics.pagecache import PAGECACHE_METRICS
from gpupulse.metrics.progress import PROGRESS_METRICS
from gpupulse.metrics.spec import MetricSpec, validate

# The NVML collectors' families and the exporter's own: every simulated scenario exports them.
CORE_SPECS: tuple[MetricSpec, ...] = GPU_METRICS + SELF_METRICS
EXPORTER_SPECS: tuple[MetricSpec, ...] = (
    CORE_SPECS + ENGINE_METRICS + ATTRIBUTION_METRICS + PAGECACHE_METRICS + PROGRESS_METRICS
)
CONTROLLER_SPECS: tuple[MetricSpec, ...] = CONTROLLER_METRICS
ALL_SPECS: tuple[MetricSpec, ...] = EXPORTER_SPECS + CONTROLLER_SPECS

_GENERATOR = "python -m gpupulse.metrics.catalog --markdown > docs/metrics.md"


def _heading(collector: str) -> str:
    if collector == "controller":
        return "## Controller (`python -m remediation`)"
    return f"## Collector `{collector}`"


def markdown(specs: Sequence[MetricSpec]) -> str:
    """The metric reference page (docs/metrics.md)."""
    lines = [
        "# Metrics reference",
        "",
        f"Generated from `gpupulse/metrics/` by `{_GENERATOR}`;",
        "a test fails when this page drifts from the catalog. Every per-GPU series carries `uuid` and `gpu`",
        "(the NVML index); the `node` label comes from the scrape configuration.",
        "",
    ]
    by_collector: dict[str, list[MetricSpec]] = {}
    for spec in specs:
        by_collector.setdefault(spec.collector, []).append(spec)
    for collector, group in by_collector.items():
        lines += [
            _heading(collector),
            "",
            "| name | type | unit | labels | stability | help |",
            "|---|---|---|---|---|---|",
        ]
        for spec in group:
            labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
            help_text = spec.help.replace("|", "\\|")
            lines.append(
                f"| `{spec.name}` | {spec.type} | {spec.unit or '-'} | {labels} | {spec.stability} "
                f"| {help_text} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the catalog as markdown, or list naming problems."""
    parser = argparse.ArgumentParser(prog="python -m gpupulse.metrics.catalog")
    parser.add_argument("--markdown", action="store_true", help="print docs/metrics.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown(ALL_SPECS))
        return 0
    problems = validate(ALL_SPECS)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
