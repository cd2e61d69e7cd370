"""Count the series one exporter serves, by family, from a real /metrics of the simulated node.

    .venv/bin/python -m bench.proofs.series --scenario demo --scenario large

Prints, per scenario: GPUs, total series, series per GPU (those with a `uuid` label), per-node series,
and the families with the most series. Feeds docs/scale.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

from bench.proofs.harness import REPO, ProofError, free_port, http_status, wait_until

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s")
_ENTRY = "import sys; from exporter.cli import main; sys.exit(main())"
_UUID = re.compile(r'(?:^|[{,])uuid="([^"]*)"')


@dataclass
class SeriesCount:
    """Series of one /metrics page."""

    scenario: str
    total: int = 0
    gpus: int = 0
    per_gpu_series: int = 0  # carrying a uuid label
    by_family: Counter[str] = field(default_factory=Counter)


def _family(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def count(text: str, scenario: str) -> SeriesCount:
    """Count every sample line of an exposition page."""
    out = SeriesCount(scenario)
    uuids: set[str] = set()
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        out.total += 1
        out.by_family[_family(m.group(1))] += 1
        u = _UUID.search(m.group(2) or "")
        if u and u.group(1):
            out.per_gpu_series += 1
            uuids.update(x for x in u.group(1).split(",") if x)
    out.gpus = len(uuids)
    return out


def capture(scenario: str, warmup_seconds: float = 3.0) -> str:
    """Run `gpupulse-exporter --simulate <scenario>` on a free port and return one /metrics page."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _ENTRY, "--simulate", scenario, f"--web.listen-address=127.0.0.1:{port}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: http_status(url, 2.0) == 200, 30, f"exporter --simulate {scenario}")
        time.sleep(warmup_seconds)  # a few sampling cycles, so every collector has published
        with urllib.request.urlopen(url, timeout=10) as r:
            return str(r.read().decode())
    finally:
        proc.terminate()
        proc.wait(10)


def scrape(scenario: str) -> SeriesCount:
    """Count one scrape of the simulated exporter."""
    return count(capture(scenario), scenario)


def main() -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", action="append", default=[])
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    for scenario in args.scenario or ["demo", "large"]:
        try:
            c = scrape(scenario)
        except ProofError as e:
            print(f"{scenario}: {e}", file=sys.stderr)
            return 1
        per_gpu = c.per_gpu_series / c.gpus if c.gpus else 0.0
        print(f"\nscenario {scenario}: {c.gpus} GPUs, {c.total} series")
        print(f"  series with a uuid label: {c.per_gpu_series} ({per_gpu:.1f} per GPU)")
        print(f"  series without (per node): {c.total - c.per_gpu_series}")
        print(f"  families: {len(c.by_family)}; largest:")
        for fam, n in c.by_family.most_common(args.top):
            print(f"    {fam:<48} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
