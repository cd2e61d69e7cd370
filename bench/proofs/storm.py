"""Storm proof: 10,000 nodes, 1,000 of them report XID 79 within a minute; the budget holds, the rest page
once as a group, the controller's memory stays bounded.

The controller runs as `serve --backend kubernetes` against the fake API server as its own process,
seeded with `--nodes` nodes and one GPU pod on each node that fires. Alerts go out open loop at a fixed
rate (`--firing` alerts spread over `--seconds`), one alert per notification.

    .venv/bin/python -m bench.proofs.storm --nodes 10000 --firing 1000 --seconds 60

Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.proofs.harness import (
    TOKEN,
    FakeKube,
    PagerSink,
    ProofError,
    Serve,
    print_table,
    query,
    rss_bytes,
    xid79_alert,
)

MIB = 1024 * 1024


@dataclass
class StormResult:
    """What one storm run measured."""

    nodes: int
    firing: int
    budget_nodes: int
    send_seconds: float = 0.0
    acked: int = 0
    lateness_max_seconds: float = 0.0
    settle_seconds: float = 0.0
    drained_seconds: float = 0.0  # first send → inbox empty after the last send
    nodes_patched: set[str] = field(default_factory=set)
    evictions: int = 0
    migrate_actions: int = 0
    grouped: int = 0
    incidents: int = 0
    pages: list[dict[str, Any]] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    api_requests: int = 0
    ledger: str = "sqlite"
    ledger_writes: int = 0  # cluster mode: creates and status writes of the GpuIncident kinds

    def checks(self) -> list[tuple[str, str, bool | None]]:
        """The table rows."""
        keys = {str(p.get("dedup_key")) for p in self.pages}
        group_keys = {k for k in keys if k.startswith("gpupulse-breaker")}
        # a drained GPU-lost node still needs a reboot: each pages on its own (human_after_migrate)
        reboot_keys = {k for k in keys if k.startswith("gpupulse-incident-")}
        group_pages = [p for p in self.pages if str(p.get("dedup_key")) in group_keys]
        last_members = len(group_pages[-1].get("history", [])) if group_pages else 0
        # a drained node whose reboot page came after the breaker opened is a member of the group
        expected_group = self.firing - len(reboot_keys)
        return [
            ("cluster / firing nodes", f"{self.nodes} / {self.firing}", None),
            (
                "alerts sent / acknowledged",
                f"{self.firing} in {self.send_seconds:.1f} s / {self.acked}",
                self.acked == self.firing,
            ),
            ("worst send lateness (open loop)", f"{self.lateness_max_seconds * 1000:.0f} ms", None),
            ("incidents opened", f"{self.incidents}", self.incidents == self.firing),
            (
                "nodes cordoned (PATCH) vs budget",
                f"{len(self.nodes_patched)} <= {self.budget_nodes}",
                0 < len(self.nodes_patched) <= self.budget_nodes,
            ),
            (
                "migrate actions started (ledger)",
                f"{self.migrate_actions}",
                self.migrate_actions <= self.budget_nodes,
            ),
            ("evictions posted", f"{self.evictions}", None),
            ("incidents in the breaker group", f"{self.grouped}", self.grouped == expected_group),
            ("page deliveries / distinct dedup keys", f"{len(self.pages)} / {len(keys)}", None),
            ("breaker group pages", f"{len(group_pages)} under {len(group_keys)} key", len(group_keys) == 1),
            (
                "drained nodes paged alone for their reboot (the rest in the group)",
                f"{len(reboot_keys)} of {len(self.nodes_patched)}",
                len(reboot_keys) <= len(self.nodes_patched) and keys == group_keys | reboot_keys,
            ),
            ("members in the last group page", f"{last_members}", last_members == expected_group),
            ("first alert to inbox drained", f"{self.drained_seconds:.1f} s", None),
            ("first alert to last page settled", f"{self.settle_seconds:.1f} s", None),
            (
                "controller RSS before / peak / after",
                f"{self.rss_before / MIB:.1f} / {self.rss_peak / MIB:.1f} / {self.rss_after / MIB:.1f} MiB",
                None,
            ),
            (
                "RSS growth (peak - before)",
                f"{(self.rss_peak - self.rss_before) / MIB:.1f} MiB",
                self.rss_peak - self.rss_before < 200 * MIB,
            ),
            ("fake API requests", f"{self.api_requests}", None),
            (
                f"ledger API writes (--kube.ledger {self.ledger})",
                f"{self.ledger_writes} ({self.ledger_writes / max(self.incidents, 1):.2f} per incident)",
                None,
            ),
        ]


def seed_cluster(nodes: int, firing: list[str]) -> dict[str, Any]:
    """`nodes` nodes; one StatefulSet GPU pod on each firing node."""
    return {
        "nodes": [{"name": f"gpu-{i:05d}"} for i in range(nodes)],
        "pods": [
            {"namespace": "train", "name": f"w-{n}", "node": n, "owner": ["StatefulSet", "w"], "gpus": 8}
            for n in firing
        ],
    }


async def _storm(
    serve: Serve,
    firing: list[str],
    seconds: float,
    res: StormResult,
    sink: PagerSink,
    wait_full_group: bool,
    settle_timeout: float,
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    samples: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            samples.append(rss_bytes(serve.pid))
            await asyncio.sleep(0.25)

    async def send(session: aiohttp.ClientSession, node: str, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        res.lateness_max_seconds = max(res.lateness_max_seconds, time.monotonic() - at)
        for _ in range(20):  # re-send like Alertmanager until acknowledged
            try:
                async with session.post(
                    serve.url + "/api/v1/alerts",
                    json={
                        "version": "4",
                        "status": "firing",
                        "receiver": "gpupulse",
                        "groupKey": node,
                        "alerts": [xid79_alert(node)],
                    },
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    await r.read()
                    if 200 <= r.status < 300:
                        res.acked += 1
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    began = time.monotonic()
    interval = seconds / max(1, len(firing))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        await asyncio.gather(*(send(session, n, began + i * interval) for i, n in enumerate(firing)))
    res.send_seconds = time.monotonic() - began
    db = serve.workdir / "state" / "gpupulse.db"

    def settled() -> bool:
        # every incident decided and, when asked, the group page lists every grouped incident
        pending = query(
            serve.workdir / "state" / "inbox.db", "SELECT count(*) FROM inbox WHERE processed_at IS NULL"
        )
        if int(pending[0][0]) > 0:
            return False
        if not res.drained_seconds:
            res.drained_seconds = time.monotonic() - began
        if not sink.pages:
            return False
        if not wait_full_group:
            return True
        grouped = int(query(db, "SELECT count(*) FROM rem_incidents WHERE page_group != ''")[0][0])
        group_pages = [p for p in sink.pages if str(p.get("dedup_key")).startswith("gpupulse-breaker")]
        return bool(group_pages) and len(group_pages[-1].get("history", [])) >= grouped > 0

    deadline = time.monotonic() + settle_timeout
    while not settled():
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    res.settle_seconds = time.monotonic() - began
    done.set()
    await sampler
    res.rss_peak = max(samples, default=0)


def run(
    nodes: int,
    firing_count: int,
    seconds: float,
    seed: int,
    workdir: Path,
    budget_nodes: int = 3,
    wait_full_group: bool = True,
    ledger: str = "sqlite",
) -> StormResult:
    """Run the proof in `workdir`."""
    rng = random.Random(seed)
    firing = [f"gpu-{i:05d}" for i in sorted(rng.sample(range(nodes), firing_count))]
    rng.shuffle(firing)
    api = FakeKube(workdir, seed_cluster(nodes, firing))
    res = StormResult(nodes=nodes, firing=firing_count, budget_nodes=budget_nodes, ledger=ledger)
    api.start()
    sink = PagerSink()

    async def body() -> None:
        await sink.start()
        serve = Serve(
            workdir,
            [
                f"--storage.path={workdir / 'state'}",
                "--backend=kubernetes",
                f"--kube.kubeconfig={api.kubeconfig}",
                "--kube.namespace=gpupulse",
                "--kube.identity=storm-0",
                f"--kube.ledger={ledger}",
                f"--cluster.node-count={nodes}",
                f"--safety.max-nodes-migrated={budget_nodes}",
                "--pager=webhook",
                f"--pager.url={sink.url}",
                "--engine.tick-interval=500ms",
                "--log.level=warning",
            ],
        )
        await asyncio.to_thread(serve.start)
        try:
            await asyncio.sleep(1.0)  # let the idle process settle before the baseline
            res.rss_before = rss_bytes(serve.pid)
            settle = 30.0 + (90.0 if wait_full_group else 0.0)
            await _storm(serve, firing, seconds, res, sink, wait_full_group, settle)
            res.rss_after = rss_bytes(serve.pid)
        finally:
            code = await asyncio.to_thread(serve.stop)
            if code != 0:
                print(f"serve exited {code}: {serve.log_tail()}", file=sys.stderr)
            res.pages = list(sink.pages)
            await sink.stop()

    try:
        asyncio.run(body())
        log = api.requests()
    finally:
        api.stop()
    res.api_requests = len(log)
    res.ledger_writes = sum(
        1 for r in log if r["method"] in ("POST", "PUT") and "/remediation.gpupulse.io/" in r["path"]
    )
    res.nodes_patched = {
        r["path"].rsplit("/", 1)[-1] for r in log if r["method"] == "PATCH" and "/nodes/" in r["path"]
    }
    res.evictions = sum(1 for r in log if r["method"] == "POST" and r["path"].endswith("/eviction"))
    db = workdir / "state" / "gpupulse.db"
    res.migrate_actions = int(
        query(
            db,
            "SELECT count(*) FROM rem_ledger WHERE kind='action' AND rung='migrate' AND status != 'blocked'",
        )[0][0]
    )
    res.grouped = int(query(db, "SELECT count(*) FROM rem_incidents WHERE page_group != ''")[0][0])
    res.incidents = int(query(db, "SELECT count(*) FROM rem_incidents")[0][0])
    return res


def main() -> int:
    """Command line: run, print the table, exit non-zero on failure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--firing", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="spread the alerts over this long")
    parser.add_argument("--budget-nodes", type=int, default=3, help="--safety.max-nodes-migrated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", default="")
    parser.add_argument("--ledger", choices=("sqlite", "kubernetes"), default="sqlite", help="--kube.ledger")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupulse-storm-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            res = run(
                args.nodes,
                args.firing,
                args.seconds,
                args.seed,
                workdir,
                args.budget_nodes,
                ledger=args.ledger,
            )
        except ProofError as e:
            print(f"storm proof could not run: {e}", file=sys.stderr)
            return 1
        title = f"storm proof: {args.nodes} nodes, {args.firing} XID 79 over {args.seconds:.0f} s"
        ok = print_table(title, res.checks())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
