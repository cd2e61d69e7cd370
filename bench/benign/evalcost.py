"""The shipped rule groups' evaluation cost on a benign fleet's pages, read from a real Prometheus 3.16.

promtool reports no timings, so the cost is measured apart from the firings: each replayed node's
scrape at a chosen time (daytime, every workload running) becomes a page; `copies` copies of the
fleet (every per-node label value suffixed, bench/fleet_pages.for_node, so no two copies share a
series, a pod or a job) are served from one in-process server and scraped by one Prometheus loading
the generated rule files, scrape and evaluation every `interval_seconds`. After a warm-up, each
group's `prometheus_rule_group_last_duration_seconds` over its `prometheus_rule_group_interval_seconds`
is its share of the round; divided by the nodes and times 1,000, the share per 1,000 nodes (linear
only as far as the groups' cost is, which bench/fleet_scale.py measured at 500 to 2,000 nodes).
"""

from __future__ import annotations

import asyncio
import gzip
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from bench.benign.replay import Scrapes
from bench.benign.timeline import NodePlan
from bench.fleet_pages import SimNode, for_node
from bench.fleet_scale import (
    Pages,
    processes,
    prometheus_config,
    read_metrics,
    serve_pages,
    start,
    wait_ready,
)
from bench.proofs.harness import free_port


@dataclass(frozen=True)
class GroupCost:
    group: str
    seconds: float  # median of the last-duration readings over the window
    interval_seconds: float

    def share_per_1000_nodes(self, nodes: int) -> float:
        return self.seconds / self.interval_seconds * 1000.0 / nodes


def page_at(scrapes: Scrapes, index: int) -> str:
    """One scrape of a node as exposition text (the series the rules read; no metadata lines)."""
    return "".join(
        f"{key} {column[index]!r}\n" for key, column in scrapes.series.items() if column[index] is not None
    )


def fleet_pages(
    plans: Sequence[NodePlan], scrapes: Sequence[Scrapes], at_seconds: float, copies: int
) -> tuple[list[SimNode], Pages]:
    """`copies` copies of every node's page at `at_seconds`, each node renamed and its labels suffixed."""
    nodes, captured = [], {}
    for plan, s in zip(plans, scrapes, strict=True):
        index = min(range(len(s.times)), key=lambda i: abs(s.times[i] - at_seconds))
        captured[plan.name] = page_at(s, index)
        jobs = {x.training_job for x in plan.tenants_at(s.times[index]) if x.training_job}
        for k in range(copies):
            job = f"{sorted(jobs)[0]}-{k}" if len(jobs) == 1 else ""
            nodes.append(SimNode(f"{plan.name}-{k}", plan.name, job))
    by_path, series = {}, 0
    for node in nodes:
        text = for_node(captured[node.kind], node)
        series += text.count("\n")
        by_path[f"/node/{node.name}/metrics"] = gzip.compress(text.encode(), compresslevel=1)
    return nodes, Pages(by_path, series)


async def measure(
    prometheus: Path,
    rules: Sequence[Path],
    nodes: Sequence[SimNode],
    pages: Pages,
    interval_seconds: int = 30,
    warmup_seconds: float = 120.0,
    window_seconds: float = 120.0,
) -> list[GroupCost]:
    """Each rule group's evaluation time over the window (median of its readings)."""
    with tempfile.TemporaryDirectory(prefix="benign-evalcost-") as tmp:
        workdir = Path(tmp)
        async with serve_pages(pages) as page_port, aiohttp.ClientSession() as session:
            with processes() as started:
                port = free_port()
                config = prometheus_config(
                    page_port, nodes, interval_seconds, [p.resolve() for p in rules], None, None
                )
                (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
                args = [
                    str(prometheus),
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ]
                proc = start(started, "prometheus", "prometheus", args, f"http://127.0.0.1:{port}", workdir)
                await wait_ready(session, proc, "/-/ready")
                await asyncio.sleep(warmup_seconds)
                readings: dict[str, list[float]] = {}
                intervals: dict[str, float] = {}
                loop = asyncio.get_running_loop()
                end = loop.time() + window_seconds
                while loop.time() < end:
                    samples = await read_metrics(session, proc.url)
                    for labels, v in samples.get("prometheus_rule_group_last_duration_seconds", []):
                        readings.setdefault(labels["rule_group"].rsplit(";", 1)[-1], []).append(v)
                    for labels, v in samples.get("prometheus_rule_group_interval_seconds", []):
                        intervals[labels["rule_group"].rsplit(";", 1)[-1]] = v
                    await asyncio.sleep(interval_seconds)
    return sorted(
        (
            GroupCost(g, statistics.median(vs), intervals.get(g, float(interval_seconds)))
            for g, vs in readings.items()
        ),
        key=lambda c: -c.seconds / c.interval_seconds,
    )


def markdown(costs: Sequence[GroupCost], nodes: int) -> str:
    lines = [
        f"| rule group | interval | evaluation ({nodes} nodes) | share of interval | per 1,000 nodes |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in costs:
        lines.append(
            f"| {c.group} | {c.interval_seconds:g} s | {c.seconds * 1000:.1f} ms "
            f"| {100 * c.seconds / c.interval_seconds:.2f} % | {100 * c.share_per_1000_nodes(nodes):.1f} % |"
        )
    # groups run side by side, each on its own round: the sum is the rules' share of one core
    total = sum(c.seconds / c.interval_seconds for c in costs)
    lines.append(f"| **sum of all groups** | | | {100 * total:.2f} % | {100 * total * 1000 / nodes:.1f} % |")
    return "\n".join(lines)
