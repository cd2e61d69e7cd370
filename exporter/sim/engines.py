"""`gpupulse-sim-engine`: serve vLLM-, SGLang- or TGI-format metrics driven by a scenario's curves.

Curves are integrated as scenario time passes: request rate -> cumulative request, token and
prefix-cache counters; p50/p99 latencies -> log-normal distributions whose CDF fills the engine's own
histogram buckets. Time comes from a clock object (RealClock with --speed, ManualClock in tests).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from exporter.sim.clock import RealClock
from exporter.sim.engine_spec import SimEngineSpec, load_engines
from gpupulse.clock import Clock

_STEP_SECONDS = 1.0
_Z99 = 2.3263478740408408  # standard normal 99th percentile

# Bucket bounds of each engine (shared/reference/inference-metrics.md).
VLLM_BUCKETS = {
    "ttft": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0, 160.0, 640.0, 2560.0),
    "itl": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
            40.0, 80.0),
    "e2e": (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
            480.0, 960.0, 1920.0, 7680.0),
}  # fmt: skip
SGLANG_BUCKETS = {
    "ttft": (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400),
    "itl": (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
            0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0),
    "e2e": (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400),
}  # fmt: skip
_TGI_DURATION = tuple(0.0001 * 1.5**k for k in range(1, 36))
TGI_BUCKETS = {"e2e": _TGI_DURATION, "batch": _TGI_DURATION}


def _lognormal_cdf(x: float, p50: float, p99: float) -> float:
    sigma = max(math.log(max(p99, p50 * 1.000001) / p50) / _Z99, 1e-6)
    return 0.5 * (1.0 + math.erf((math.log(x) - math.log(p50)) / (sigma * math.sqrt(2.0))))


def _lognormal_mean(p50: float, p99: float) -> float:
    sigma = max(math.log(max(p99, p50 * 1.000001) / p50) / _Z99, 1e-6)
    return p50 * math.exp(sigma * sigma / 2.0)


@dataclass
class _Hist:
    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)  # cumulative per bound, then +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * (len(self.bounds) + 1)

    def add(self, n: float, p50: float, p99: float) -> None:
        if n <= 0 or p50 <= 0:
            return
        for i, b in enumerate(self.bounds):
            self.counts[i] += n * _lognormal_cdf(b, p50, p99)
        self.counts[-1] += n
        self.total += n * _lognormal_mean(p50, p99)

    def buckets(self) -> list[tuple[str, float]]:
        return [(repr(float(b)), c) for b, c in zip(self.bounds, self.counts, strict=False)] + [
            ("+Inf", self.counts[-1])
        ]


class SimEngine:
    """Cumulative engine state advanced along the scenario's curves."""

    def __init__(self, spec: SimEngineSpec, clock: Clock, wall_start: float | None = None) -> None:
        self.spec = spec
        self.clock = clock
        self.t = 0.0
        self.wall_start = time.time() if wall_start is None else wall_start
        buckets = {"vllm": VLLM_BUCKETS, "sglang": SGLANG_BUCKETS, "tgi": TGI_BUCKETS}[spec.kind]
        self.hists = {k: _Hist(b) for k, b in buckets.items()}
        self.requests = 0.0
        self.prompt_tokens = 0.0
        self.generation_tokens = 0.0
        self.cache_hits = 0.0

    def curve(self, name: str, t: float | None = None) -> float:
        """A curve's value at scenario time t (now by default)."""
        return self.spec.curves[name].at(self.t if t is None else t)

    @property
    def ready(self) -> bool:
        """False while the engine is still loading (metrics answer 503)."""
        return self.clock.monotonic() >= self.spec.ready_after_seconds

    def advance(self) -> None:
        """Integrate the curves from the last call up to the clock's now."""
        now = self.clock.monotonic()
        while self.t < now:
            t1 = min(now, self.t + _STEP_SECONDS)
            mid = (self.t + t1) / 2.0
            n = self.spec.curves["request_rate"].integral(self.t, t1)
            prompt = n * self.curve("prompt_tokens", mid)
            out = n * self.curve("output_tokens", mid)
            self.requests += n
            self.prompt_tokens += prompt
            self.generation_tokens += out
            self.cache_hits += prompt * min(max(self.curve("kv_cache_hit_rate", mid), 0.0), 1.0)
            for key, hist in self.hists.items():
                p50, p99 = (
                    self.curve(f"{'batch_latency' if key == 'batch' else key}_p50", mid),
                    self.curve(f"{'batch_latency' if key == 'batch' else key}_p99", mid),
                )
                if key == "itl":
                    count = max(out - n, 0.0)
                elif key == "batch":
                    count = (t1 - self.t) / max(p50, 1e-3)  # one batch after another while busy
                else:
                    count = n
                hist.add(count, p50, p99)
            self.t = t1

    def families(self) -> list[Metric]:
        """The engine's exposition, in its own names."""
        return {"vllm": self._vllm, "sglang": self._sglang, "tgi": self._tgi}[self.spec.kind]()

    def _vllm(self) -> list[Metric]:
        lab, val = ["engine", "model_name"], ["0", self.spec.model]
        created = self.wall_start
        out: list[Metric] = []
        for name, help_, v in (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                self.curve("running"),
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                self.curve("waiting"),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                self.curve("kv_cache_usage"),
            ),
        ):
            g = GaugeMetricFamily(name, help_, labels=lab)
            g.add_metric(val, v)
            out.append(g)
        for name, help_, v in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             self.prompt_tokens),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             self.cache_hits),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens),
        ):  # fmt: skip
            c = CounterMetricFamily(name, help_, labels=lab)
            c.add_metric(val, v, created=created)
            out.append(c)
        for key, name, help_ in (
            ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
            ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
            ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
        ):
            h = HistogramMetricFamily(name, help_, labels=lab)
            h.add_metric(val, self.hists[key].buckets(), self.hists[key].total)
            out.append(h)
        start = GaugeMetricFamily("process_start_time_seconds", "Start time of the process since unix epoch.")
        start.add_metric([], self.wall_start)
        out.append(start)
        return out

    def _sglang(self) -> list[Metric]:
        lab = ["engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"]
        val = ["unified", self.spec.model, "0", "0", "0"]
        out: list[Metric] = []
        for name, v in (
            ("sglang:num_running_reqs", self.curve("running")),
            ("sglang:num_queue_reqs", self.curve("waiting")),
            ("sglang:token_usage", round(self.curve("kv_cache_usage"), 2)),
        ):
            g = GaugeMetricFamily(name, name, labels=lab)
            g.add_metric(val, v)
            out.append(g)
        eff = CounterMetricFamily(
            "sglang:prefill_effective_tokens", "Effective prefill tokens.", labels=[*lab, "mode"]
        )
        eff.add_metric([*val, "input"], self.prompt_tokens - self.cache_hits)
        eff.add_metric([*val, "device_hit"], self.cache_hits)
        eff.add_metric([*val, "host_hit"], 0.0)
        eff.add_metric([*val, "storage_hit"], 0.0)
        out.append(eff)
        tok_lab, tok_val = ["engine_type", "model_name"], ["unified", self.spec.model]
        for name, v in (
            ("sglang:prompt_tokens", self.prompt_tokens),
            ("sglang:generation_tokens", self.generation_tokens),
        ):
            c = CounterMetricFamily(name, name, labels=tok_lab)
            c.add_metric(tok_val, v)
            out.append(c)
        for key, name in (
            ("ttft", "sglang:time_to_first_token_seconds"),
            ("itl", "sglang:inter_token_latency_seconds"),
            ("e2e", "sglang:e2e_request_latency_seconds"),
        ):
            h = HistogramMetricFamily(name, name, labels=tok_lab)
            h.add_metric(tok_val, self.hists[key].buckets(), self.hists[key].total)
            out.append(h)
        return out

    def _tgi(self) -> list[Metric]:
        out: list[Metric] = []
        for name, v in (
            ("tgi_batch_current_size", self.curve("running")),
            ("tgi_queue_size", self.curve("waiting")),
        ):
            g = GaugeMetricFamily(name, name)
            g.add_metric([], v)
            out.append(g)
        batch = HistogramMetricFamily(
            "tgi_batch_inference_duration", "Batch inference duration", labels=["method"]
        )
        batch.add_metric(["decode"], self.hists["batch"].buckets(), self.hists["batch"].total)
        out.append(batch)
        e2e = HistogramMetricFamily("tgi_request_duration", "Request duration")
        e2e.add_metric([], self.hists["e2e"].buckets(), self.hists["e2e"].total)
        out.append(e2e)
        return out


class _Registry(Collector):
    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        yield from self._engine.families()


def make_app(engine: SimEngine) -> web.Application:
    """An aiohttp app serving the engine's /metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Registry(engine))

    async def metrics(_: web.Request) -> web.Response:
        if not engine.ready:
            return web.Response(status=503, text="model loading\n")
        engine.advance()
        return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def serve(engine: SimEngine, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start the app on host:port (0 = free port); return the runner and the bound port."""
    runner = web.AppRunner(make_app(engine), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1])
    return runner, bound


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpupulse-sim-engine", description=__doc__)
    p.add_argument("--scenario", required=True, help="scenario name or YAML path with an `engines` section")
    p.add_argument("--engine", default=None, help="engine name from the scenario (default: the first)")
    p.add_argument("--listen", default=None, help="HOST:PORT (default 127.0.0.1 and the engine's port)")
    p.add_argument("--speed", type=float, default=1.0, help="scenario seconds per wall second")
    p.add_argument(
        "--format", choices=("vllm", "sglang", "tgi"), default=None, help="override the engine kind"
    )
    return p.parse_args(argv)


async def _run(args: argparse.Namespace) -> None:
    specs = load_engines(args.scenario)
    if not specs:
        raise SystemExit(f"{args.scenario}: no engines section")
    chosen = [s for s in specs if args.engine in (None, s.name)]
    if not chosen:
        raise SystemExit(f"no engine {args.engine!r}; have {', '.join(s.name for s in specs)}")
    spec = chosen[0]
    if args.format:
        spec = replace(spec, kind=args.format)
    host, port = "127.0.0.1", spec.port
    if args.listen:
        host, _, port_text = args.listen.rpartition(":")
        port = int(port_text)
    runner, bound = await serve(SimEngine(spec, RealClock(args.speed)), host or "127.0.0.1", port)
    print(f"listening on http://{host or '127.0.0.1'}:{bound}/metrics", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point."""
    try:
        asyncio.run(_run(_parse_args(argv)))
    except KeyboardInterrupt:
        sys.exit(0)
