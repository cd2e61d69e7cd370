"""A fleet-wide storm through a real Alertmanager HA pair into the controller: alerts in, notifications,
actions, pages, Kubernetes API writes and the time to drain.

Two Alertmanager 0.35 replicas gossip (`--cluster.peer`), routed as the chart routes (the chart's
groupBy, groupWait and matchers; groupInterval as given). Every alert is posted to both replicas, as
each Prometheus shard sends to every Alertmanager. The controller (`serve --backend kubernetes`
against the fake API server, `--cluster.node-count` the fleet) is the one webhook of both. Scenarios:

  nodes  `--alerts` GPUFellOffBus (XID 79, target_kind node) on as many nodes
  pods   `--alerts` GPUProcessMemoryAboveHardLimit (memory_leak, target_kind pod) on as many pods

    nice -n 10 .venv/bin/python -m bench.fleet_storm --fleet 10000 --alerts 300 --alerts 1000

Printed per scenario and size: what each Alertmanager received and notified, what reached the
controller (inbox rows, distinct alerts), incidents, actions by rung and outcome, targets acted on
twice (must be 0), pages, API writes, controller RSS, first post to inbox drained and to pages settled.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.proofs.harness import (
    TOKEN,
    FakeKube,
    PagerSink,
    ProofError,
    Serve,
    free_port,
    leak_alert,
    query,
    rss_bytes,
    writes,
    xid79_alert,
)
from demo.neighbours import MissingNeighbourError, neighbour_binary
from tests.alerts.children import child_process, wait_http

MIB = 1024 * 1024
CHART_GROUP_BY = ["alertname", "cluster", "node", "uuid", "namespace", "pod"]
CHART_GROUP_WAIT = "10s"


@dataclass
class StormRun:
    """What one storm measured."""

    scenario: str
    alerts: int
    fleet: int
    am_received: list[float] = field(default_factory=list)  # per replica: alerts received (firing)
    am_notified: list[float] = field(default_factory=list)  # per replica: webhook notifications sent
    am_failed: list[float] = field(default_factory=list)
    inbox_rows: int = 0
    inbox_alerts: int = 0
    incidents: int = 0
    grouped: int = 0
    actions: Counter[str] = field(default_factory=Counter)  # "rung status" -> count
    acted_twice: int = 0
    twice_examples: list[str] = field(default_factory=list)
    pages: int = 0
    page_keys: int = 0
    last_page: str = ""  # the last page's summary, shortened
    api_requests: int = 0
    api_writes: int = 0
    events: int = 0
    nodes_patched: int = 0
    pod_deletes: int = 0
    evictions: int = 0
    post_seconds: float = 0.0
    drained_seconds: float = 0.0
    settled_seconds: float = 0.0
    rss_before: int = 0
    rss_peak: int = 0
    timed_out: str = ""


def alertmanager_yaml(controller: str, token_file: Path, group_interval: str) -> dict[str, Any]:
    """The route and receiver the chart renders for the controller (AlertmanagerConfig, flattened)."""
    return {
        "route": {
            "receiver": "blackhole",
            "routes": [
                {
                    "receiver": "gpupulse-remediation",
                    "matchers": ['fault_class=~".+"', 'severity=~"critical|warning"'],
                    "group_by": CHART_GROUP_BY,
                    "group_wait": CHART_GROUP_WAIT,
                    "group_interval": group_interval,
                    "repeat_interval": "1h",
                }
            ],
        },
        "receivers": [
            {"name": "blackhole"},
            {
                "name": "gpupulse-remediation",
                "webhook_configs": [
                    {
                        "url": f"{controller}/api/v1/alerts",
                        "send_resolved": True,
                        "max_alerts": 0,
                        "http_config": {
                            "authorization": {"type": "Bearer", "credentials_file": str(token_file)}
                        },
                    }
                ],
            },
        ],
    }


def storm_alerts(scenario: str, n: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The alerts as Prometheus posts them to Alertmanager, and the fake cluster they point at."""
    now = datetime.now(UTC)
    ends = (now + timedelta(minutes=30)).isoformat()
    if scenario == "nodes":
        nodes = [f"gpu-{i:05d}" for i in range(n)]
        bodies = [xid79_alert(node) for node in nodes]
        pods = [
            {
                "namespace": "train",
                "name": f"w-{node}",
                "node": node,
                "owner": ["StatefulSet", "w"],
                "gpus": 8,
            }
            for node in nodes
        ]
    else:
        bodies = [leak_alert(i, f"gpu-{i:05d}") for i in range(n)]
        pods = [
            {
                "namespace": f"ns-{i % 50}",
                "name": f"pod-{i}",
                "node": f"gpu-{i:05d}",
                "owner": ["StatefulSet", "s"],
            }
            for i in range(n)
        ]
    out = [
        {
            "labels": b["labels"],
            "annotations": b["annotations"],
            "startsAt": now.isoformat(),
            "endsAt": ends,
            "generatorURL": "http://prometheus:9090/graph",
        }
        for b in bodies
    ]
    return out, {"pods": pods}


async def _metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def _storm(
    scenario: str, n: int, fleet: int, group_interval: str, workdir: Path, settle_timeout_seconds: float
) -> StormRun:
    run = StormRun(scenario, n, fleet)
    try:
        am_binary = neighbour_binary("alertmanager")
    except MissingNeighbourError as e:
        raise ProofError(str(e)) from e
    alerts, cluster = storm_alerts(scenario, n)
    cluster["nodes"] = [{"name": f"gpu-{i:05d}"} for i in range(fleet)]
    api = FakeKube(workdir, cluster)
    api.start()
    sink = PagerSink()
    await sink.start()
    serve = Serve(
        workdir,
        [
            f"--storage.path={workdir / 'state'}",
            "--backend=kubernetes",
            f"--kube.kubeconfig={api.kubeconfig}",
            "--kube.namespace=gpupulse",
            "--kube.identity=storm-0",
            f"--cluster.node-count={fleet}",
            "--scope.namespaces=*",
            "--pager=webhook",
            f"--pager.url={sink.url}",
            "--log.level=warning",
        ],
    )
    try:
        await asyncio.to_thread(serve.start)
        token = workdir / "token"
        token.write_text(TOKEN)
        config = workdir / "alertmanager.yml"
        config.write_text(
            yaml.safe_dump(alertmanager_yaml(serve.url, token, group_interval), sort_keys=False)
        )
        web = [free_port(), free_port()]
        gossip = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in web]
        async with aiohttp.ClientSession() as session:
            procs = []
            for i in range(2):
                args = [
                    str(am_binary),
                    f"--config.file={config}",
                    f"--storage.path={workdir / f'am-{i}'}",
                    f"--web.listen-address=127.0.0.1:{web[i]}",
                    f"--cluster.listen-address=127.0.0.1:{gossip[i]}",
                    f"--cluster.peer=127.0.0.1:{gossip[1 - i]}",
                    "--log.level=warn",
                ]
                procs.append(child_process(args, workdir / f"am-{i}.log"))
            async with procs[0] as am0, procs[1] as am1:
                for url, proc in zip(urls, (am0, am1), strict=True):
                    await wait_http(f"{url}/-/ready", proc, 60.0)
                # both replicas see each other before the storm: dedup rides on the gossiped log
                deadline = time.monotonic() + 60
                while min([await _metric(session, u, "alertmanager_cluster_members") for u in urls]) < 2:
                    if time.monotonic() > deadline:
                        raise ProofError("the Alertmanager pair did not join within 60 s")
                    await asyncio.sleep(0.5)
                await asyncio.sleep(1.0)  # the idle controller settles before its baseline
                run.rss_before = rss_bytes(serve.pid)
                await _post_and_drain(session, urls, alerts, serve, sink, run, settle_timeout_seconds)
                for url in urls:
                    run.am_received.append(
                        await _metric(session, url, "alertmanager_alerts_received_total", status="firing")
                    )
                    run.am_notified.append(
                        await _metric(session, url, "alertmanager_notifications_total", integration="webhook")
                    )
                    run.am_failed.append(
                        await _metric(
                            session, url, "alertmanager_notifications_failed_total", integration="webhook"
                        )
                    )
    finally:
        code = await asyncio.to_thread(serve.stop)
        if code != 0:
            print(f"serve exited {code}: {serve.log_tail()}", file=sys.stderr)
        run.pages = len(sink.pages)
        run.page_keys = len({str(p.get("dedup_key")) for p in sink.pages})
        run.last_page = str(sink.pages[-1].get("summary", ""))[:200] if sink.pages else ""
        await sink.stop()
        try:
            log = await asyncio.to_thread(api.requests)
        finally:
            api.stop()
    run.api_requests = len(log)
    every_write = writes(log)
    run.api_writes = len(every_write)
    # Events are created, never rewritten: a second one on an object is a second story, not an action
    actions = [r for r in every_write if not r["path"].endswith("/events")]
    run.events = len(every_write) - len(actions)
    run.nodes_patched = len({r["path"] for r in actions if r["method"] == "PATCH" and "/nodes/" in r["path"]})
    run.evictions = sum(1 for r in actions if r["method"] == "POST" and r["path"].endswith("/eviction"))
    run.pod_deletes = sum(1 for r in actions if r["method"] == "DELETE" and "/pods/" in r["path"])
    db = workdir / "state" / "gpupulse.db"
    run.incidents = int(query(db, "SELECT count(*) FROM rem_incidents")[0][0])
    run.grouped = int(query(db, "SELECT count(*) FROM rem_incidents WHERE page_group != ''")[0][0])
    for rung, status, count in query(
        db, "SELECT rung, status, count(*) FROM rem_ledger WHERE kind='action' GROUP BY rung, status"
    ):
        run.actions[f"{rung} {status}"] = int(count)
    # the same write twice on one object (a second cordon, a pod deleted twice): what HA must never do
    twice = [k for k, n in Counter((r["method"], r["path"]) for r in actions).items() if n > 1]
    run.acted_twice = len(twice)
    run.twice_examples = [f"{m} {p}" for m, p in twice[:3]]
    return run


async def _post_and_drain(
    session: aiohttp.ClientSession,
    urls: list[str],
    alerts: list[dict[str, Any]],
    serve: Serve,
    sink: PagerSink,
    run: StormRun,
    settle_timeout_seconds: float,
) -> None:
    began = time.monotonic()
    for start in range(0, len(alerts), 100):  # Prometheus' notifier batches alerts per POST
        batch = alerts[start : start + 100]
        for url in urls:
            async with session.post(f"{url}/api/v2/alerts", json=batch) as r:
                if r.status != 200:
                    raise ProofError(f"{url}: POST /api/v2/alerts answered {r.status}: {await r.text()}")
    run.post_seconds = time.monotonic() - began
    inbox = serve.workdir / "state" / "inbox.db"
    db = serve.workdir / "state" / "gpupulse.db"
    deadline = began + settle_timeout_seconds
    peak = 0
    pages_seen, last_page = 0, 0.0
    while True:
        peak = max(peak, rss_bytes(serve.pid))
        try:
            rows, distinct, pending = query(
                inbox,
                "SELECT count(*), count(DISTINCT fingerprint), sum(processed_at IS NULL) FROM inbox",
            )[0]
        except sqlite3.Error:  # the file appears with the first notification
            rows, distinct, pending = 0, 0, 1
        run.inbox_rows, run.inbox_alerts = int(rows), int(distinct)
        now = time.monotonic()
        if run.inbox_alerts >= len(alerts) and not pending and not run.drained_seconds:
            run.drained_seconds = now - began
        if len(sink.pages) != pages_seen:
            pages_seen, last_page = len(sink.pages), now
        # settled: drained, and the last page lists every incident grouped behind the breaker (its
        # updates are paced by the engine, not by the storm), then 5 s without a new page
        if run.drained_seconds and pages_seen and now - max(last_page, began + run.drained_seconds) > 5.0:
            grouped = int(query(db, "SELECT count(*) FROM rem_incidents WHERE page_group != ''")[0][0])
            if len(sink.pages[-1].get("history", [])) >= grouped:
                run.settled_seconds = last_page - began
                break
        if time.monotonic() > deadline:
            run.timed_out = (
                f"not settled within {settle_timeout_seconds:.0f} s ({run.inbox_alerts} alerts in)"
            )
            break
        await asyncio.sleep(0.25)
    run.rss_peak = peak


def print_runs(runs: list[StormRun], group_interval: str) -> None:
    """One table: a column per run."""
    print(
        f"\n### storm through an Alertmanager 0.35 HA pair (groupBy {CHART_GROUP_BY}, groupWait"
        f" {CHART_GROUP_WAIT}, groupInterval {group_interval}) into the controller\n"
    )
    header = ["", *(f"{r.scenario} x {r.alerts}" for r in runs)]
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * len(runs))
    rungs = sorted({k for r in runs for k in r.actions})
    rows: list[tuple[str, list[str]]] = [
        ("fleet (--cluster.node-count)", [f"{r.fleet:,}" for r in runs]),
        ("alerts posted to each replica", [f"{r.alerts:,} in {r.post_seconds:.1f} s" for r in runs]),
        ("received by replica 0 / 1", [" / ".join(f"{v:,.0f}" for v in r.am_received) for r in runs]),
        (
            "webhook notifications sent by 0 / 1",
            [" / ".join(f"{v:,.0f}" for v in r.am_notified) for r in runs],
        ),
        ("failed notifications 0 / 1", [" / ".join(f"{v:,.0f}" for v in r.am_failed) for r in runs]),
        (
            "inbox rows / distinct alerts",
            [f"{r.inbox_rows:,} / {r.inbox_alerts:,}" for r in runs],
        ),
        ("incidents", [f"{r.incidents:,}" for r in runs]),
        *((f"actions: {k}", [f"{r.actions.get(k, 0):,}" for r in runs]) for k in rungs),
        ("the same action written twice on one object (must be 0)", [f"{r.acted_twice}" for r in runs]),
        (
            "nodes cordoned / evictions / pod deletes",
            [f"{r.nodes_patched} / {r.evictions} / {r.pod_deletes}" for r in runs],
        ),
        (
            "Kubernetes API requests / writes (of them Events)",
            [f"{r.api_requests:,} / {r.api_writes:,} ({r.events:,})" for r in runs],
        ),
        (
            "delivered twice (both replicas notified), absorbed by the controller",
            [f"{sum(r.am_notified) - r.inbox_alerts:,.0f}" for r in runs],
        ),
        ("pages sent / distinct dedup keys", [f"{r.pages} / {r.page_keys}" for r in runs]),
        ("first post -> inbox drained", [f"{r.drained_seconds:.1f} s" for r in runs]),
        ("incidents grouped behind the breaker", [f"{r.grouped:,}" for r in runs]),
        (
            "first post -> last page (lists every grouped incident)",
            [f"{r.settled_seconds:.1f} s" for r in runs],
        ),
        (
            "controller RSS before / peak",
            [f"{r.rss_before / MIB:.0f} / {r.rss_peak / MIB:.0f} MiB" for r in runs],
        ),
    ]
    for name, cells in rows:
        print(f"| {name} | " + " | ".join(cells) + " |")
    for r in runs:
        if r.timed_out:
            print(f"\n{r.scenario} x {r.alerts}: {r.timed_out}")
        if r.last_page:
            print(f"\n{r.scenario} x {r.alerts}, last page: {r.last_page}")
        if r.twice_examples:
            print(f"\n{r.scenario} x {r.alerts}, written twice: {', '.join(r.twice_examples)}")


def main(argv: list[str] | None = None) -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--fleet", type=int, default=10_000, help="nodes in the cluster")
    parser.add_argument("--alerts", type=int, action="append", help="storm sizes (repeat); default 300, 1000")
    parser.add_argument("--scenario", action="append", choices=("nodes", "pods"), help="default both")
    parser.add_argument("--group-interval", default="1m", help="the route's group_interval (chart: 1m)")
    parser.add_argument("--settle-timeout-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    sizes = args.alerts or [300, 1000]
    if any(n < 1 or n > args.fleet for n in sizes):
        parser.error("each storm size must be between 1 and --fleet")
    runs = []
    for scenario in args.scenario or ["nodes", "pods"]:
        for n in sizes:
            with tempfile.TemporaryDirectory(prefix="gp-storm-") as tmp:
                print(f"{scenario} x {n} ...", flush=True)
                try:
                    runs.append(
                        asyncio.run(
                            _storm(
                                scenario,
                                n,
                                args.fleet,
                                args.group_interval,
                                Path(tmp),
                                args.settle_timeout_seconds,
                            )
                        )
                    )
                except ProofError as e:
                    print(f"fleet_storm: {e}", file=sys.stderr)
                    return 1
    print_runs(runs, args.group_interval)
    return 0 if all(not r.timed_out and r.acted_twice == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
