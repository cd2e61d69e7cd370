"""The remediation path behind an Alertmanager HA pair: a real Prometheus 3 sends three leak alerts to two
real Alertmanager 0.35 replicas, each with a webhook to one real `gpupulse-remediation serve` (local
backend: its restart command appends the pod to a file), and every alert is acted on once.

Two shapes of the pair: gossiping (one cluster: the replica second in line sees in the gossiped
notification log that the first has sent, and stays quiet), and unable to gossip (each a cluster of
one, as in a network partition: both deliver every notification, which Alertmanager's at-least-once
delivery allows). In both, the controller restarts each pod once, counted by the command's own
output, the ledger and the actions metric; each replica's webhook deliveries are counted from its
own metrics, so the partition case shows the duplicates really reached the controller (whose inbox
stores the second copy of a (fingerprint, startsAt, status) as a duplicate, not as an alert).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from demo.neighbours import MissingNeighbourError, neighbour_binary
from remediation.settings import DB_FILENAME, INBOX_FILENAME
from tests.alerts.children import child_process, wait_http
from tests.alerts.layers import until
from tests.fakes.intake import TOKEN
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

PODS = ("llm-0", "llm-1", "llm-2")
NAMESPACE = "serving"
ALERT = "GPUProcessMemoryAboveHardLimit"
RULE_LABELS = {"severity": "critical", "fault_class": "memory_leak", "target_kind": "pod"}
RULES = {
    "groups": [
        {
            "name": "ha-leaks",
            "interval": "1s",
            "rules": [
                {
                    "alert": ALERT,
                    "expr": "ha_test_leak > 0",
                    "labels": RULE_LABELS,
                    "annotations": {"summary": "{{ $labels.pod }} holds GPU memory past its hard limit"},
                }
            ],
        }
    ]
}


@dataclass
class Pair:
    replicas: list[str]  # the Alertmanagers' base URLs
    controller: str
    restarts: Path  # one line per restart the controller ran
    db: Path
    inbox: Path
    logs: list[Path]  # the replicas' logs


def _binaries() -> tuple[Path, Path]:
    try:
        return neighbour_binary("prometheus"), neighbour_binary("alertmanager")
    except MissingNeighbourError as e:
        pytest.skip(str(e))


@asynccontextmanager
async def _leak_page() -> AsyncIterator[int]:
    async def metrics(_: web.Request) -> web.Response:
        lines = [
            f'ha_test_leak{{namespace="{NAMESPACE}",pod="{pod}",node="node-{i}"}} 1'
            for i, pod in enumerate(PODS)
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield port
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _pair(tmp: Path, gossip: bool, prometheus_sends: bool = True) -> AsyncIterator[Pair]:
    """The controller, the two replicas (peered when `gossip`) and, when `prometheus_sends`, a
    Prometheus firing the three leak alerts to both."""
    prometheus, alertmanager = _binaries()
    restarts = tmp / "restarts"
    token = tmp / "token"
    token.write_text(TOKEN)
    async with AsyncExitStack() as stack:
        port = free_port()
        controller = f"http://127.0.0.1:{port}"
        script = f"import sys; open({str(restarts)!r}, 'a').write(' '.join(sys.argv[1:]) + chr(10))"
        restart = f"{sys.executable} -c {json.dumps(script)} {{namespace}} {{pod}}"
        env = {**os.environ, "GPUPULSE_REMEDIATION_TOKEN": TOKEN}
        env.pop("GPUPULSE_REMEDIATION_INSECURE_NO_AUTH", None)
        serve = await stack.enter_async_context(
            child_process(
                [
                    sys.executable,
                    "-m",
                    "remediation",
                    "serve",
                    f"--web.listen-address=127.0.0.1:{port}",
                    f"--storage.path={tmp / 'state'}",
                    "--engine.tick-interval=100ms",
                    f"--scope.namespaces={NAMESPACE}",
                    f"--backend.local.restart-command={restart}",
                ],
                tmp / "serve.log",
                env,
            )
        )
        await wait_http(f"{controller}/readyz", serve, timeout_seconds=30)

        config = {
            "route": {
                "receiver": "gpupulse",
                "group_by": ["alertname", "namespace", "pod"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "gpupulse",
                    "webhook_configs": [
                        {
                            "url": f"{controller}/api/v1/alerts",
                            "send_resolved": True,
                            "http_config": {
                                "authorization": {"type": "Bearer", "credentials_file": str(token)}
                            },
                        }
                    ],
                }
            ],
        }
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump(config))
        web_ports, cluster_ports = [free_port(), free_port()], [free_port(), free_port()]
        replicas = []
        for i in range(2):
            peer = [f"--cluster.peer=127.0.0.1:{cluster_ports[1 - i]}"] if gossip else []
            proc = await stack.enter_async_context(
                child_process(
                    [
                        str(alertmanager),
                        f"--config.file={tmp / 'alertmanager.yml'}",
                        f"--storage.path={tmp / f'am-{i}'}",
                        f"--web.listen-address=127.0.0.1:{web_ports[i]}",
                        f"--cluster.listen-address=127.0.0.1:{cluster_ports[i]}",
                        f"--cluster.advertise-address=127.0.0.1:{cluster_ports[i]}",
                        *peer,
                        # the replica second in line waits this long for the first's log entry
                        "--cluster.peer-timeout=3s",
                        "--log.level=debug",  # each aggregation group's flush: the test's fence
                    ],
                    tmp / f"alertmanager-{i}.log",
                )
            )
            url = f"http://127.0.0.1:{web_ports[i]}"
            await wait_http(f"{url}/-/ready", proc, timeout_seconds=60)
            replicas.append(url)
        want_peers = 2 if gossip else 1
        for url in replicas:
            await until(partial(_peers_ready, url, want_peers), f"{url}: {want_peers} cluster peers")

        if prometheus_sends:
            page = await stack.enter_async_context(_leak_page())
            rule_file = tmp / "ha.rules.yaml"
            rule_file.write_text(yaml.safe_dump(RULES))
            prom_config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "alerting": {
                    "alertmanagers": [
                        {"static_configs": [{"targets": [u.removeprefix("http://") for u in replicas]}]}
                    ]
                },
                "rule_files": [rule_file.name],
                "scrape_configs": [
                    {"job_name": "leaks", "static_configs": [{"targets": [f"127.0.0.1:{page}"]}]}
                ],
            }
            prom: PromHandle = await stack.enter_async_context(
                running_prometheus(yaml.safe_dump(prom_config), rule_files=[rule_file], binary=prometheus)
            )
            # Prometheus sends to both replicas: each has every alert
            await until(lambda: _prometheus_sends_to(prom, 2), "Prometheus discovering both Alertmanagers")
        logs = [tmp / f"alertmanager-{i}.log" for i in range(2)]
        yield Pair(
            replicas, controller, restarts, tmp / "state" / DB_FILENAME, tmp / "state" / INBOX_FILENAME, logs
        )


async def _peers_ready(url: str, want: int) -> bool:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/api/v2/status") as r:
        cluster = (await r.json())["cluster"]
    return bool(cluster["status"] == "ready" and len(cluster.get("peers") or []) == want)


async def _prometheus_sends_to(prom: PromHandle, want: int) -> bool:
    return len((await prom.api("alertmanagers"))["activeAlertmanagers"]) == want


async def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples at url/metrics whose labels include `labels`."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


async def _webhook_deliveries(url: str) -> float:
    return await _metric(url, "alertmanager_notifications_total", integration="webhook")


def _ledger_counts(db: Path) -> tuple[int, int]:
    """(incidents, restart actions) in the controller's ledger."""
    conn = sqlite3.connect(db)
    try:
        incidents = int(conn.execute("SELECT count(*) FROM rem_incidents").fetchone()[0])
        actions = int(
            conn.execute(
                "SELECT count(*) FROM rem_ledger WHERE kind = 'action' AND rung = 'restart'"
            ).fetchone()[0]
        )
    finally:
        conn.close()
    return incidents, actions


def _handled_and_stale(db: Path) -> tuple[int, int]:
    """(notifications the engine handled, those it recorded as stale)."""
    conn = sqlite3.connect(db)
    try:
        handled = int(conn.execute("SELECT count(*) FROM rem_handled").fetchone()[0])
        stale = int(conn.execute("SELECT count(*) FROM rem_stale").fetchone()[0])
    finally:
        conn.close()
    return handled, stale


def _restarted(pair: Pair) -> list[str]:
    return sorted(pair.restarts.read_text().splitlines()) if pair.restarts.exists() else []


def _flushes(log: Path) -> dict[str, int]:
    """How many times the replica flushed each pod's alert group so far (its debug log)."""
    lines = [line for line in log.read_text().splitlines() if "msg=flushing" in line]
    return {pod: sum(1 for line in lines if pod in line) for pod in PODS}


async def _flushed_past(pair: Pair, seen: list[dict[str, int]]) -> bool:
    return all(
        _flushes(log)[pod] >= before[pod] + 2
        for log, before in zip(pair.logs, seen, strict=True)
        for pod in PODS
    )


@pytest.mark.parametrize("gossip", [True, False], ids=["gossiping", "partitioned"])
async def test_every_alert_acts_once_behind_an_alertmanager_pair(tmp_path: Path, gossip: bool) -> None:
    async with _pair(tmp_path, gossip) as pair:
        want = sorted(f"{NAMESPACE} {pod}" for pod in PODS)
        await until(lambda: _only(_restarted(pair), want), "each pod restarted", timeout_seconds=60)
        # A group's flushes run one after another, each through the wait for the peers and the check of
        # the notification log: two more flushes of every group on both replicas, and each replica's
        # decision on the firing notification (flushed by now or next) is final.
        seen = [_flushes(log) for log in pair.logs]
        await until(lambda: _flushed_past(pair, seen), "two more flushes of every group on both replicas")
        deliveries = [await _webhook_deliveries(url) for url in pair.replicas]

        assert _restarted(pair) == want  # one restart per pod, whichever replica delivered
        assert _ledger_counts(pair.db) == (len(PODS), len(PODS))
        assert await _metric(pair.controller, "gpupulse_remediation_actions_total", rung="restart") == len(
            PODS
        )
        # the controller counts alerts newly stored: a re-delivery from the other replica is not one
        received = await _metric(
            pair.controller, "gpupulse_remediation_alerts_received_total", status="firing"
        )
        assert received == len(PODS)
        if gossip:
            # the replica first in line sent each group's notification, the other read it in the gossiped log
            assert sorted(deliveries) == [0, len(PODS)], deliveries
        else:  # each replica sent every group's notification: the same alerts twice, each acted on once
            assert deliveries == [len(PODS), len(PODS)], deliveries


async def _only(got: list[str], want: list[str]) -> list[str] | None:
    return got if got == want else None


def _processed(inbox: Path) -> int:
    conn = sqlite3.connect(inbox)
    try:
        return int(conn.execute("SELECT count(*) FROM inbox WHERE processed_at IS NOT NULL").fetchone()[0])
    finally:
        conn.close()


async def _post_alert(replica: str, starts_at: datetime) -> None:
    alert = {
        "labels": {
            "alertname": ALERT,
            **RULE_LABELS,
            "namespace": NAMESPACE,
            "pod": PODS[0],
            "node": "node-0",
        },
        "annotations": {"summary": f"{PODS[0]} holds GPU memory past its hard limit"},
        "startsAt": starts_at.isoformat(),
    }
    async with aiohttp.ClientSession() as s, s.post(f"{replica}/api/v2/alerts", json=[alert]) as r:
        assert r.status == 200, await r.text()


async def test_one_alert_with_two_start_times_from_two_replicas_acts_once(tmp_path: Path) -> None:
    # Two Prometheus replicas whose ActiveAt differ by 10 s, each reaching one Alertmanager of a pair
    # that cannot gossip: the replicas notify one alert (one fingerprint) with two startsAt, which the
    # controller's inbox stores as two alerts and its engine sees twice.
    async with _pair(tmp_path, gossip=False, prometheus_sends=False) as pair:
        first = datetime.now(UTC) - timedelta(seconds=30)
        await _post_alert(pair.replicas[0], first)
        await until(lambda: _only(_restarted(pair), [f"{NAMESPACE} {PODS[0]}"]), "the pod restarted")
        await _post_alert(pair.replicas[1], first + timedelta(seconds=10))
        await until(lambda: _at_least_processed(pair.inbox, 2), "the second start time processed")
        assert _restarted(pair) == [f"{NAMESPACE} {PODS[0]}"]  # the later copy joins the open incident
        assert _ledger_counts(pair.db) == (1, 1)
        assert _handled_and_stale(pair.db) == (2, 0)  # both taken as fresh evidence, neither refused
        assert [await _webhook_deliveries(url) for url in pair.replicas] == [1, 1]


async def _at_least_processed(inbox: Path, want: int) -> bool:
    return _processed(inbox) >= want
