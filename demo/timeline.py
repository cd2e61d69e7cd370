"""The live timeline: alerts from Prometheus, the controller's ledger, pages and world changes."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import aiohttp

POLL_SECONDS = 1.0
# labels that say which thing an alert is about, in the order they are shown
_IDENTITY = ("node", "namespace", "training_job", "rank", "pod", "gpu", "xid")


@dataclass
class Timeline:
    """Prints `  12.3s  KIND     text` lines, seconds since the demo started."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    started: float = field(default_factory=time.monotonic)

    def line(self, kind: str, text: str) -> None:
        """Print one timeline line."""
        print(f"{time.monotonic() - self.started:7.1f}s  {kind:<8} {text}", file=self.out, flush=True)


def describe_alert(labels: Mapping[str, str]) -> str:
    """AlertName node=... pod=... [severity fault_class]."""
    ident = " ".join(f"{k}={labels[k]}" for k in _IDENTITY if labels.get(k))
    tags = " ".join(v for v in (labels.get("severity"), labels.get("fault_class")) if v)
    return f"{labels.get('alertname', '?')} {ident} [{tags}]"


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


class AlertWatcher:
    """Polls Prometheus /api/v1/alerts and prints pending, firing and resolved transitions."""

    def __init__(self, prometheus_url: str, timeline: Timeline) -> None:
        self.url = prometheus_url.rstrip("/") + "/api/v1/alerts"
        self.timeline = timeline
        self.states: dict[tuple[tuple[str, str], ...], str] = {}
        self.fired: list[dict[str, str]] = []

    def update(self, alerts: list[Mapping[str, Any]]) -> None:
        """Apply one poll's alert list."""
        seen: dict[tuple[tuple[str, str], ...], str] = {}
        for a in alerts:
            labels = {str(k): str(v) for k, v in (a.get("labels") or {}).items()}
            key = _key(labels)
            state = str(a.get("state", ""))
            seen[key] = state
            if self.states.get(key) != state:
                self.timeline.line("ALERT", f"{state:<8} {describe_alert(labels)}")
                if state == "firing":
                    self.fired.append(labels)
        for key, state in self.states.items():
            if key not in seen:
                self.timeline.line(
                    "ALERT",
                    f"{'resolved' if state == 'firing' else 'cleared':<8} {describe_alert(dict(key))}",
                )
        self.states = seen

    async def poll(self, session: aiohttp.ClientSession) -> None:
        """One poll; errors are ignored (the next poll tries again)."""
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with session.get(self.url) as resp:
                if resp.status == 200:
                    body = await resp.json()
                    self.update(list(body.get("data", {}).get("alerts", [])))


def describe_entry(inc: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
    """One ledger entry, with its incident."""
    kind = inc.get("target_kind")
    if kind == "pod":
        target = f"{inc.get('target_namespace')}/{inc.get('target_pod')}"
    elif kind == "job":
        target = f"job {inc.get('target_namespace')}/{inc.get('target_training_job')}"
    else:
        target = f"{kind} {inc.get('target_uuid') or inc.get('target_node')}"
    what = (
        f"{entry.get('rung')} {entry.get('status')}"
        if entry.get("kind") == "action"
        else str(entry.get("status"))
    )
    return f"#{inc.get('id')} {inc.get('signature')} {target}: {what} - {entry.get('summary', '')}"


class LedgerWatcher:
    """Polls the controller's API and prints every new ledger entry of every incident."""

    def __init__(self, controller_url: str, token: str, timeline: Timeline) -> None:
        self.url = controller_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeline = timeline
        self.incidents: dict[int, dict[str, Any]] = {}
        self._shown: dict[int, int] = {}

    def apply(self, incident: dict[str, Any]) -> None:
        """Record one incident (with history) and print its new entries."""
        incident_id = int(incident["id"])
        self.incidents[incident_id] = incident
        history = incident.get("history") or []
        for entry in history[self._shown.get(incident_id, 0) :]:
            # a started action is shown once it finishes, with its outcome
            if entry.get("kind") == "action" and entry.get("status") == "started":
                break
            self.timeline.line("LEDGER", describe_entry(incident, entry))
            self._shown[incident_id] = self._shown.get(incident_id, 0) + 1

    async def poll(self, session: aiohttp.ClientSession) -> None:
        """Fetch incidents that changed and print what is new."""
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            async with session.get(f"{self.url}/api/v1/incidents?limit=1000", headers=self.headers) as resp:
                if resp.status != 200:
                    return
                listed = (await resp.json()).get("incidents", [])
            for inc in sorted(listed, key=lambda i: int(i["id"])):
                known = self.incidents.get(int(inc["id"]))
                # closed incidents that did not change are not fetched again; open ones always are
                settled = inc.get("state") in ("closed", "ignored")
                if known is not None and settled and known.get("updated_at") == inc.get("updated_at"):
                    continue
                async with session.get(f"{self.url}/api/v1/incidents/{inc['id']}", headers=self.headers) as r:
                    if r.status == 200:
                        self.apply(await r.json())


async def watch(
    alerts: AlertWatcher, ledger: LedgerWatcher, stop: asyncio.Event, period_seconds: float = POLL_SECONDS
) -> None:
    """Poll both until `stop` is set."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while not stop.is_set():
            await alerts.poll(session)
            await ledger.poll(session)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period_seconds)
