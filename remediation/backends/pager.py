"""Pagers: generic webhook JSON, PagerDuty Events v2 and Slack-compatible incoming webhooks.

All send with aiohttp, a per-attempt timeout, and retries on 5xx, 429 and network errors with
exponential backoff; any other 4xx is a PagerError at once (retrying cannot fix the request).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from remediation.errors import PagerError
from remediation.model import Page, Pager
from remediation.settings import EnginePagerSettings

_PD_SEVERITIES = ("critical", "error", "warning", "info")


def page_to_dict(page: Page) -> dict[str, Any]:
    """Plain JSON form of a page (the generic webhook body)."""
    return {
        "version": "1",
        "dedup_key": page.dedup_key,
        "status": "resolved" if page.resolved else "firing",
        "summary": page.summary,
        "severity": page.severity,
        "fault_class": page.fault_class,
        "signature": page.signature,
        "runbook_url": page.runbook_url,
        "target": {
            "kind": page.target.kind,
            "node": page.target.node,
            "namespace": page.target.namespace,
            "pod": page.target.pod,
            "uuid": page.target.uuid,
            "training_job_kind": page.target.training_job_kind,
            "training_job": page.target.training_job,
        },
        "history": [dict(h) for h in page.history],
        "diagnosis": dict(page.diagnosis) if page.diagnosis is not None else None,
    }


class _HTTPPager:
    name = "http"

    def __init__(self, url: str, timeout_seconds: float, retries: int, backoff_seconds: float) -> None:
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.retries = max(0, retries)
        self.backoff_seconds = backoff_seconds

    def body(self, page: Page) -> Mapping[str, Any]:
        raise NotImplementedError

    async def send(self, page: Page) -> None:
        """POST the page; retry 5xx/429/network errors, fail at once on other 4xx."""
        data = json.dumps(self.body(page), default=str).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_seconds * (2 ** (attempt - 1)))
            try:
                async with (
                    aiohttp.ClientSession(timeout=self.timeout) as session,
                    session.post(self.url, data=data, headers={"Content-Type": "application/json"}) as resp,
                ):
                    text = (await resp.text())[:300]
                    if resp.status < 300:
                        return
                    last = f"{self.name}: HTTP {resp.status}: {text}"
                    if resp.status < 500 and resp.status != 429:
                        raise PagerError(last)
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{self.name}: {type(exc).__name__}: {exc}"
        raise PagerError(f"{last} (after {self.retries + 1} attempts)")


class WebhookPager(_HTTPPager):
    """Generic webhook: the page as JSON (see page_to_dict)."""

    name = "webhook"

    def body(self, page: Page) -> Mapping[str, Any]:
        return page_to_dict(page)


class PagerDutyPager(_HTTPPager):
    """PagerDuty Events API v2: trigger, or resolve with the same dedup_key."""

    name = "pagerduty"

    def __init__(
        self,
        routing_key: str,
        source: str,
        url: str,
        timeout_seconds: float,
        retries: int,
        backoff_seconds: float,
    ) -> None:
        super().__init__(url, timeout_seconds, retries, backoff_seconds)
        self.routing_key = routing_key
        self.source = source

    def body(self, page: Page) -> Mapping[str, Any]:
        if page.resolved:
            return {"routing_key": self.routing_key, "event_action": "resolve", "dedup_key": page.dedup_key}
        severity = page.severity if page.severity in _PD_SEVERITIES else "critical"
        return {
            "routing_key": self.routing_key,
            "event_action": "trigger",
            "dedup_key": page.dedup_key,
            "client": "gpupulse-remediation",
            "links": _links(page),
            "payload": {
                "summary": page.summary[:1024],
                "severity": severity,
                "source": self.source,
                "component": page.target.key,
                "group": page.fault_class,
                "class": page.signature,
                "custom_details": {
                    "signature": page.signature,
                    "fault_class": page.fault_class,
                    "runbook_url": page.runbook_url,
                    "target": page_to_dict(page)["target"],
                    "ladder_history": [dict(h) for h in page.history],
                    "diagnosis": dict(page.diagnosis) if page.diagnosis is not None else None,
                },
            },
        }


class SlackPager(_HTTPPager):
    """Slack-compatible incoming webhook: `text` for notifications plus Block Kit `blocks`."""

    name = "slack"

    def body(self, page: Page) -> Mapping[str, Any]:
        status = "RESOLVED" if page.resolved else page.severity.upper()
        text = f"[{status}] {page.summary}"
        lines = []
        for h in list(page.history)[-15:]:  # Slack limits a section to 3000 characters
            label = h.get("rung") or h.get("kind", "")
            lines.append(f"• {label} {h.get('status', '')}: {h.get('summary', '')}"[:180])
        blocks: list[dict[str, Any]] = [
            {
                "type": "header",
                "text": {"type": "plain_text", "text": f"[{status}] {page.fault_class}"[:150]},
            },
            {"type": "section", "text": {"type": "mrkdwn", "text": page.summary[:2900]}},
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*Signature*\n{page.signature}"},
                    {"type": "mrkdwn", "text": f"*Target*\n{page.target.key}"},
                    {"type": "mrkdwn", "text": f"*Dedup key*\n{page.dedup_key}"},
                    {"type": "mrkdwn", "text": f"*Runbook*\n<{page.runbook_url}|open>"},
                ],
            },
        ]
        if page.diagnosis is not None:
            blocks.append(
                {
                    "type": "section",
                    "text": {"type": "mrkdwn", "text": _diagnosis_text(page.diagnosis)[:2900]},
                }
            )
        if lines:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:2900]}})
        return {"text": text, "blocks": blocks}


def _links(page: Page) -> list[dict[str, str]]:
    links = [{"href": page.runbook_url, "text": "Runbook"}] if page.runbook_url else []
    dashboard = (page.diagnosis or {}).get("dashboard_url")
    if dashboard:
        links.append({"href": str(dashboard), "text": "Dashboard at the onset"})
    return links


def _diagnosis_text(diagnosis: Mapping[str, Any]) -> str:
    """The diagnosis as Slack mrkdwn: headline, the evidence of the top cause, the dashboard link."""
    lines = [f"*Diagnosis*: {diagnosis.get('headline', '')}"]
    for e in diagnosis.get("evidence") or []:
        lines.append(f"• {e.get('title', '')}: {e.get('note', '')}"[:200])
    if diagnosis.get("dashboard_url"):
        lines.append(f"<{diagnosis['dashboard_url']}|Dashboard at the onset>")
    return "\n".join(lines)


def pager_from_settings(settings: EnginePagerSettings) -> Pager | None:
    """The configured pager, or None for kind "none"."""
    common = (settings.timeout_seconds, settings.retries, settings.retry_backoff_seconds)
    if settings.kind == "webhook":
        return WebhookPager(settings.url, *common)
    if settings.kind == "slack":
        return SlackPager(settings.url, *common)
    if settings.kind == "pagerduty":
        return PagerDutyPager(
            settings.pagerduty_routing_key, settings.source, settings.pagerduty_url, *common
        )
    return None
