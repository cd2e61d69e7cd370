"""The shipped rules evaluated on a replay's scrapes by Prometheus's own rule engine (`promtool test
rules`), and every firing episode read back.

Why promtool: a Prometheus fed a backfilled block does not evaluate alerting rules over the past, and
`promtool tsdb create-blocks-from rules` evaluates recording rules only. `promtool test rules` runs
the rule manager of the same Prometheus (`for:`, `keep_firing_for`, ALERTS, staleness) over input
series at every evaluation interval; the scrapes are written as input series, absent scrapes as
staleness markers (Prometheus marks every series of a failed scrape stale, and a series that a good
scrape no longer has), so `for:` clocks see what a server would have stored.

The firings are read with one query per hour of the replay: per ALERTS{alertstate="firing"} series,
the evaluations at which it was firing and was not one evaluation before, i.e. episodes begun; promtool
prints each result as the difference from an expected empty one, which is parsed back.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.benign.replay import JOB, PORT, Scrapes

IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def rule_files(root: Path) -> list[Path]:
    """The generated rule files (scripts/generate.py writes them to alerts/*.rules.yaml)."""
    return sorted((root / "alerts").glob("*.rules.yaml"))


def wanted_names(paths: Iterable[Path]) -> frozenset[str]:
    """Every identifier of every rule expression: a superset of the series names the rules read, so
    dropping the other series of a scrape changes no result (no rule selects by __name__ regex)."""
    names: set[str] = {"up"}
    for path in paths:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                names.update(IDENT.findall(str(rule["expr"])))
    return frozenset(names)


def _values(column: Sequence[float | None]) -> str:
    """promtool's notation: `vxn` for n+1 equal values, `stale` at the first missing scrape after a
    present one, `_` (`_xn`) for the further missing ones."""
    out: list[str] = []
    i, n = 0, len(column)
    while i < n:
        v = column[i]
        if v is None:
            j = i
            while j + 1 < n and column[j + 1] is None:
                j += 1
            gone = i > 0 and column[i - 1] is not None
            count = j - i + (0 if gone else 1)
            if gone:
                out.append("stale")
            if count:
                out.append(f"_x{count}" if count > 1 else "_")
            i = j + 1
            continue
        j = i
        while j + 1 < n and column[j + 1] == v:
            j += 1
        out.append(f"{v:.10g}x{j - i}" if j > i else f"{v:.10g}")
        i = j + 1
    return " ".join(out)


def input_series(scrapes: Sequence[Scrapes]) -> list[dict[str, str]]:
    """Every node's series with the target labels a scrape config gives (job, instance, node)."""
    out = []
    for s in scrapes:
        target = f'job="{JOB}",instance="{s.node}:{PORT}",node="{s.node}"'
        out.append({"series": f"up{{{target}}}", "values": _values([float(u) for u in s.up])})
        for key, column in s.series.items():
            brace = key.find("{")
            name, labels = (key, "") if brace < 0 else (key[:brace], key[brace + 1 : -1])
            # a scrape that failed stores no sample and marks the series stale (None here too)
            kept = [v if s.up[i] else None for i, v in enumerate(column)]
            joined = f"{target},{labels}" if labels else target
            out.append({"series": f"{name}{{{joined}}}", "values": _values(kept)})
    return out


@dataclass(frozen=True)
class Firing:
    """One ALERTS series' firing episodes over the replay."""

    labels: Mapping[str, str]
    episodes: int


# one failed promql_expr_test as promtool prints it: the expression (Go-quoted), the time, and
# what it got (`{labels} value, {labels} value`)
_BLOCK = re.compile(r'^\s*expr: ("(?:[^"\\]|\\.)*"), time: ([^,\n]+),\s*\n\s*exp: .*\n\s*got: (.*)$', re.M)
_SAMPLE = re.compile(r"\{([^{}]*)\} ([0-9.eE+-]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Sample = tuple[dict[str, str], float]


def parse_results(output: str) -> dict[tuple[str, str], list[Sample]]:
    """(expression, time as promtool prints it) -> the samples it got, for every failed test."""
    out: dict[tuple[str, str], list[Sample]] = {}
    for block in _BLOCK.finditer(output):
        expr = json.loads(block.group(1))
        got = [
            (dict(_LABEL.findall(m.group(1))), float(m.group(2))) for m in _SAMPLE.finditer(block.group(3))
        ]
        out.setdefault((expr, block.group(2).strip()), []).extend(got)
    return out


# What the rules made of the fleet, read at every window's end: a quiet replay is quiet because
# nothing fired, not because the rules never saw a pod or a rank
PROBES = {
    "allocated GPUs": "count(uuid_namespace_pod:gpu_allocation:share)",
    "training jobs": "count(training_job:gpu_training_ranks:count)",
    "GPUs with SM activity": "count(uuid:gpu_sm_activity:ratio)",
}


@dataclass(frozen=True)
class Evaluation:
    firings: list[Firing]
    probes: dict[str, list[tuple[int, float]]]  # probe -> (time, value) where it had a value

    def seen(self, probe: str) -> float:
        """The probe's largest value over the replay (0 where it never had one)."""
        return max((v for _, v in self.probes.get(probe, ())), default=0.0)


WINDOW_SECONDS = 3600


def _windows(end_seconds: float) -> list[tuple[int, int]]:
    """(end, length) of adjacent windows covering (0 - one interval, end]."""
    end = int(end_seconds)
    out = [(t, WINDOW_SECONDS) for t in range(WINDOW_SECONDS, end + 1, WINDOW_SECONDS)]
    last = out[-1][0] if out else 0
    if last < end:
        out.append((end, end - last))
    out[0] = (out[0][0], out[0][1] + WINDOW_SECONDS)  # the first reaches back past t=0: nothing there
    return out


def evaluate(
    promtool: Path,
    rules: Sequence[Path],
    scrapes: Sequence[Scrapes],
    interval_seconds: float,
    end_seconds: float,
    workdir: Path,
    timeout_seconds: float = 3600.0,
) -> Evaluation:
    """Run the rules over the scrapes at every `interval_seconds`; the firing episodes per series."""
    every = f"{interval_seconds:g}s"
    firing = 'ALERTS{alertstate="firing"}'
    # an evaluation where the series fires and did not one interval before: one episode begins
    starts = f"({firing} unless {firing} offset {every})"
    windows = _windows(end_seconds)
    episodes = {t: f"sum_over_time({starts}[{length}s:{every}])" for t, length in windows}
    doc = {
        "rule_files": [str(p.resolve()) for p in rules],
        "evaluation_interval": every,
        "tests": [
            {
                "name": "benign fleet",
                "interval": every,
                "input_series": input_series(scrapes),
                # one window per hour: promtool's query engine refuses a whole replay's subquery
                # ("too many samples"); adjacent left-open windows (t-1h, t] count each episode once
                "promql_expr_test": [
                    *({"expr": e, "eval_time": f"{t}s", "exp_samples": []} for t, e in episodes.items()),
                    *(
                        {"expr": e, "eval_time": f"{t}s", "exp_samples": []}
                        for e in PROBES.values()
                        for t, _ in windows
                    ),
                ],
            }
        ],
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "benign.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
    result = subprocess.run(
        [str(promtool), "test", "rules", path.name],
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        cwd=workdir,
        check=False,
    )
    text = result.stdout + result.stderr
    if "no file match" in text:  # promtool only warns about a rule file it cannot find
        raise RuntimeError(f"promtool found no rule file:\n{text[-2000:]}")
    if result.returncode == 0:
        return Evaluation([], {})  # every expected empty result held: nothing fired, nothing seen
    if "got:" not in text:
        raise RuntimeError(f"promtool test rules failed without a result:\n{text[-4000:]}")
    results = parse_results(text)
    by_time = {_promtool_time(t): t for t, _ in windows}
    firings, probes = [], {}
    for (expr, _), samples in results.items():
        if expr in episodes.values():
            firings += [Firing(labels, round(v)) for labels, v in samples]
    for name, expr in PROBES.items():
        probes[name] = [
            (t, sum(v for _, v in results[(expr, shown)]))
            for shown, t in by_time.items()
            if (expr, shown) in results
        ]
    return Evaluation(firings, probes)


def _promtool_time(seconds: int) -> str:
    """An eval time as promtool prints it (Go's model.Duration: 1h, 1h30m, 45s; 0s)."""
    out = ""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or "0s"
