"""`python -m exporter.sim [SCENARIO ...]`: validate scenario files and summarise them."""

from __future__ import annotations

import argparse
import sys

from exporter.errors import ScenarioError
from exporter.sim.scenario import list_scenarios, load_scenario


def main(argv: list[str] | None = None) -> int:
    """Load each scenario (default: every shipped one); print a summary or the first error."""
    parser = argparse.ArgumentParser(prog="python -m exporter.sim", description=__doc__)
    parser.add_argument("scenarios", nargs="*", help="shipped names or paths (default: all shipped)")
    args = parser.parse_args(argv)
    status = 0
    for name in args.scenarios or list_scenarios():
        try:
            s = load_scenario(name)
        except ScenarioError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        models = ", ".join(sorted({g.model.key for g in s.gpus}))
        print(
            f"{s.name}: {len(s.gpus)} GPU(s) [{models}], {len(s.processes)} process(es), "
            f"{len(s.events)} XID event(s), {len(s.faults)} fault(s), {s.duration_seconds:g} s"
        )
    return status


if __name__ == "__main__":
    raise SystemExit(main())
