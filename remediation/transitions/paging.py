"""Paging transitions: an incident's own page, joining the breaker's group or a storm's summary page.

Pages are built by remediation/decide/pages.py; here they are requested, scheduled and recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from remediation.decide import PAGE_INFLIGHT_SECONDS, SUMMARY
from remediation.decide.pages import breaker_page, incident_page, page_budget_spent, summary_page
from remediation.effects import Effect, SendGroupPage, SendPage
from remediation.loops import LoopVerdict
from remediation.model import Page
from remediation.records import Incident
from remediation.safety import BREAKER
from remediation.signatures import unknown_signature
from remediation.transitions.base import TransitionsBase


class PagingTransitions(TransitionsBase):
    """Requesting pages and grouping them while the breaker is open or the page budget is spent."""

    def _page_budget_spent(self, inc: Incident, now: float) -> str:
        """Why this incident may not page on its own now ("" while its signature's page budget and
        the global one last)."""
        if self.settings.dry_run:
            return ""
        b = self.settings.budgets
        since = now - b.page_window_seconds
        paged = self._db.paged_incidents_since(since)
        of_signature = self._db.paged_incidents_since(since, inc.signature)
        return page_budget_spent(paged, of_signature, inc.signature, b)

    def _page(self, incident_id: int, now: float, reason: str) -> list[Effect]:
        inc = self._row(incident_id)
        if self._safety.breaker_open():
            return self._join_group(incident_id, now, reason)
        spent = self._page_budget_spent(inc, now)
        if spent:
            return self._join_summary(incident_id, now, reason, spent)
        self._set(
            incident_id,
            state="paged",
            rung="page",
            rung_started_at=inc.rung_started_at if inc.rung == "page" else now,
            reason=reason,
            paged=1,
            next_at=now + self.settings.paged_incident_max_age_seconds,
        )
        if self.settings.dry_run:
            self._entry(
                inc, "action", "dry_run", f"dry run: would page ({reason})", rung="page", finished_at=now
            )
            self._later(lambda: self.metrics.actions.labels(rung="page", outcome="dry_run").inc())
            self._conclude_rung(self._row(incident_id), "dry_run", reason)
            return []
        return self._request_page(incident_id, now, reason)

    def _request_page(self, incident_id: int, now: float, reason: str) -> list[Effect]:
        inc = self._row(incident_id)
        if self.settings.dry_run:
            self._entry(
                inc, "action", "dry_run", f"dry run: would page ({reason})", rung="page", finished_at=now
            )
            return []
        self._entry(inc, "event", "page_requested", reason)
        # paged=1: whatever closes this incident later sends the matching resolve
        self._set(incident_id, page_pending=1, paged=1, page_next_at=now + PAGE_INFLIGHT_SECONDS)
        return [self._page_effect(incident_id, resolved=False)]

    def _page_effect(self, incident_id: int, resolved: bool) -> SendPage:
        inc = self._row(incident_id)
        entry_id = self._entry(
            inc, "action", "started", "resolve page" if resolved else "page", rung="page", attempt=1
        )
        inc = self._row(incident_id)
        if resolved or not self.diagnosing:
            return SendPage(incident_id, entry_id, self._build_page(inc, resolved))
        # the runner refreshes the diagnosis just before sending (Prometheus is read off this thread)
        return SendPage(incident_id, entry_id, self._build_page(inc, resolved), inc.labels, inc.opened_at)

    def _build_page(self, inc: Incident, resolved: bool) -> Page:
        history = self._db.history(inc.id)
        latest = self._db.latest_diagnosis(inc.id)
        return incident_page(
            inc,
            self._sig(inc),
            history,
            self.settings.runbook_base_url,
            resolved,
            latest.diagnosis if latest is not None else None,
            self.settings.diagnosis.dashboard_url,
        )

    def _join_group(self, incident_id: int, now: float, why: str = "") -> list[Effect]:
        inc = self._row(incident_id)
        breaker = self._safety.breaker()
        group = str(breaker.get("group", "breaker"))
        reason = f"breaker open: {breaker.get('reason', '')}"
        self._entry(
            inc, "event", "grouped", f"breaker open ({breaker.get('reason', '')}): joins grouped page {group}"
        )
        self._set(
            incident_id,
            state="paged",
            rung="page",
            rung_started_at=now,
            paged=1,
            page_group=group,
            group_sent=0,
            # a page's own reason (e.g. the reboot a drained node still needs) stays in front
            reason=f"{why}; {reason}" if why else reason,
            next_at=now + self.settings.paged_incident_max_age_seconds,
        )
        return []

    def _join_summary(self, incident_id: int, now: float, reason: str, spent: str) -> list[Effect]:
        """Over the page budget: the incident joins its signature's summary page of this storm."""
        inc = self._row(incident_id)
        signature = inc.signature
        window = self.settings.budgets.page_window_seconds
        current = [
            st
            for st in self._db.states(SUMMARY).values()
            if st.get("signature") == signature and now - float(st.get("last_join_at", 0.0)) <= window
        ]
        if current:
            state = current[-1]
        else:  # the first incident over budget, or the last storm of this signature ended
            group = f"summary-{signature}-{int(now)}"
            state = {"group": group, "signature": signature, "started_at": now, "last_page_at": 0.0}
        state["last_join_at"] = now
        group = str(state["group"])
        self._db.set_state(SUMMARY + group, state)
        self._entry(inc, "event", "summarized", f"{spent}: joins summary page {group}")
        self._set(
            incident_id,
            state="paged",
            rung="page",
            rung_started_at=inc.rung_started_at if inc.rung == "page" else now,
            paged=1,
            page_group=group,
            group_sent=0,
            reason=reason,
            next_at=now + self.settings.paged_incident_max_age_seconds,
        )
        return []

    def _flush_summaries(self, now: float) -> list[Effect]:
        """Send or update each summary page whose group grew (at most every group interval), and
        resolve it once every member incident closed."""
        out: list[Effect] = []
        interval = self.settings.budgets.group_page_interval_seconds
        for key, state in self._db.states(SUMMARY).items():
            group = str(state["group"])
            last = float(state.get("last_page_at", 0.0))
            if self._db.open_group_members(group) == 0:
                if last:
                    members = self._db.group_members(group, unsent_only=False)
                    out.append(SendGroupPage(group, self._summary_page(state, members, True), (), key))
                self._db.delete_state(key)
                continue
            if last and now < last + interval:
                continue
            unsent = self._db.group_members(group, unsent_only=True)
            if not unsent:
                continue
            for inc in unsent:
                self._set(inc.id, group_sent=1)
                self._entry(inc, "event", "group_page", f"included in summary page {group}")
            self._db.set_state(key, {**state, "last_page_at": now})
            members = self._db.group_members(group, unsent_only=False)
            page = self._summary_page(state, members, False)
            out.append(SendGroupPage(group, page, tuple(m.id for m in unsent), key))
        return out

    def _summary_page(self, state: Mapping[str, Any], members: Sequence[Incident], resolved: bool) -> Page:
        sig = self.library.get(str(state["signature"])) or unknown_signature("")
        st = self.settings
        return summary_page(state, members, sig, st.budgets, st.external_url, st.runbook_base_url, resolved)

    def _flush_group(self, now: float) -> list[Effect]:
        breaker = self._safety.breaker()
        if not breaker.get("open"):
            return []
        group = str(breaker.get("group", ""))
        last = float(cast(float, breaker.get("last_group_page_at", 0.0)))
        if now < last + self.settings.budgets.group_page_interval_seconds:
            return []
        unsent = self._db.group_members(group, unsent_only=True)
        if not unsent:
            return []
        members = self._db.group_members(group, unsent_only=False)
        for inc in unsent:
            self._set(inc.id, group_sent=1)
            self._entry(inc, "event", "group_page", f"included in grouped page {group}")
        self._db.set_state(BREAKER, {**breaker, "last_group_page_at": now})
        page = breaker_page(breaker, group, members, self.settings.runbook_base_url)
        return [SendGroupPage(group, page, tuple(m.id for m in unsent))]

    def _loop_page(self, incident_id: int, verdict: LoopVerdict, now: float) -> list[Effect]:
        inc = self._row(incident_id)
        self._record_loop(inc, verdict, now)
        if verdict.kind == "flapping":
            self._later(self.metrics.flapping.inc)
        self._set(incident_id, rung="page", attempt=1, rung_started_at=now)
        return self._page(incident_id, now, verdict.detail)
