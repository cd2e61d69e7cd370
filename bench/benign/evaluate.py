"""The shipped rules evaluated on a replay's scrapes by Prometheus's own rule engine (`promtool test
rules`), and every firing episode read back.

Why promtool: a Prometheus fed a backfilled block does not evaluate alerting rules over the past, and
`promtool tsdb create-blocks-from rules` evaluates recording rules only. `promtool test rules` runs
the rule manager of the same Prometheus (`for:`, `keep_firing_for`, ALERTS, staleness) over input
series at every evaluation interval; the scrapes are written as input series, absent scrapes as
staleness markers (Prometheus marks every series of a failed scrape stale, and a series that a good
scrape no longer has), so `for:` clocks see what a server would have stored.

The firings are read with one query at the end of the replay: per ALERTS{alertstate="firing"} series,
the evaluations at which it was firing and was not one evaluation before, i.e. episodes; promtool
prints the result as the difference from an expected empty one, which is parsed back.
"""

from __future__ import annotations

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
    """promtool's notation: `a+bxn` runs where the value steps evenly, `stale` at the first missing
    scrape after a present one, `_` for the further missing ones."""
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


_GOT_LINE = re.compile(r"^\s*got: (.*)$", re.M)
_SAMPLE = re.compile(r"\{([^{}]*)\} ([0-9.eE+-]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_got(output: str) -> list[Firing]:
    """The `got:` samples promtool prints for each failed promql_expr_test (`{labels} value, ...`)."""
    firings = []
    for line in _GOT_LINE.finditer(output):
        for m in _SAMPLE.finditer(line.group(1)):
            firings.append(Firing(dict(_LABEL.findall(m.group(1))), round(float(m.group(2)))))
    return firings


WINDOW_SECONDS = 3600


def _windows(end_seconds: float) -> list[tuple[int, int]]:
    """(end, length) of adjacent windows covering (0 - one interval, end]."""
    end = int(end_seconds)
    out = [(t, WINDOW_SECONDS) for t in range(WINDOW_SECONDS, end + 1, WINDOW_SECONDS)]
    last = out[-1][0] if out else 0
    if last < end:
        out.append((end, end - last))
    out[0] = (out[0][0], out[0][1] + 60)  # the first window reaches back before t=0
    return out


def evaluate(
    promtool: Path,
    rules: Sequence[Path],
    scrapes: Sequence[Scrapes],
    interval_seconds: float,
    end_seconds: float,
    workdir: Path,
    timeout_seconds: float = 3600.0,
) -> list[Firing]:
    """Run the rules over the scrapes at every `interval_seconds`; the firing episodes per series."""
    every = f"{interval_seconds:g}s"
    firing = 'ALERTS{alertstate="firing"}'
    # an evaluation where the series fires and did not one interval before: one episode begins
    starts = f"({firing} unless {firing} offset {every})"
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
                    {
                        "expr": f"sum_over_time({starts}[{length}s:{every}])",
                        "eval_time": f"{t}s",
                        "exp_samples": [],
                    }
                    for t, length in _windows(end_seconds)
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
        return []  # the expected empty result: nothing fired
    if "got:" not in text:
        raise RuntimeError(f"promtool test rules failed without a result:\n{text[-4000:]}")
    return parse_got(text)
