"""Training-job proof (docs/design/training.md): the four 2 x 8 PyTorchJob replays of
tests/alerts/test_training_replay.py at real speed with the SHIPPED rules (alerts/config.yaml's windows
and `for:`), Prometheus scraping and evaluating every 15 s as the chart's defaults, Alertmanager with
the chart's groupWait 10s / groupInterval 1m, and the real controller on the in-process API server.

    .venv/bin/python -m bench.proofs.training

All four jobs (8 exporters of 8 simulated H100s) run at once for the scenarios' 300 s plus start-up:
about 6 minutes. Prints one table: hang detection latency (target <= 2 min), straggler named latency
(<= 3 min), node-fault latency, alerts on the healthy job (0), job restarts per incident (1), pod deletes
per restart (16) and the cordon before the restart. Exits 0 when every check passes. Latencies are
measured from the fault's onset (the exporter's simulated clock) to the first firing sample of the
alert in Prometheus; on a shared machine they include its load (scrapes and evaluations run late).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bench.proofs.harness import print_table
from tests.alerts.training_rig import CASES, SHIPPED, Profile, Replay, fast_profile, running_replay

Check = tuple[str, str, bool | None]
SCENARIO_SECONDS = 300.0
TARGETS = {"TrainingJobHung": 120.0, "TrainingRankStraggler": 180.0, "TrainingJobNodeFault": 120.0}


async def _rows(replay: Replay) -> list[Check]:
    rows: list[Check] = []
    for case in replay.cases:
        quiet = await replay.quiet(case)
        label = "besides the expected alert" if case.expected else "alerts"
        rows.append((f"{case.name}: {label}", quiet.describe(), quiet.ok))
        if case.fault_at is None:
            deletes = replay.pod_deletes(case)
            rows.append((f"{case.name}: API writes on the job", str(len(deletes)), not deletes))
            continue
        onset = replay.onset(case)
        for name in sorted(case.expected):
            first = await replay.first_firing(case, name)
            latency = None if first is None else (first - onset) * replay.profile.speed
            target = TARGETS[name]
            shown = "never fired" if latency is None else f"{latency:.0f} s (target <= {target:.0f} s)"
            rows.append(
                (f"{case.name}: {name} after onset", shown, latency is not None and latency <= target)
            )
            if case.suspect and first is not None:
                labels = {k: v for s in await replay.firing_since(case, name) for k, v in s["metric"].items()}
                named = ", ".join(f"{k}={labels.get(k)}" for k in case.suspect)
                rows.append(
                    (
                        f"{case.name}: {name} names",
                        named,
                        all(labels.get(k) == v for k, v in case.suspect.items()),
                    )
                )
        actions = await replay.actions(case)
        restarts = [a for a in actions if a[0] in ("restart", "migrate") and a[1] == "success"]
        rows.append(
            (f"{case.name}: job restarts (ledger actions)", f"{len(restarts)} {actions}", len(restarts) == 1)
        )
        deletes = replay.pod_deletes(case)
        rows.append(
            (
                f"{case.name}: pod deletes per restart",
                str(len(deletes)),
                len(set(deletes)) == len(deletes) == 16,
            )
        )
        if case.cordon is not None:
            cordon, first_delete = replay.cordon_index(case.cordon), replay.first_delete_index(case)
            ok = cordon is not None and first_delete is not None and cordon < first_delete
            rows.append((f"{case.name}: {case.cordon} cordoned before the restart", str(ok), ok))
    evictions = [r.path for r in replay.api.requests if r.path.endswith("/eviction")]
    rows.append(("pod evictions (any case)", str(len(evictions)), not evictions))
    return rows


async def _run(tmp: Path, profile: Profile, settle_seconds: float) -> list[Check]:
    cases = tuple(CASES.values())
    async with running_replay(cases, profile, tmp) as replay:
        end = (
            max(e.started_unix for e in replay.exporters)
            + (SCENARIO_SECONDS + settle_seconds) / profile.speed
        )
        await asyncio.sleep(max(0.0, end - time.time()))  # the scenarios' time has to pass
        return await _rows(replay)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds watched past the scenarios' end")
    parser.add_argument(
        "--profile",
        choices=("shipped", "fast"),
        default="shipped",
        help="fast: the replay test's 5x profile (a check of this script, not the proof)",
    )
    args = parser.parse_args()
    profile = SHIPPED if args.profile == "shipped" else fast_profile()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpupulse-training-") as tmp:
        rows = asyncio.run(_run(Path(tmp), profile, args.settle))
    ok = print_table(
        f"training jobs, {profile.name} rules, {profile.interval_seconds:g} s scrape/evaluation, "
        f"scenarios at {profile.speed:g}x ({time.monotonic() - started:.0f} s wall; latencies in scenario s)",
        rows,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
