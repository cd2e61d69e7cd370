"""The latency rules, the serving panels and the diagnosis request rate on a Prometheus 3 that converts
our engines' classic histograms to native histograms with custom buckets (NHCB), as kube-prometheus-stack
does with `convertClassicHistogramsToNHCB`: no `_bucket`, `_count` or `_sum` series are stored, only
one native histogram series per histogram. Every answer must be the one the classic series give.

The replay runs one exporter with two simulated vLLM engines (incident-serving: a P99 spike 46 s in, and
a second pod of the same model) behind a stamping proxy, scraped by one real Prometheus 3 in three jobs:
`classic` (no conversion), `nhcb` (`convert_classic_histograms_to_nhcb`) and `both` (conversion with
`always_scrape_classic_histograms`). The proxy hands the k-th scrape of every job the same body, each
sample stamped with one timestamp, so the three jobs store the same samples at the same times; each
job's namespaces get a suffix, so the rules evaluate the three side by side, in the same evaluations.
The promtool cases of tests/alerts/native/ cover the same rules at production windows.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from alerts.generate import render_rules
from alerts.rules.recording import HISTOGRAMS, QUANTILES, latency_quantile_name
from demo.neighbours import neighbour_binary
from remediation.diagnosis import catalogue
from tests.alerts.children import child_process, wait_http
from tests.alerts.panel_queries import panel_queries
from tests.alerts.ruleset import TESTS_DIR
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BIN = Path(sys.executable).parent
SCENARIO = Path(__file__).resolve().parents[2] / "exporter" / "scenarios" / "incident-serving.yaml"
ENGINES = (("p99-spike", "llm-spike-0"), ("kv-drop", "llm-kv-0"))  # (engine in the scenario, pod)
MODEL = "llama-3-8b"
SPIKE_POD = "llm-spike-0"
DEADLINE_SECONDS = 100.0  # the spike starts 46 s in; the fast rules fire a few seconds later
# Rules evaluate this far in the past, so every job has stored the samples of an evaluation's window
# (the jobs scrape at different offsets of each second).
RULE_QUERY_OFFSET_SECONDS = 3
# (job, namespace suffix, extra scrape settings)
JOBS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("classic", "", {}),
    ("nhcb", "-nhcb", {"convert_classic_histograms_to_nhcb": True}),
    (
        "both",
        "-both",
        {"convert_classic_histograms_to_nhcb": True, "always_scrape_classic_histograms": True},
    ),
)
RELATIVE_TOLERANCE = 1e-9  # a native quantile counts its buckets from the top for q >= 0.5


def _promtool() -> Path:
    return neighbour_binary("prometheus", "promtool")


async def _promtool_test(path: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(_promtool()),
        "test",
        "rules",
        path.name,
        cwd=path.parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


async def test_latency_rules_answer_on_native_histograms_as_on_classic_ones() -> None:
    """tests/alerts/native/latency.test.yaml on the pinned Prometheus 3 (its notation is 3.x only)."""
    out = await _promtool_test(TESTS_DIR / "native" / "latency.test.yaml")
    assert "SUCCESS" in out


def _request_rate_signal() -> catalogue.Signal:
    return next(c.primary for c in catalogue.CAUSES if c.primary.id == "request_rate")


async def test_diagnosis_request_rate_counts_classic_native_and_both_once(tmp_path: Path) -> None:
    """The diagnosis's request rate (100 requests a minute on every pod): from `_count`, from the native
    histogram, and from both kept side by side (counted once, not twice)."""
    signal = _request_rate_signal()
    native = (
        "{{schema:-53 count:0 custom_values:[0.5] buckets:[0 0]}}"
        "+{{schema:-53 count:100 custom_values:[0.5] buckets:[99 1]}}x10"
    )
    series: list[dict[str, str]] = []
    for pod, forms in (
        ("classic-0", ("classic",)),
        ("native-0", ("native",)),
        ("both-0", ("classic", "native")),
    ):
        labels = f'namespace="serving",pod="{pod}",model="llama",engine="vllm"'
        if "classic" in forms:
            series.append(
                {"series": f"inference_request_latency_seconds_count{{{labels}}}", "values": "0+100x10"}
            )
            series.append(
                {
                    "series": f'inference_request_latency_seconds_bucket{{{labels},le="+Inf"}}',
                    "values": "0+100x10",
                }
            )
        if "native" in forms:
            series.append({"series": f"inference_request_latency_seconds{{{labels}}}", "values": native})
    checks = []
    for pod in ("classic-0", "native-0", "both-0"):
        query = signal.render({"namespace": "serving", "pod": pod})
        assert query is not None
        checks.append(
            {
                "expr": f"round({query} * 1e6)",
                "eval_time": "8m",
                "exp_samples": [{"labels": "{}", "value": 1666667}],
            }
        )
    doc = {"tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    path = tmp_path / "request-rate.test.yaml"
    path.write_text(yaml.safe_dump(doc, width=1000))
    await _promtool_test(path)


# The controller's histograms, fed to the remediation dashboard's latency panels: per minute 90
# observations under 1 s and 10 under 10 s, so the P99 is 9.1 s on either form.
_CONTROLLER_HISTOGRAMS = {
    "gpupulse_remediation_action_duration_seconds": 'rung="restart"',
    "gpupulse_remediation_ingest_latency_seconds": "",
}


async def test_remediation_latency_panels_answer_on_native_histograms(tmp_path: Path) -> None:
    """The remediation dashboard's P99 panels (the controller's own histograms) on classic buckets, on
    their native twin, and on both: the same 9.1 s, one series."""
    native = (
        "{{schema:-53 count:0 custom_values:[1 10] buckets:[0 0 0]}}"
        "+{{schema:-53 count:100 custom_values:[1 10] buckets:[90 10 0]}}x10"
    )
    panels = [
        q
        for q in panel_queries(rate_interval="5m")
        if q.uid == "gpupulse-remediation" and "histogram_quantile" in q.expr
    ]
    assert len(panels) == len(_CONTROLLER_HISTOGRAMS), [str(q) for q in panels]
    cases = []
    for forms in (("classic",), ("native",), ("classic", "native")):
        series: list[dict[str, str]] = []
        for histogram, labels in _CONTROLLER_HISTOGRAMS.items():
            sep = "," if labels else ""
            if "classic" in forms:
                for le, per_minute in (("1", 90), ("10", 100), ("+Inf", 100)):
                    bucket = f'{histogram}_bucket{{{labels}{sep}le="{le}"}}'
                    series.append({"series": bucket, "values": f"0+{per_minute}x10"})
            if "native" in forms:
                series.append({"series": f"{histogram}{{{labels}}}", "values": native})
        checks = []
        for panel in panels:
            histogram = next(h for h in _CONTROLLER_HISTOGRAMS if h in panel.expr)
            expected = {"labels": "{" + _CONTROLLER_HISTOGRAMS[histogram] + "}", "value": 9100000}
            checks.append(
                {"expr": f"round(({panel.expr}) * 1e6)", "eval_time": "8m", "exp_samples": [expected]}
            )
        cases.append(
            {"name": "+".join(forms), "interval": "1m", "input_series": series, "promql_expr_test": checks}
        )
    path = tmp_path / "remediation-panels.test.yaml"
    path.write_text(yaml.safe_dump({"tests": cases}, width=1000))
    await _promtool_test(path)


class StampingProxy:
    """The exporter's /metrics for several scrape jobs, one path each: the k-th scrape of every job gets
    the k-th body fetched, with every sample stamped with the time it was fetched."""

    def __init__(self, upstream: str, jobs: Sequence[str]) -> None:
        self.upstream = upstream
        self.served = dict.fromkeys(jobs, 0)
        self.bodies: list[bytes] = []
        self.content_type = "text/plain; version=0.0.4; charset=utf-8"
        self._lock = asyncio.Lock()

    async def handle(self, request: web.Request) -> web.Response:
        job = request.match_info["job"]
        if job not in self.served:
            raise web.HTTPNotFound()
        k = self.served[job]
        self.served[job] = k + 1
        async with self._lock:
            while len(self.bodies) <= k:
                self.bodies.append(await self._fetch())
        return web.Response(body=self.bodies[k], headers={"Content-Type": self.content_type})

    async def _fetch(self) -> bytes:
        async with aiohttp.ClientSession() as session:
            async with session.get(self.upstream, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                assert resp.status == 200, f"{self.upstream}: {resp.status}"
                self.content_type = resp.headers.get("Content-Type", self.content_type)
                text = await resp.text()
        stamp = str(int(time.time() * 1000))
        lines = [
            line if not line.strip() or line.startswith("#") else f"{line} {stamp}"
            for line in text.splitlines()
        ]
        return ("\n".join(lines) + "\n").encode()


async def _serve(stack: AsyncExitStack, proxy: StampingProxy) -> int:
    app = web.Application()
    app.router.add_get("/{job}", proxy.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return int(runner.addresses[0][1])


def _config(proxy_port: int, rule_names: list[str]) -> str:
    scrape = []
    for job, suffix, extra in JOBS:
        entry: dict[str, Any] = {
            "job_name": job,
            "metrics_path": f"/{job}",
            "static_configs": [{"targets": [f"127.0.0.1:{proxy_port}"], "labels": {"node": "replay"}}],
            **extra,
        }
        if suffix:
            entry["metric_relabel_configs"] = [
                {
                    "source_labels": ["namespace"],
                    "regex": "(.+)",
                    "target_label": "namespace",
                    "replacement": "${1}" + suffix,
                }
            ]
        scrape.append(entry)
    return yaml.safe_dump(
        {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "900ms",
                "evaluation_interval": "1s",
                "rule_query_offset": f"{RULE_QUERY_OFFSET_SECONDS}s",
            },
            "rule_files": rule_names,
            "scrape_configs": scrape,
        }
    )


async def _start_exporter(stack: AsyncExitStack, tmp: Path) -> int:
    targets = []
    for engine, pod in ENGINES:
        port = free_port()
        proc = await stack.enter_async_context(
            child_process(
                [
                    str(BIN / "gpupulse-sim-engine"),
                    "--scenario",
                    str(SCENARIO),
                    "--engine",
                    engine,
                    "--listen",
                    f"127.0.0.1:{port}",
                ],
                tmp / f"engine-{engine}.log",
            )
        )
        await wait_http(f"http://127.0.0.1:{port}/metrics", proc)
        url = f"http://127.0.0.1:{port}/metrics"
        targets.append({"url": url, "engine": "vllm", "model": MODEL, "namespace": "serving", "pod": pod})
    engines = tmp / "engines.yaml"
    engines.write_text(yaml.safe_dump({"engines": targets}))
    port = free_port()
    args = [str(BIN / "gpupulse-exporter"), "--simulate", str(SCENARIO), "--engines.config", str(engines)]
    args += [
        "--engines.interval",
        "1",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--sampling.interval",
        "0.5",
    ]
    exporter = await stack.enter_async_context(child_process(args, tmp / "exporter.log"))
    await wait_http(f"http://127.0.0.1:{port}/metrics", exporter)
    return port


Series = dict[tuple[tuple[str, str], ...], dict[float, float]]


async def _range(prom: PromHandle, query: str, start: float, end: float) -> dict[str, Series]:
    """query_range at 1 s steps: namespace suffix ("", "-nhcb", "-both") -> labels without namespace ->
    timestamp -> value."""
    data = await prom.api("query_range", query=query, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
    out: dict[str, Series] = {suffix: {} for _, suffix, _ in JOBS}
    for series in data["result"]:
        labels = dict(series["metric"])
        namespace = labels.pop("namespace", "")
        suffix = next(
            (s for _, s, _ in sorted(JOBS, key=lambda j: -len(j[1])) if s and namespace.endswith(s)), ""
        )
        labels.pop("__name__", None)
        key = tuple(sorted(labels.items()))
        out[suffix][key] = {float(ts): float(v) for ts, v in series["values"]}
    return out


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= RELATIVE_TOLERANCE * max(abs(a), abs(b))


def _assert_same_answers(what: str, by_suffix: dict[str, Series]) -> int:
    """Every job's answer equals the classic job's, at every step; returns the finite classic samples."""
    classic = by_suffix[""]
    for _, suffix, _ in JOBS[1:]:
        other = by_suffix[suffix]
        assert set(other) == set(classic), (
            f"{what}: series {sorted(other)} on {suffix}, {sorted(classic)} classic"
        )
        for key, values in classic.items():
            theirs = other[key]
            assert set(theirs) == set(values), f"{what}{dict(key)}: steps differ on {suffix}"
            wrong = [(ts, v, theirs[ts]) for ts, v in values.items() if not _same(v, theirs[ts])]
            assert not wrong, f"{what}{dict(key)} on {suffix} (time, classic, {suffix}): {wrong[:5]}"
    return sum(1 for values in classic.values() for v in values.values() if math.isfinite(v))


async def _firing_everywhere(prom: PromHandle) -> bool:
    found = await prom.query(
        f'ALERTS{{alertname="InferenceLatencyP99Spike", alertstate="firing", pod="{SPIKE_POD}"}}'
    )
    namespaces = {s["metric"].get("namespace") for s in found}
    return namespaces >= {"serving" + suffix for _, suffix, _ in JOBS}


async def _assert_conversion_happened(prom: PromHandle) -> None:
    """The nhcb job stored no classic series of the engines' histograms, only native ones; `both` has both."""
    for histogram in HISTOGRAMS:
        classic = f'{{__name__=~"{histogram}_(bucket|count|sum)", namespace="serving-nhcb"}}'
        assert not await prom.query(classic), f"{histogram}: classic series stored despite the conversion"
        for namespace in ("serving-nhcb", "serving-both"):
            native = await prom.query(f'{histogram}{{namespace="{namespace}"}}')
            assert native and all("histogram" in s for s in native), (
                f"{histogram} in {namespace}: {native[:1]}"
            )
        assert await prom.query(f'{histogram}_bucket{{namespace="serving-both"}}'), (
            f"{histogram}: both lost _bucket"
        )
        assert not await prom.query(f'{histogram}{{namespace="serving"}}'), (
            f"{histogram}: converted without asking"
        )


async def test_replay_with_converted_histograms_answers_as_with_classic_ones(tmp_path: Path) -> None:
    overrides = yaml.safe_load((TESTS_DIR / "fast-overrides.yaml").read_text())
    rules = []
    for name, text in render_rules(overrides=overrides).items():
        (tmp_path / name).write_text(text)
        rules.append(tmp_path / name)
    async with AsyncExitStack() as stack:
        exporter_port = await _start_exporter(stack, tmp_path)
        proxy = StampingProxy(f"http://127.0.0.1:{exporter_port}/metrics", [job for job, _, _ in JOBS])
        proxy_port = await _serve(stack, proxy)
        config = _config(proxy_port, [r.name for r in rules])
        prom = await stack.enter_async_context(
            running_prometheus(config, rule_files=rules, binary=neighbour_binary("prometheus"))
        )
        start = time.time()
        t0 = time.monotonic()
        while not await _firing_everywhere(prom):
            assert time.monotonic() - t0 < DEADLINE_SECONDS, (
                f"InferenceLatencyP99Spike not firing for all three jobs within {DEADLINE_SECONDS} s: "
                + str(await prom.query('ALERTS{alertname="InferenceLatencyP99Spike"}'))
            )
            await asyncio.sleep(0.5)
        fired = time.monotonic() - t0
        # the last evaluations read data every job has stored
        await asyncio.sleep(RULE_QUERY_OFFSET_SECONDS + 1)
        end = time.time() - RULE_QUERY_OFFSET_SECONDS - 1
        print(
            f"InferenceLatencyP99Spike firing for all three jobs after {fired:.1f} s; "
            f"scrapes served {proxy.served}"
        )

        await _assert_conversion_happened(prom)
        rules_checked = 0
        for histogram in HISTOGRAMS:
            for level in ("namespace_pod_model", "namespace_model"):
                for quantile in QUANTILES:
                    name = latency_quantile_name(level, histogram, quantile)
                    finite = _assert_same_answers(name, await _range(prom, name, start, end))
                    # every pod's and model's quantile had values through most of the run
                    assert finite >= 20, f"{name}: only {finite} finite samples"
                    rules_checked += 1
        assert rules_checked == 16

        alerts = await _range(prom, 'ALERTS{alertname="InferenceLatencyP99Spike"}', start, end)
        _assert_same_answers("InferenceLatencyP99Spike", alerts)
        assert any(dict(k).get("alertstate") == "firing" for k in alerts[""]), alerts[""]

        signal = _request_rate_signal()
        for pod in (pod for _, pod in ENGINES):
            queries = {
                suffix: signal.render({"namespace": "serving" + suffix, "pod": pod}) for _, suffix, _ in JOBS
            }
            # sum() keeps no namespace: each query's whole answer is its job's
            answers = {
                suffix: {
                    k: v
                    for part in (await _range(prom, str(q), start, end)).values()
                    for k, v in part.items()
                }
                for suffix, q in queries.items()
            }
            finite = _assert_same_answers(f"diagnosis request_rate {pod}", answers)
            assert finite >= 20, f"request_rate of {pod}: {finite} finite samples"

        panels = [
            q
            for q in panel_queries(rate_interval="5s")
            if q.uid == "gpupulse-serving" and "histogram_quantile" in q.expr
        ]
        assert len(panels) >= 6, [str(q) for q in panels]
        for panel in panels:
            assert 'namespace=~".*"' in panel.expr, panel
            answers = {}
            for _, suffix, _ in JOBS:
                expr = panel.expr.replace('namespace=~".*"', f'namespace="serving{suffix}"')
                answers[suffix] = (await _range(prom, expr, start, end))[suffix]
            finite = _assert_same_answers(str(panel), answers)
            assert finite >= 20, f"{panel}: {finite} finite samples"
        print(
            f"same answers on classic, converted and both: {rules_checked} latency rules, "
            f"InferenceLatencyP99Spike, request_rate of {len(ENGINES)} pods, {len(panels)} panel queries"
        )
