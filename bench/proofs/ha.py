"""Cluster-mode proof (docs/design/ha.md): two `serve` replicas, each with its own storage dir (the
emptyDir of a pod), incidents as GpuIncident objects on the fake API server, every alert sent to both
replicas (Alertmanager's one webhook URL per replica). The leader is SIGKILLed and its storage dir
deleted, as when its node is lost:

  action  during a migrate its PodDisruptionBudget holds up: the follower takes over, finds the
          migrate `started` in the cluster and takes it again once, which the node's Lease (still
          the dead leader's) refuses before any write: it marks it interrupted and pages; no second
          cordon.
  stream  during a stream of alerts (`--alerts`, in notifications of `--batch`), with --dry-run: every
          alert that either replica accepted has exactly one incident in the cluster.

    .venv/bin/python -m bench.proofs.ha --alerts 10000 --lease-duration 15

Prints one table per scenario (API writes per incident, ingest rate per replica, takeover time) and
exits 0 when every check passes, 1 otherwise. Numbers on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.proofs.failover import SEED, SIGNATURE
from bench.proofs.harness import (
    FakeKube,
    PagerSink,
    ProofError,
    Serve,
    alert,
    leak_alert,
    notification,
    post,
    print_table,
    sleep_until,
    writes,
)
from gpupulse.durations import format_duration

Check = tuple[str, str, bool | None]


@dataclass
class HAResult:
    """What one scenario measured."""

    scenario: str
    lease_seconds: int
    retry_seconds: float
    takeover_seconds: float = 0.0
    ready_seconds: float = 0.0
    holder: str = ""
    sent: int = 0
    accepted: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    incidents: int = 0
    incident_creates: int = 0
    incident_status_writes: int = 0
    ingest_per_second: dict[str, float] = field(default_factory=dict)
    action_writes_before: list[str] = field(default_factory=list)
    action_writes_after: list[str] = field(default_factory=list)
    migrate_statuses: list[str] = field(default_factory=list)
    pages: int = 0

    def checks(self) -> list[Check]:
        """The table rows."""
        bound = self.lease_seconds + 2 * self.retry_seconds
        rows: list[Check] = [
            (
                "SIGKILL → follower holds the Lease",
                f"{self.takeover_seconds:.2f} s (lease {self.lease_seconds} s + retry {self.retry_seconds} s"
                f" = {self.lease_seconds + self.retry_seconds:.1f} s; bound {bound:.1f} s)",
                0 < self.takeover_seconds <= bound,
            ),
            ("SIGKILL → follower ready (ledger rebuilt)", f"{self.ready_seconds:.2f} s", None),
            ("Lease holder", self.holder, self.holder == "replica-b"),
            (
                "API writes per incident (create + status)",
                f"{(self.incident_creates + self.incident_status_writes) / max(self.incidents, 1):.2f} "
                f"({self.incident_creates} creates, {self.incident_status_writes} status writes, "
                f"{self.incidents} incidents)",
                None,
            ),
        ]
        if self.scenario == "stream":
            rate = ", ".join(f"{k} {v:.0f}/s" for k, v in sorted(self.ingest_per_second.items()))
            rows += [
                ("alerts sent / accepted by a replica", f"{self.sent} / {self.accepted}", self.accepted > 0),
                (
                    "accepted alerts without an incident (lost)",
                    f"{len(self.lost)} {self.lost[:3]}",
                    not self.lost,
                ),
                (
                    "alerts with more than one incident",
                    f"{len(self.duplicated)} {self.duplicated[:3]}",
                    not self.duplicated,
                ),
                ("ingest rate per replica (fan-out)", rate, None),
            ]
        else:
            rows += [
                ("action writes before the kill", ", ".join(sorted(set(self.action_writes_before))), None),
                (
                    "action writes after the kill (repeats)",
                    f"{len(self.action_writes_after)} {self.action_writes_after[:3]}",
                    not self.action_writes_after,
                ),
                (
                    "migrate entries in the GpuIncident",
                    ", ".join(self.migrate_statuses),
                    self.migrate_statuses == ["interrupted"],
                ),
                ("pages sent", str(self.pages), self.pages == 1),
            ]
        return rows


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def _incidents(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for k, o in state.get("custom", {}).items() if k.startswith("gpuincidents/")]


class Pair:
    """Two replicas, each on its own storage dir, both given every alert."""

    def __init__(
        self, workdir: Path, api: FakeKube, lease: int, renew: float, retry: float, extra: list[str]
    ):
        common = [
            "--backend=kubernetes",
            f"--kube.kubeconfig={api.kubeconfig}",
            "--kube.namespace=gpupulse",
            "--kube.leader-election",
            "--kube.ledger=kubernetes",
            f"--kube.lease-duration={format_duration(lease)}",
            f"--kube.renew-deadline={format_duration(renew)}",
            f"--kube.retry-period={format_duration(retry)}",
            "--engine.tick-interval=200ms",
            "--log.level=warning",
            "--scope.namespaces=*",  # the leaks are spread over ns-0 .. ns-49
            *extra,
        ]
        self.dirs = {n: workdir / f"state-{n}" for n in ("a", "b")}
        self.a = Serve(
            workdir, [*common, f"--storage.path={self.dirs['a']}", "--kube.identity=replica-a"], "replica-a"
        )
        self.b = Serve(
            workdir, [*common, f"--storage.path={self.dirs['b']}", "--kube.identity=replica-b"], "replica-b"
        )

    async def start(self) -> None:
        await asyncio.to_thread(self.a.start)
        await asyncio.to_thread(self.b.start, False)
        if self.b.ready():
            raise ProofError("the follower reports ready while the other replica leads")

    def lose_leader_node(self) -> tuple[float, float]:
        """SIGKILL the leader and delete its storage; returns (wall, monotonic) time of the kill."""
        self.a.kill()
        at = (time.time(), time.monotonic())
        shutil.rmtree(self.dirs["a"], ignore_errors=True)
        return at

    def stop(self) -> None:
        code = self.b.stop()
        self.a.kill()
        if code != 0:
            print(f"replica-b exit {code}: {self.b.log_tail()}", file=sys.stderr)


def _fan_out(urls: list[str], payload: Any) -> list[int]:
    """Alertmanager's fan-out: the same notification to every replica; a dead one fails on its own."""
    out = []
    for url in urls:
        try:
            out.append(post(url, payload, timeout_seconds=10.0))
        except OSError:
            out.append(0)
    return out


def _timed_post(name: str, url: str, payload: Any) -> tuple[str, int, float]:
    began = time.monotonic()
    return name, _fan_out([url], payload)[0], time.monotonic() - began


async def _takeover(
    pair: Pair, api: FakeKube, killed: tuple[float, float], lease: int, res: HAResult
) -> None:
    await sleep_until(pair.b.ready, lease * 3 + 30, "the follower to take over")
    res.ready_seconds = time.monotonic() - killed[1]
    lease_obj = api.state()["leases"]["gpupulse/gpupulse-remediation-leader"]["spec"]
    res.holder = str(lease_obj.get("holderIdentity", ""))
    res.takeover_seconds = _parse_time(str(lease_obj.get("acquireTime"))) - killed[0]


def _actions(log: list[dict[str, Any]]) -> list[str]:
    """Writes that act on the cluster (the ledger's own objects and the audit trail's Events left out)."""
    return [
        f"{r['method']} {r['path']}"
        for r in writes(log)
        if "/remediation.gpupulse.io/" not in r["path"] and not r["path"].endswith("/events")
    ]


def _count_writes(api: FakeKube, res: HAResult) -> None:
    log = api.requests()
    res.incident_creates = sum(
        1 for r in log if r["method"] == "POST" and r["path"].endswith("/gpuincidents")
    )
    res.incident_status_writes = sum(
        1
        for r in log
        if r["method"] == "PUT" and "/gpuincidents/" in r["path"] and r["path"].endswith("/status")
    )


async def _action(workdir: Path, lease: int, renew: float, retry: float, verify: int, res: HAResult) -> None:
    sigdir = workdir / "signatures"
    sigdir.mkdir(exist_ok=True)
    (sigdir / "proof.yaml").write_text(SIGNATURE.replace("VERIFY", str(verify)))
    api = FakeKube(workdir, SEED)
    api.start()
    sink = PagerSink()
    await sink.start()
    pair = Pair(
        workdir,
        api,
        lease,
        renew,
        retry,
        [f"--signatures={sigdir}", "--pager=webhook", f"--pager.url={sink.url}"],
    )
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
    try:
        await pair.start()
        if 200 not in _fan_out([pair.a.url, pair.b.url], notification([lost])):
            raise ProofError("no replica accepted the alert")
        await sleep_until(
            lambda: any(r["path"].endswith("/eviction") for r in api.requests()), 30, "an eviction attempt"
        )
        before = api.requests()
        killed = pair.lose_leader_node()
        await _takeover(pair, api, killed, lease, res)
        _fan_out([pair.b.url], notification([lost]))  # Alertmanager's repeat reaches the survivor
        await sleep_until(lambda: bool(sink.pages), verify + 30, "the new leader's page")
        await asyncio.sleep(max(2.0, 4 * retry))  # a bounded look for late duplicates
        after = api.requests()[len(before) :]
        state = api.state()
        _count_writes(api, res)
    finally:
        pair.stop()
        api.stop()
        res.pages = len(sink.pages)
        await sink.stop()
    res.action_writes_before = _actions(before)
    res.action_writes_after = _actions(after)
    objs = _incidents(state)
    res.incidents = len(objs)
    res.migrate_statuses = [
        str(e["status"])
        for o in objs
        for e in o.get("status", {}).get("entries", [])
        if e.get("kind") == "action" and e.get("rung") == "migrate"
    ]


async def _stream(
    workdir: Path,
    lease: int,
    renew: float,
    retry: float,
    alerts: int,
    batch: int,
    res: HAResult,
    fan_out: bool = True,
) -> None:
    api = FakeKube(workdir, {"nodes": [{"name": f"node-{i}"} for i in range(500)]})
    api.start()
    pair = Pair(workdir, api, lease, renew, retry, ["--dry-run"])
    accepted: set[str] = set()
    took: Counter[str] = Counter()
    spent: dict[str, float] = {"replica-a": 0.0, "replica-b": 0.0}
    try:
        await pair.start()
        kill_after = alerts // 2
        killed: tuple[float, float] | None = None
        pool = ThreadPoolExecutor(max_workers=2)
        loop = asyncio.get_running_loop()
        for start in range(0, alerts, batch):
            if killed is None and start >= kill_after:
                killed = pair.lose_leader_node()
            chunk = [leak_alert(i) for i in range(start, min(start + batch, alerts))]
            payload = notification(chunk)
            targets = [("replica-a", pair.a.url), ("replica-b", pair.b.url)]
            if killed is not None:
                targets = targets[1:]
            elif not fan_out:  # the shape the proof guards against: one URL, reaching only the leader
                targets = targets[:1]

            results = await asyncio.gather(
                *(loop.run_in_executor(pool, _timed_post, n, u, payload) for n, u in targets)
            )
            for name, code, seconds in results:
                spent[name] += seconds
                if code == 200:
                    took[name] += len(chunk)
                    accepted.update(a["labels"]["pod"] for a in chunk)
            res.sent += len(chunk)
        pool.shutdown()
        assert killed is not None
        await _takeover(pair, api, killed, lease, res)

        # until every accepted alert has its incident, or the count stood still for 3 s (lost ones)
        deadline = time.monotonic() + 120 + alerts / 50
        last, still_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            count = len(_incidents(api.state()))
            if count >= len(accepted):
                break
            if count != last:
                last, still_since = count, time.monotonic()
            elif time.monotonic() - still_since > 3.0:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)
        state = api.state()
        _count_writes(api, res)
    finally:
        pair.stop()
        api.stop()
    res.accepted = len(accepted)
    res.ingest_per_second = {n: took[n] / spent[n] for n in took if spent[n] > 0}
    per_pod: Counter[str] = Counter()
    for obj in _incidents(state):
        per_pod[str(obj["spec"]["target"]).rsplit("/", 1)[-1]] += 1
    res.incidents = sum(per_pod.values())
    res.lost = sorted(p for p in accepted if per_pod[p] == 0)
    res.duplicated = sorted(p for p, n in per_pod.items() if n > 1)


def run(
    scenario: str,
    workdir: Path,
    lease: int = 15,
    renew: float = 10.0,
    retry: float = 2.0,
    alerts: int = 10_000,
    batch: int = 100,
    verify: int = 3,
    fan_out: bool = True,
) -> HAResult:
    """One scenario ("action" or "stream") in `workdir`."""
    res = HAResult(scenario=scenario, lease_seconds=lease, retry_seconds=retry)
    if scenario == "action":
        asyncio.run(_action(workdir, lease, renew, retry, verify, res))
    else:
        asyncio.run(_stream(workdir, lease, renew, retry, alerts, batch, res, fan_out))
    return res


def main() -> int:
    """Command line: both scenarios, a table each; exit non-zero on any failed check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lease-duration", type=int, default=15)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    parser.add_argument("--alerts", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--scenario", choices=("action", "stream", "both"), default="both")
    args = parser.parse_args()
    ok = True
    for scenario in ("action", "stream") if args.scenario == "both" else (args.scenario,):
        with tempfile.TemporaryDirectory(prefix=f"gpupulse-ha-{scenario}-") as tmp:
            try:
                res = run(
                    scenario,
                    Path(tmp),
                    args.lease_duration,
                    args.renew_deadline,
                    args.retry_period,
                    args.alerts,
                    args.batch,
                )
            except ProofError as exc:
                print(f"{scenario}: {exc}", file=sys.stderr)
                ok = False
                continue
            ok = print_table(f"cluster mode, leader's node lost during {scenario}", res.checks()) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
