"""Failover proof: two `serve` replicas with leader election on one storage dir; the leader is SIGKILLed
mid-ladder (its drain blocked by a PodDisruptionBudget); the follower takes over within the lease and
finishes the ladder without repeating an action.

One fake API server process, one shared `--storage.path` (the one-active-writer shape of
docs/reliability.md: only the leader opens the ledger). A proof signature gives the ladder
`migrate, page` with a short verify window so the run ends in seconds.

    .venv/bin/python -m bench.proofs.failover --lease-duration 15 --runs 3

Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.proofs.harness import (
    FakeKube,
    PagerSink,
    ProofError,
    Serve,
    alert,
    notification,
    post,
    print_table,
    query,
    sleep_until,
    writes,
)
from gpupulse.durations import format_duration

SIGNATURE = """signatures:
  - name: proof-gpu-lost
    description: XID 79 with a short verify window, for the failover proof only.
    fault_class: gpu_lost
    priority: 10
    match:
      labels: {fault_class: gpu_lost, proof: failover}
    ladder:
      rungs: [migrate, page]
      attempts: {migrate: 1}
      verify_window_seconds: VERIFY
      cooldown_seconds: 600
    restart_fixes: false
    reason: "proof"
    source: "bench/proofs/failover.py"
"""
SEED: dict[str, Any] = {
    "nodes": [{"name": "gpu-1"}, {"name": "gpu-2"}],
    "pods": [
        {
            "namespace": "train",
            "name": "trainer-0",
            "node": "gpu-1",
            "owner": ["StatefulSet", "trainer"],
            "labels": {"app": "trainer"},
            "gpus": 8,
        }
    ],
    "pdbs": [
        {
            "namespace": "train",
            "name": "trainer",
            "match_labels": {"app": "trainer"},
            "disruptions_allowed": 0,
        }
    ],
}


@dataclass
class FailoverResult:
    """What one failover run measured."""

    lease_seconds: int
    retry_seconds: float
    takeover_seconds: float = 0.0  # SIGKILL → the follower's acquireTime on the leader Lease
    ready_seconds: float = 0.0  # SIGKILL → the follower's /readyz (engine built, ledger recovered)
    holder: str = ""
    transitions: int = 0
    writes_before: list[str] = field(default_factory=list)
    writes_after: list[str] = field(default_factory=list)
    evictions_refused: int = 0
    pod_still_there: bool = False
    pages: list[dict[str, Any]] = field(default_factory=list)
    migrate_rows: list[str] = field(default_factory=list)
    redelivery_status: int = 0

    def checks(self) -> list[tuple[str, str, bool | None]]:
        """The table rows."""
        cordons = [w for w in self.writes_before if w.startswith("PATCH") and w.endswith("/nodes/gpu-1")]
        page_hist = (
            [h.get("rung") for h in self.pages[0].get("history", []) if h.get("rung")] if self.pages else []
        )
        return [
            ("leader writes before the kill", ", ".join(sorted(set(self.writes_before))), len(cordons) == 1),
            ("evictions refused by the PDB (429)", f"{self.evictions_refused}", self.evictions_refused >= 1),
            # client-go's rule: a candidate takes over one lease duration after it *saw* the record
            # change, and it looks once per retry period, so the bound from the kill is lease + 2 retries
            (
                "SIGKILL → follower holds the Lease",
                f"{self.takeover_seconds:.2f} s (bound {self.lease_seconds + 2 * self.retry_seconds:.1f} s)",
                0 < self.takeover_seconds <= self.lease_seconds + 2 * self.retry_seconds,
            ),
            ("SIGKILL → follower ready (ledger recovered)", f"{self.ready_seconds:.2f} s", None),
            (
                "Lease holder / transitions",
                f"{self.holder} / {self.transitions}",
                self.holder == "replica-b" and self.transitions == 1,
            ),
            (
                "alert re-delivered to the follower",
                f"HTTP {self.redelivery_status}",
                self.redelivery_status == 200,
            ),
            (
                "API action writes after the kill",
                f"{len(self.writes_after)} {self.writes_after[:3]}",
                not self.writes_after,
            ),
            (
                "migrate rows in the ledger",
                ", ".join(self.migrate_rows),
                self.migrate_rows == ["interrupted"],
            ),
            ("PDB honoured (pod not evicted)", f"{self.pod_still_there}", self.pod_still_there),
            (
                "pages sent / ladder in the page",
                f"{len(self.pages)} / {page_hist}",
                len(self.pages) == 1 and page_hist[:1] == ["migrate"] and page_hist[-1:] == ["page"],
            ),
        ]


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


async def _run(
    workdir: Path, lease: int, renew: float, retry: float, verify: int, res: FailoverResult
) -> None:
    sigdir = workdir / "signatures"
    sigdir.mkdir(exist_ok=True)
    (sigdir / "proof.yaml").write_text(SIGNATURE.replace("VERIFY", str(verify)))
    api = FakeKube(workdir, SEED)
    api.start()
    sink = PagerSink()
    await sink.start()
    common = [
        f"--storage.path={workdir / 'state'}",
        "--backend=kubernetes",
        f"--kube.kubeconfig={api.kubeconfig}",
        "--kube.namespace=gpupulse",
        "--kube.leader-election",
        # in the flag grammar (gpupulse.durations): "2.0s" is refused, "2s" and "1500ms" are not
        f"--kube.lease-duration={format_duration(lease)}",
        f"--kube.renew-deadline={format_duration(renew)}",
        f"--kube.retry-period={format_duration(retry)}",
        f"--signatures={sigdir}",
        "--pager=webhook",
        f"--pager.url={sink.url}",
        "--engine.tick-interval=200ms",
    ]
    a = Serve(workdir, [*common, "--kube.identity=replica-a"], name="replica-a")
    b = Serve(workdir, [*common, "--kube.identity=replica-b"], name="replica-b")
    try:
        await asyncio.to_thread(a.start)
        await asyncio.to_thread(b.start, False)  # a follower is alive but not ready
        if b.ready():
            raise ProofError("the follower reports ready while the other replica leads")
        lost = alert(
            "79000000000000a1",
            {
                "alertname": "GPUFellOffBus",
                "fault_class": "gpu_lost",
                "xid": "79",
                "proof": "failover",
                "target_kind": "node",
                "node": "gpu-1",
                "layer": "hardware",
            },
        )
        if post(a.url, notification([lost])) != 200:
            raise ProofError("the leader did not accept the alert")
        await sleep_until(
            lambda: any(r["path"].endswith("/eviction") for r in api.requests()), 30, "an eviction attempt"
        )
        before = api.requests()
        a.kill()
        killed_at = time.time()
        killed_mono = time.monotonic()
        await sleep_until(b.ready, lease * 3 + 10, "the follower to take over")
        res.ready_seconds = time.monotonic() - killed_mono
        # Alertmanager keeps re-sending a firing alert (repeat/group interval); the Service now reaches b
        res.redelivery_status = post(b.url, notification([lost]))
        await sleep_until(lambda: bool(sink.pages), verify + 30, "the follower's page")
        await asyncio.sleep(max(2.0, 4 * retry))  # a bounded look for late duplicates
        after = api.requests()[len(before) :]
        state = api.state()
    finally:
        b.stop()
        a.kill()
        api.stop()
        res.pages = list(sink.pages)
        await sink.stop()
    # the audit trail's Events left out: the follower tells that it took the drain again (and that the
    # node's Lease, still the dead leader's, refused it); they act on nothing
    res.writes_before = [f"{r['method']} {r['path']}" for r in writes(before) if not _event(r)]
    res.writes_after = [f"{r['method']} {r['path']}" for r in writes(after) if not _event(r)]
    res.evictions_refused = sum(1 for r in before if r["path"].endswith("/eviction"))
    lease_obj = state["leases"]["gpupulse/gpupulse-remediation-leader"]["spec"]
    res.holder = str(lease_obj.get("holderIdentity", ""))
    res.transitions = int(lease_obj.get("leaseTransitions", 0))
    res.takeover_seconds = _parse_time(str(lease_obj.get("acquireTime"))) - killed_at
    res.pod_still_there = "train/trainer-0" in state["pods"]
    res.migrate_rows = [
        str(s)
        for (s,) in query(
            workdir / "state" / "gpupulse.db",
            "SELECT status FROM rem_ledger WHERE kind='action' AND rung='migrate' ORDER BY id",
        )
    ]
    if b.stop() != 0:
        print(f"replica-b exit: {b.log_tail()}", file=sys.stderr)


def _event(request: Mapping[str, Any]) -> bool:
    return str(request["path"]).endswith("/events")


def run(
    workdir: Path, lease: int = 15, renew: float = 10.0, retry: float = 2.0, verify: int = 5
) -> FailoverResult:
    """One failover run in `workdir`."""
    res = FailoverResult(lease_seconds=lease, retry_seconds=retry)
    asyncio.run(_run(workdir, lease, renew, retry, verify, res))
    return res


def main() -> int:
    """Command line: run `--runs` times, print a table per run, exit non-zero on any failure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lease-duration", type=int, default=15)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    parser.add_argument("--verify-window", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workdir", default="")
    args = parser.parse_args()
    ok = True
    summary: list[dict[str, float]] = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpupulse-failover-") as tmp:
            workdir = Path(args.workdir) / f"run-{i}" if args.workdir else Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            try:
                res = run(
                    workdir, args.lease_duration, args.renew_deadline, args.retry_period, args.verify_window
                )
            except ProofError as e:
                print(f"failover proof could not run: {e}", file=sys.stderr)
                return 1
            ok = (
                print_table(f"failover proof run {i + 1}: lease {args.lease_duration} s", res.checks()) and ok
            )
            summary.append(
                {"takeover_s": round(res.takeover_seconds, 2), "ready_s": round(res.ready_seconds, 2)}
            )
    print("\nsummary:", json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
