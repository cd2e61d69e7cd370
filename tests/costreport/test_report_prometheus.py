"""`gpupulse report` against a real Prometheus holding a replayed day part: raw series backfilled with
`promtool tsdb create-blocks-from openmetrics`, gpupulse's own recording rules backfilled from them
with `promtool tsdb create-blocks-from rules` (one pass per rule depth, since promtool cannot see the
output of a rule it is backfilling in the same pass), then the report's figures checked against the
numbers the scenario was built from.

The scenario (6 hours, samples every 30 s, no cluster label):
- GPU-0: team-a/a-0 all period, SM 0.9, 400 W, engine model llama-70b generating 1,000 tokens/s;
- GPU-1: team-a/a-1 for the first 3 hours, SM 0.05 (idle), 100 W, on after a-1 leaves;
- GPU-2: time-sliced by team-b/b-0 (model qwen-7b, no token counter) and team-c/c-0, SM 0.5, 300 W;
- GPU-3: no pod, 60 W.
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from costreport.prom import PrometheusClient
from costreport.usage import Report, build_report
from demo.neighbours import line as neighbour_line
from tests.fakes.prometheus_process import running_prometheus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "recording.rules.yaml"
GROUP = "gpupulse.activity-and-cost"
HOUR = 3600.0
INTERVAL = 30
CONFIG = "global:\n  scrape_interval: 1m\n"
# Backfilled blocks carry no staleness markers (a scraped series that vanishes gets one at the next
# scrape, a rule's output at the next evaluation), so a vanished series would live on for the default
# 5 min lookback, twice (raw, then rule output). A lookback just over the sample interval stands in.
LOOKBACK = ("--query.lookback-delta=45s",)
# 4 hours back at least: promtool's rule backfill and the head block stay apart
END = math.floor((time.time() - 5 * HOUR) / HOUR) * HOUR
START = END - 6 * HOUR


def _gpu(uuid: str, gpu: str) -> str:
    return f'uuid="{uuid}",gpu="{gpu}",node="node-1"'


def _openmetrics() -> str:
    """Every raw series of the scenario, from 30 min before the period to 10 min after it."""
    t0, t1 = int(START - 1800), int(END + 600)
    half = START + 3 * HOUR
    lines: list[str] = []

    def series(name: str, labels: str, value: object, when: object = None) -> None:
        lines.append(f"# TYPE {name} gauge")
        for t in range(t0, t1 + 1, INTERVAL):
            if when is None or when(t):  # type: ignore[operator]
                v = value(t) if callable(value) else value
                lines.append(f"{name}{{{labels}}} {v} {t}")

    alloc = 'container="main",resource="nvidia.com/gpu"'
    gpus = {
        "GPU-0": ("0", 0.9, 400.0),
        "GPU-1": ("1", 0.05, 100.0),
        "GPU-2": ("2", 0.5, 300.0),
        "GPU-3": ("3", 0.0, 60.0),
    }
    for uuid, (gpu, sm, watts) in gpus.items():
        series("gpu_sm_active_ratio", _gpu(uuid, gpu), sm)
        series("gpu_energy_joules_total", _gpu(uuid, gpu), lambda t, w=watts: w * (t - t0))
    series("gpu_allocation_info", f'{_gpu("GPU-0", "0")},namespace="team-a",pod="a-0",{alloc}', 1)
    series(
        "gpu_allocation_info",
        f'{_gpu("GPU-1", "1")},namespace="team-a",pod="a-1",{alloc}',
        1,
        lambda t: t < half,
    )
    series("gpu_allocation_info", f'{_gpu("GPU-2", "2")},namespace="team-b",pod="b-0",{alloc}', 1)
    series("gpu_allocation_info", f'{_gpu("GPU-2", "2")},namespace="team-c",pod="c-0",{alloc}', 1)
    engine = 'engine="vllm",node="node-1"'
    series(
        "inference_engine_gpu_info",
        f'{engine},model="llama-70b",namespace="team-a",pod="a-0",gpu="0",uuid="GPU-0"',
        1,
    )
    series(
        "inference_engine_gpu_info",
        f'{engine},model="qwen-7b",namespace="team-b",pod="b-0",gpu="2",uuid="GPU-2"',
        1,
    )
    series(
        "inference_generation_tokens_total",
        f'{engine},model="llama-70b",namespace="team-a",pod="a-0"',
        lambda t: 1000 * (t - t0),
    )
    # families must not repeat in OpenMetrics: merge the TYPE lines of a name into one block
    blocks: dict[str, list[str]] = {}
    name = ""
    for line in lines:
        if line.startswith("# TYPE "):
            name = line.split()[2]
            blocks.setdefault(name, [line])
        else:
            blocks[name].append(line)
    return "\n".join(line for block in blocks.values() for line in block) + "\n# EOF\n"


def _rule_levels() -> list[list[dict[str, object]]]:
    """The recording rules of the cost group, by depth: a rule reading another recorded series comes
    one pass after it."""
    group = next(g for g in yaml.safe_load(RULES.read_text())["groups"] if g["name"] == GROUP)
    rules = [r for r in group["rules"] if "record" in r]
    names = {r["record"] for r in rules}
    depth: dict[str, int] = {}

    def level(rule: dict[str, object]) -> int:
        record = str(rule["record"])
        if record not in depth:
            used = [
                n
                for n in names
                if n != record and re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", str(rule["expr"]))
            ]
            depth[record] = 1 + max(
                (level(next(r for r in rules if r["record"] == n)) for n in used), default=0
            )
        return depth[record]

    out: list[list[dict[str, object]]] = []
    for rule in rules:
        d = level(rule)
        while len(out) < d:
            out.append([])
        out[d - 1].append(rule)
    return out


def _run(*cmd: str, cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=cwd)
    assert done.returncode == 0, f"{cmd[:4]}: {done.stderr[-2000:]}"


async def _backfill(tsdb: Path, work: Path) -> None:
    raw = work / "raw.om"
    raw.write_text(_openmetrics())
    promtool = str(neighbour_line().promtool)
    _run(promtool, "tsdb", "create-blocks-from", "openmetrics", str(raw), str(tsdb))
    levels = _rule_levels()
    for depth, rules in enumerate(levels, start=1):
        # a relative path: a group's evaluation phase is a hash of its name and file, and promtool
        # skips one evaluation at every 2 h block boundary when that phase falls in the interval's
        # last second (cmd/promtool/rules.go floors the aligned start to whole seconds). A temporary
        # directory in the path made the phase, and so the test, vary from run to run.
        rule_file = f"depth-{depth}.rules.yaml"
        (work / rule_file).write_text(
            yaml.safe_dump(
                {"groups": [{"name": f"{GROUP}-{depth}", "interval": f"{INTERVAL}s", "rules": rules}]}
            )
        )
        out = work / f"blocks-{depth}"
        async with running_prometheus(CONFIG, tsdb_path=tsdb, extra_args=LOOKBACK) as prom:
            _run(
                promtool,
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--url={prom.url}",
                f"--start={int(START - 1800)}",
                f"--end={int(END + 600)}",
                f"--output-dir={out}",
                "--quiet",
                rule_file,
                cwd=work,
            )
        for block in out.iterdir():
            shutil.move(str(block), tsdb / block.name)
    await _assert_every_evaluation_backfilled(tsdb, [str(r["record"]) for rules in levels for r in rules])


async def _assert_every_evaluation_backfilled(tsdb: Path, records: list[str]) -> None:
    """Each recorded series present all period holds one sample per interval in it: a skipped
    evaluation leaves a gap the lookback does not cover, and figures off by a few seconds' worth."""
    span = int(END - START)
    async with running_prometheus(CONFIG, tsdb_path=tsdb, extra_args=LOOKBACK) as prom:
        for record in records:
            data = await prom.api(
                "query",
                query=f'max(count_over_time({{__name__="{record}"}}[{span}s]))',
                time=str(int(END)),
            )
            counts = [float(r["value"][1]) for r in data["result"]]
            assert counts == [span / INTERVAL], (
                f"{record}: {counts} samples, not one per {INTERVAL}s evaluation: promtool skipped "
                "evaluations (a group phase in the interval's last second); rename the rule file"
            )


@pytest.fixture(scope="module")
def tsdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("report")
    path = work / "tsdb"
    path.mkdir()
    asyncio.run(_backfill(path, work))
    yield path


async def _report(tsdb: Path, step_seconds: float = 300.0) -> Report:
    async with running_prometheus(CONFIG, tsdb_path=tsdb, extra_args=LOOKBACK) as prom:
        client = PrometheusClient(prom.url, timeout_seconds=30)
        return await asyncio.to_thread(build_report, client, START, END, step_seconds)


async def test_the_report_integrates_gpu_hours_energy_and_cost_per_namespace(tsdb: Path) -> None:
    report = await _report(tsdb)
    by_ns = {n.namespace: n for n in report.namespaces}
    assert set(by_ns) == {"team-a", "team-b", "team-c"}
    # GPU-hours: a-0 six hours, a-1 three; GPU-2 split evenly between its two pods
    assert by_ns["team-a"].gpu_hours == pytest.approx(9.0)
    assert by_ns["team-b"].gpu_hours == pytest.approx(3.0)
    assert by_ns["team-c"].gpu_hours == pytest.approx(3.0)
    # idle while allocated: only a-1 (SM 0.05 under the rules' 0.3)
    assert by_ns["team-a"].idle_gpu_hours == pytest.approx(3.0)
    assert by_ns["team-b"].idle_gpu_hours == 0.0 and by_ns["team-c"].idle_gpu_hours == 0.0
    # cost at the rules' price (alerts/config.yaml: 2.50 USD per GPU-hour)
    assert report.currency == "USD"
    assert report.price_per_gpu_hour == pytest.approx(2.5)
    assert by_ns["team-a"].cost == pytest.approx(22.5) and by_ns["team-a"].idle_cost == pytest.approx(7.5)
    assert by_ns["team-b"].cost == pytest.approx(7.5)
    # energy: 400 W x 6 h + 100 W x 3 h; half of 300 W x 6 h each for b and c
    assert by_ns["team-a"].energy_joules == pytest.approx((400 * 6 + 100 * 3) * HOUR, rel=1e-3)
    assert by_ns["team-b"].energy_joules == pytest.approx(300 * 6 * HOUR / 2, rel=1e-3)
    assert by_ns["team-c"].energy_joules == pytest.approx(300 * 6 * HOUR / 2, rel=1e-3)
    # nobody's: GPU-3 all period, GPU-1 after a-1 left
    assert report.unallocated_energy_joules[""] == pytest.approx((60 * 6 + 100 * 3) * HOUR, rel=1e-3)
    # costliest first
    assert report.namespaces[0].namespace == "team-a"


async def test_the_report_names_models_their_cost_per_token_and_the_idle_pod(tsdb: Path) -> None:
    report = await _report(tsdb)
    by_model = {m.model: m for m in report.models}
    llama, qwen = by_model["llama-70b"], by_model["qwen-7b"]
    assert llama.namespace == "team-a"
    assert llama.gpu_hours == pytest.approx(6.0) and llama.cost == pytest.approx(15.0)
    assert llama.energy_joules == pytest.approx(400 * 6 * HOUR, rel=1e-3)
    assert llama.generated_tokens == pytest.approx(1000 * 6 * HOUR, rel=1e-3)
    assert llama.cost_per_million_tokens == pytest.approx(15.0 / 21.6, rel=1e-3)
    # a model on a time-sliced GPU is charged its pod's share; no token counter, no per-token figure
    assert qwen.gpu_hours == pytest.approx(3.0) and qwen.cost == pytest.approx(7.5)
    assert qwen.generated_tokens is None and qwen.cost_per_million_tokens is None
    assert [(i.namespace, i.pod) for i in report.idle] == [("team-a", "a-1")]
    assert report.idle[0].idle_gpu_hours == pytest.approx(3.0) and report.idle[0].gpu_hours == pytest.approx(
        3.0
    )
    # the per-pod idle list adds up to the idle rule's namespace total
    assert sum(i.idle_gpu_hours for i in report.idle) == pytest.approx(
        sum(n.idle_gpu_hours for n in report.namespaces)
    )


async def test_a_fine_step_is_split_under_prometheus_point_limit_and_agrees(tsdb: Path) -> None:
    # 6 h at 1 s is 21,600 points a series: one query would be refused past 11,000, so this also
    # proves the split at 10,000 reaches the real server as queries it accepts
    report = await _report(tsdb, step_seconds=1.0)
    by_ns = {n.namespace: n for n in report.namespaces}
    # series present all period agree exactly; a-1's vanishing is seen up to one lookback late
    # at each backfilled layer (raw, the allocation share, the usage share: no staleness markers
    # in backfilled blocks), which a 5 min step hides and a 1 s step shows
    assert by_ns["team-b"].gpu_hours == pytest.approx(3.0) and by_ns["team-b"].cost == pytest.approx(7.5)
    assert 9.0 <= by_ns["team-a"].gpu_hours <= 9.0 + 3 * 45 / HOUR


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "costreport.cli",
            "report",
            f"--prometheus.url={url}",
            f"--start={int(START)}",
            f"--end={int(END)}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_the_console_script_prints_text_csv_and_markdown(tsdb: Path) -> None:
    async with running_prometheus(CONFIG, tsdb_path=tsdb, extra_args=LOOKBACK) as prom:
        text, table, markdown = await asyncio.gather(
            asyncio.to_thread(_cli, prom.url),
            asyncio.to_thread(_cli, prom.url, "--format=csv"),
            asyncio.to_thread(_cli, prom.url, "--format=markdown"),
        )
    for done in (text, table, markdown):
        assert done.returncode == 0, done.stderr
    assert (
        "team-a" in text.stdout and "llama-70b" in text.stdout and "Largest idle allocations" in text.stdout
    )
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    team_a = next(r for r in rows if r["section"] == "namespace" and r["namespace"] == "team-a")
    assert float(team_a["gpu_hours"]) == pytest.approx(9.0) and float(team_a["cost"]) == pytest.approx(22.5)
    llama = next(r for r in rows if r["section"] == "model" and r["model"] == "llama-70b")
    assert float(llama["cost_per_million_tokens"]) == pytest.approx(15.0 / 21.6, rel=1e-3)
    assert "| team-a | 9.00 | 3.00 |" in markdown.stdout


async def test_a_prometheus_without_the_data_is_no_data_not_a_report_of_zeros(tmp_path: Path) -> None:
    async with running_prometheus(CONFIG) as prom:
        done = await asyncio.to_thread(_cli, prom.url)
    assert done.returncode == 4, done.stderr
    assert "no GPU allocation data" in done.stderr and "recording rules" in done.stderr
    assert done.stdout == ""
