"""Benign fleets: what the shipped alerts fire when nothing is broken, per 1,000 GPU-days (issue 40).

Each fleet (bench/benign/fleets/*.yaml, format in bench/benign/fleet.py) is played through the
exporter's own collectors and sampler on the simulated NVML in virtual time (bench/benign/replay.py),
one scrape every `--interval-seconds`; the shipped rules (the generated alerts/*.rules.yaml) are
evaluated on every scrape by promtool's rule engine, Prometheus 3.16 (bench/benign/evaluate.py); each
firing episode is then counted as a page, a warning or information (bench/benign/report.py).

    .venv/bin/python -m bench.benign_fleet                       # every fleet, 72 h, 60 s scrapes
    .venv/bin/python -m bench.benign_fleet --fleet serving-diurnal --hours 24 --nodes 2
    .venv/bin/python -m bench.benign_fleet --fleet mixed-fleet --hours 1 --eval-cost-copies 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.benign.evalcost import fleet_pages, measure
from bench.benign.evalcost import markdown as cost_table
from bench.benign.evaluate import PROBES, Firing, evaluate, rule_files, wanted_names
from bench.benign.fleet import Fleet, list_fleets, load_fleet
from bench.benign.replay import play
from bench.benign.report import Row, markdown, rows, totals
from bench.benign.timeline import HOUR, plan
from demo.neighbours import line

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Result:
    fleet: str
    nodes: int
    gpus: int
    hours: float
    gpu_days: float
    interval_seconds: float
    replay_seconds: float  # wall: the exporter's rounds
    evaluate_seconds: float  # wall: promtool
    firings: list[Firing]
    table: list[Row]
    seen: dict[str, float]  # each probe's largest value (bench/benign/evaluate.py PROBES)

    def totals(self) -> dict[str, float]:
        return totals(self.table, self.gpu_days)


def run_fleet(
    fleet: Fleet, interval_seconds: float, workdir: Path, root: Path = REPO, promtool: Path | None = None
) -> Result:
    """Replay one fleet and evaluate the rules on it (promtool: the pinned one unless given)."""
    rules = rule_files(root)
    end = fleet.hours * HOUR
    started = time.monotonic()
    scrapes = play(plan(fleet), end, interval_seconds, wanted_names(rules))
    replayed = time.monotonic()
    evaluation = evaluate(
        promtool or line().promtool, rules, scrapes, interval_seconds, end, workdir / fleet.name
    )
    done = time.monotonic()
    firings = evaluation.firings
    return Result(
        fleet.name,
        len(fleet.nodes),
        fleet.gpu_count,
        fleet.hours,
        fleet.gpu_days,
        interval_seconds,
        replayed - started,
        done - replayed,
        firings,
        rows(firings, fleet.gpu_days),
        {name: evaluation.seen(name) for name in PROBES},
    )


EVAL_COST_AT_SECONDS = 38 * HOUR  # day two, 14:00: every serving pod at its daytime load


def eval_cost(fleet: Fleet, copies: int, interval_seconds: int, root: Path = REPO) -> str:
    """The rule groups' evaluation cost on `copies` copies of the fleet's daytime pages, as a table."""
    rules = rule_files(root)
    plans = plan(fleet)
    at = min(EVAL_COST_AT_SECONDS, fleet.hours * HOUR)
    scrapes = play(plans, at, 60.0, wanted_names(rules))
    nodes, pages = fleet_pages(plans, scrapes, at, copies)
    costs = asyncio.run(measure(line().prometheus, rules, nodes, pages, interval_seconds))
    head = (
        f"{fleet.name} x {copies}: {len(nodes)} nodes, {pages.series:,} page series, scrape and "
        f"evaluation every {interval_seconds} s, Prometheus 3.16"
    )
    return head + "\n\n" + cost_table(costs, len(nodes))


def combined(results: list[Result]) -> str:
    """Every fleet's firings together, per 1,000 GPU-days of all of them."""
    gpu_days = sum(r.gpu_days for r in results)
    return markdown(rows([f for r in results for f in r.firings], gpu_days), gpu_days)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fleet", action="append", help=f"a fleet name or path (default: all: {list_fleets()})"
    )
    parser.add_argument("--hours", type=float, help="play only the first hours of each fleet")
    parser.add_argument("--nodes", type=int, help="play only the first nodes of each fleet")
    parser.add_argument("--interval-seconds", type=float, default=60.0, help="scrape and rule evaluation")
    parser.add_argument(
        "--promtool",
        type=Path,
        help="a promtool with the server's query limit (bench/benign/build-promtool; default: the pinned "
        "one, whose unit-test engine stops a query at 10,000 samples, too few for 72 h of 32 GPUs)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--eval-cost-copies",
        type=int,
        default=0,
        help="also measure the rule groups' evaluation cost on this many copies of the first fleet",
    )
    parser.add_argument("--eval-cost-interval-seconds", type=int, default=30)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="benign-") as tmp:
        for name in args.fleet or list_fleets():
            fleet = load_fleet(name)
            if args.hours is not None or args.nodes is not None:
                fleet = fleet.shortened(args.hours or fleet.hours, args.nodes)
            result = run_fleet(fleet, args.interval_seconds, Path(tmp), promtool=args.promtool)
            results.append(result)
            print(
                f"## {result.fleet}: {result.nodes} nodes, {result.gpus} GPUs, {result.hours:g} h "
                f"({result.gpu_days:g} GPU-days), scrape and evaluation every {result.interval_seconds:g} s; "
                f"replay {result.replay_seconds:.0f} s, promtool {result.evaluate_seconds:.0f} s\n"
            )
            print(markdown(result.table, result.gpu_days))
            seen = ", ".join(f"{name} {n:g}" for name, n in result.seen.items())
            print(f"the rules saw, at most at once: {seen}\n", flush=True)
    if len(results) > 1:
        print("## all fleets\n\n" + combined(results))
    if args.eval_cost_copies:
        first = load_fleet((args.fleet or list_fleets())[0])
        print(
            "## rule evaluation cost\n\n"
            + eval_cost(first, args.eval_cost_copies, args.eval_cost_interval_seconds)
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {**asdict(r), "firings": [asdict(f) for f in r.firings], "totals": r.totals()}
                    for r in results
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
