"""The seed's stories (tests/diagnosis/stories.py) in a TSDB a real Prometheus serves: raw series
backfilled with `promtool tsdb create-blocks-from openmetrics`, then the recording rules the
diagnosis reads backfilled from them with `promtool tsdb create-blocks-from rules` (the technique of
tests/costreport/test_report_prometheus.py). `backfill` builds it; tests/diagnosis/conftest.py
builds it once per session."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from demo.neighbours import CURRENT, line
from remediation.diagnosis import catalogue
from tests.diagnosis import stories
from tests.fakes.prometheus_process import running_prometheus

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "global:\n  scrape_interval: 15s\n"
# backfilled blocks carry no staleness markers; the stories' series all live the whole period
LOOKBACK = ("--query.lookback-delta=1m",)
# 5 hours back at least: promtool's rule backfill and the head block stay apart
ONSET = math.floor((time.time() - 5 * stories.HOUR) / stories.HOUR) * stories.HOUR
START, END = ONSET - stories.HOUR, ONSET + 900
STORIES = {s.name: s for s in stories.build(ONSET)}


def _rules_read_by_the_diagnosis() -> list[dict[str, object]]:
    """The shipped recording rules whose output the catalogue reads (none of them reads another)."""
    wanted = {
        name
        for signal in (
            *(s for c in catalogue.CAUSES for s in (c.primary, *c.corroborating)),
            *catalogue.CONTEXT,
            *catalogue.SYMPTOMS_BY_ALERT.values(),
        )
        for name in _record_names(signal.query)
    }
    rules: list[dict[str, object]] = []
    for path in sorted((ROOT / "alerts").glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules += [r for r in group["rules"] if r.get("record") in wanted]
    return rules


def _record_names(query: str) -> set[str]:
    return set(re.findall(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", query))


def _run(*cmd: str, cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=cwd)
    assert done.returncode == 0, f"{cmd[:4]}: {done.stderr[-2000:]}"


async def backfill(tsdb: Path, work: Path, line_name: str = CURRENT) -> None:
    """Backfill the stories into `tsdb` with the promtool and prometheus of line `line_name`."""
    promtool = str(line(line_name).promtool)
    raw = work / "raw.om"
    raw.write_text(stories.openmetrics(list(STORIES.values()), START, END))
    _run(promtool, "tsdb", "create-blocks-from", "openmetrics", str(raw), str(tsdb))
    rules = _rules_read_by_the_diagnosis()
    # the symptom and the memory-limit signals read these; the limit needs 7 days and stays absent
    names = {r["record"] for r in rules}
    assert "namespace_pod_model:inference_request_latency_seconds:p99" in names
    assert "uuid:gpu_sm_activity:ratio" in names
    # relative, so the group's evaluation phase (a hash of its name and file) is the same every run:
    # promtool skips an evaluation at each 2 h block boundary for a phase in the interval's last
    # second (see tests/costreport/test_report_prometheus.py)
    rule_file = "diagnosis.rules.yaml"
    (work / rule_file).write_text(
        yaml.safe_dump(
            {"groups": [{"name": "diagnosis", "interval": f"{stories.INTERVAL}s", "rules": rules}]}
        )
    )
    out = work / "blocks"
    async with running_prometheus(CONFIG, tsdb_path=tsdb, extra_args=LOOKBACK, line=line_name) as prom:
        _run(
            promtool,
            "tsdb",
            "create-blocks-from",
            "rules",
            f"--url={prom.url}",
            f"--start={int(START)}",
            f"--end={int(END)}",
            f"--output-dir={out}",
            "--quiet",
            rule_file,
            cwd=work,
        )
    for block in out.iterdir():
        shutil.move(str(block), tsdb / block.name)
