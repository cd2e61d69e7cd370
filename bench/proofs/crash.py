"""Crash proof: stream alerts into `serve`, SIGKILL it at random points; nothing lost, nothing repeated.

Every alert is a memory_leak on its own pod, so each one that is processed starts exactly one restart
(the local backend's command appends `<rung> <namespace> <pod>` to a log file). The client behaves like
Alertmanager: an alert counts as accepted only on a 2xx, and anything else is re-sent.

    .venv/bin/python -m bench.proofs.crash --alerts 10000 --kills 5

Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.proofs.harness import (
    TOKEN,
    FakeKube,
    ProofError,
    Serve,
    inbox_rows,
    leak_alert,
    notification,
    print_table,
    query,
    wait_until,
)


@dataclass
class CrashResult:
    """What one crash run measured."""

    alerts: int
    acked: int
    posts: int
    failed_posts: int
    kills: list[tuple[int, int, float]] = field(default_factory=list)  # (acked at kill, pending, restart s)
    stream_seconds: float = 0.0
    drain_seconds: float = 0.0
    inbox_rows: int = 0
    inbox_unprocessed: int = 0
    inbox_duplicates: int = 0
    handled_keys: int = 0
    incidents: int = 0
    action_lines: int = 0
    repeated_targets: int = 0
    ledger_actions: dict[str, int] = field(default_factory=dict)
    untracked_actions: int = 0
    # Kubernetes backend: most GETs of one pod; a restart a kill left unconfirmed is taken again, which
    # reads its pod once more (to delete it only while its UID is the one recorded): 2 at most
    pod_reads_max: int = 0

    def checks(self) -> list[tuple[str, str, bool | None]]:
        """The table rows: what was measured and whether it passes."""
        kills = ", ".join(f"{a} acked/{p} pending/{r:.1f}s up" for a, p, r in self.kills)
        return [
            ("alerts streamed", f"{self.alerts} ({self.posts} posts, {self.failed_posts} not 2xx)", None),
            ("SIGKILLs (acked, inbox pending, restart)", kills or "none", len(self.kills) > 0),
            ("stream / drain time", f"{self.stream_seconds:.1f} s / {self.drain_seconds:.1f} s", None),
            ("every alert acknowledged", f"{self.acked}/{self.alerts}", self.acked == self.alerts),
            ("acked alerts in the inbox", f"{self.inbox_rows}", self.inbox_rows == self.alerts),
            ("inbox duplicates", f"{self.inbox_duplicates}", self.inbox_duplicates == 0),
            ("inbox rows unprocessed", f"{self.inbox_unprocessed}", self.inbox_unprocessed == 0),
            ("engine dedup keys (rem_handled)", f"{self.handled_keys}", self.handled_keys == self.alerts),
            ("incidents opened", f"{self.incidents}", self.incidents == self.alerts),
            ("restarts done (command lines / API DELETEs)", f"{self.action_lines}", None),
            ("targets restarted more than once", f"{self.repeated_targets}", self.repeated_targets == 0),
            ("ledger restart actions by status", json.dumps(self.ledger_actions, sort_keys=True), None),
            ("actions done without a ledger row", f"{self.untracked_actions}", self.untracked_actions == 0),
            ("Kubernetes: most GETs of one pod", f"{self.pod_reads_max}", self.pod_reads_max <= 2),
        ]


async def _stream(
    serve: Serve,
    total: int,
    kill_at: list[int],
    concurrency: int,
    per_post: int,
    res: CrashResult,
    kube: bool,
) -> None:
    """Post every alert until it is acknowledged; SIGKILL and restart the controller at the kill points."""
    todo: asyncio.Queue[list[int]] = asyncio.Queue()
    for start in range(0, total, per_post):
        todo.put_nowait(list(range(start, min(total, start + per_post))))
    acked: set[int] = set()
    bodies = {i: leak_alert(i, f"n-{i}" if kube else "") for i in range(total)}
    restarting = asyncio.Event()
    progress = asyncio.Event()  # set whenever more alerts were acknowledged
    restarting.set()  # set = the server is up
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def client(session: aiohttp.ClientSession) -> None:
        while len(acked) < total:
            try:
                batch = todo.get_nowait()
            except asyncio.QueueEmpty:
                await asyncio.sleep(0.01)
                continue
            await restarting.wait()
            status = 0
            try:
                async with session.post(
                    serve.url + "/api/v1/alerts",
                    json=notification([bodies[i] for i in batch]),
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    status = r.status
                    await r.read()
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            res.posts += 1
            if 200 <= status < 300:
                acked.update(batch)
                progress.set()
            else:
                res.failed_posts += 1
                todo.put_nowait(batch)  # Alertmanager re-sends what was not acknowledged

    async def killer() -> None:
        for point in kill_at:
            while len(acked) < point:
                progress.clear()
                await progress.wait()
            restarting.clear()
            serve.kill()
            pending = query(
                serve.workdir / "state" / "inbox.db", "SELECT count(*) FROM inbox WHERE processed_at IS NULL"
            )
            began = time.monotonic()
            await asyncio.to_thread(serve.start)
            res.kills.append((len(acked), int(pending[0][0]), time.monotonic() - began))
            restarting.set()

    async with aiohttp.ClientSession() as session:
        kill_task = asyncio.create_task(killer())
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        await kill_task
    res.acked = len(acked)


def _unprocessed(storage: Path) -> int:
    return int(query(storage / "inbox.db", "SELECT count(*) FROM inbox WHERE processed_at IS NULL")[0][0])


def kube_seed(alerts: int) -> dict[str, Any]:
    """One StatefulSet pod per alert, each on its own node (so node Leases never contend)."""
    return {
        "nodes": [{"name": f"n-{i}"} for i in range(alerts)],
        "pods": [
            {"namespace": f"ns-{i % 50}", "name": f"pod-{i}", "node": f"n-{i}", "owner": ["StatefulSet", "s"]}
            for i in range(alerts)
        ],
    }


def run(
    alerts: int,
    kills: int,
    seed: int,
    workdir: Path,
    concurrency: int = 8,
    per_post: int = 1,
    backend: str = "local",
) -> CrashResult:
    """Run the proof in `workdir`; the result holds every figure the table prints."""
    rng = random.Random(seed)
    storage = workdir / "state"
    action_log = workdir / "actions.log"
    action_log.touch()
    api: FakeKube | None = None
    if backend == "kubernetes":
        api = FakeKube(workdir, kube_seed(alerts))
        api.start()
        backend_args = [
            "--backend=kubernetes",
            f"--kube.kubeconfig={api.kubeconfig}",
            "--kube.namespace=gpupulse",
            "--kube.identity=crash-0",
        ]
    else:
        script = f'printf "%s %s %s\\n" "$0" "$1" "$2" >> {action_log}'
        backend_args = [
            "--backend=local",
            f"--backend.local.restart-command=/bin/sh -c '{script}' restart {{namespace}} {{pod}}",
        ]
    serve = Serve(
        workdir,
        [
            f"--storage.path={storage}",
            *backend_args,
            "--engine.tick-interval=200ms",
            "--safety.max-concurrent-actions=64",
            "--safety.max-actions-per-minute=10000000",
            "--cluster.node-count=100000",
            "--scope.namespaces=*",  # the leaks are spread over ns-0 .. ns-49
            f"--queue.max-pending={alerts + 1}",
            "--log.level=warning",
        ],
    )
    res = CrashResult(alerts=alerts, acked=0, posts=0, failed_posts=0)
    # kill points: uniform over the stream, plus the last one during the drain after the stream ends
    points = sorted(rng.sample(range(1, alerts), kills - 1)) if kills > 1 else []
    serve.start()
    try:
        began = time.monotonic()
        asyncio.run(_stream(serve, alerts, points, concurrency, per_post, res, api is not None))
        res.stream_seconds = time.monotonic() - began
        drain_began = time.monotonic()
        if kills > 0:  # one more kill while the engine is still working through the backlog
            pending = _unprocessed(storage)
            serve.kill()
            restart_began = time.monotonic()
            serve.start()
            res.kills.append((res.acked, pending, time.monotonic() - restart_began))
        wait_until(lambda: _unprocessed(storage) == 0, max(120.0, alerts / 20), "the inbox to drain", 0.5)
        res.drain_seconds = time.monotonic() - drain_began
        if api is not None:
            # the Kubernetes evidence: one line per DELETE the API server received, like the local log
            log = api.requests()
            res.pod_reads_max = max(
                Counter(r["path"] for r in log if r["method"] == "GET" and "/pods/" in r["path"]).values(),
                default=0,
            )
            with action_log.open("a") as f:
                for r in log:
                    if r["method"] == "DELETE":
                        _, _, _, _, ns, _, pod = r["path"].split("/")
                        f.write(f"restart {ns} {pod} {r['body']['preconditions']['uid']}\n")
    finally:
        code = serve.stop()
        if code != 0:
            print(f"serve exited {code}: {serve.log_tail()}", file=sys.stderr)
        if api is not None:
            api.stop()
    rows = inbox_rows(storage)
    res.inbox_rows = sum(1 for fp in rows if int(fp, 16) < alerts)
    res.inbox_duplicates = sum(n - 1 for n, _ in rows.values())
    res.inbox_unprocessed = sum(1 for _, p in rows.values() if p is None)
    db = storage / "gpupulse.db"
    res.handled_keys = int(
        query(db, "SELECT count(*) FROM rem_handled WHERE dedup_key LIKE '%|firing'")[0][0]
    )
    res.incidents = int(query(db, "SELECT count(*) FROM rem_incidents")[0][0])
    lines = [ln.split() for ln in action_log.read_text().splitlines() if ln.strip()]
    per_target = Counter((ln[1], ln[2]) for ln in lines)
    res.action_lines = len(lines)
    res.repeated_targets = sum(1 for n in per_target.values() if n > 1)
    res.ledger_actions = {
        str(status): int(n)
        for status, n in query(
            db,
            "SELECT status, count(*) FROM rem_ledger WHERE kind = 'action' AND rung = 'restart' GROUP BY 1",
        )
    }
    recorded = {
        (str(ns), str(pod))
        for ns, pod in query(
            db,
            "SELECT i.target_namespace, i.target_pod FROM rem_ledger l JOIN rem_incidents i"
            " ON i.id = l.incident_id WHERE l.kind = 'action' AND l.rung = 'restart'",
        )
    }
    res.untracked_actions = sum(1 for t in per_target if t not in recorded)
    return res


def main() -> int:
    """Command line: run, print the table, exit non-zero on failure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--alerts", type=int, default=10_000)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--alerts-per-post", type=int, default=1)
    parser.add_argument("--backend", choices=("local", "kubernetes"), default="local")
    parser.add_argument("--workdir", default="", help="keep state and logs here (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupulse-crash-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            res = run(
                args.alerts,
                args.kills,
                args.seed,
                workdir,
                args.concurrency,
                args.alerts_per_post,
                args.backend,
            )
        except ProofError as e:
            print(f"crash proof could not run: {e}", file=sys.stderr)
            return 1
        title = f"crash proof: {args.alerts} alerts, {args.kills} SIGKILLs, {args.backend} backend"
        title += f", seed {args.seed}"
        ok = print_table(title, res.checks())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
