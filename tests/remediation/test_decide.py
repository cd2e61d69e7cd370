"""The pure rules of remediation/decide, without a ledger, an event loop or a clock."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from remediation.decide.freshness import is_fresh, staleness
from remediation.decide.incidents import due_step, incident_key, resolved_step
from remediation.decide.pages import page_budget_spent
from remediation.model import AlertEvent, Target
from remediation.records import AlertSeen, Incident
from remediation.settings import BudgetSettings
from remediation.signatures import unknown_signature

NOW = 1_800_000_000.0


def _event(
    status: str = "firing", starts: float = NOW - 60, received: float = NOW, ends: float | None = None
) -> AlertEvent:
    return AlertEvent(
        fingerprint="fp",
        status=status,  # type: ignore[arg-type]
        labels={"alertname": "GPUFellOffBus", "node": "n1"},
        annotations={},
        starts_at=datetime.fromtimestamp(starts, UTC),
        ends_at=datetime.fromtimestamp(ends, UTC) if ends is not None else None,
        generator_url="",
        receiver="gpupulse",
        group_key="{}",
        received_at=datetime.fromtimestamp(received, UTC),
    )


def test_an_older_episode_is_out_of_order_even_when_fresh() -> None:
    seen = AlertSeen("fp", starts=NOW - 10, status="firing", at=NOW - 5)
    assert staleness(seen, _event(starts=NOW - 60), NOW, True, 900)[0] == "out_of_order"


def test_a_firing_notification_after_its_own_resolution_is_out_of_order() -> None:
    seen = AlertSeen("fp", starts=NOW - 60, status="resolved", at=NOW - 5)
    assert staleness(seen, _event(starts=NOW - 60), NOW, True, 900)[0] == "out_of_order"
    # the resolution of the same episode, re-delivered, is still true
    assert staleness(seen, _event("resolved", starts=NOW - 60), NOW, True, 900) == ("", "")


def test_expired_and_too_old_firing_alerts_do_not_act_but_resolutions_always_count() -> None:
    assert staleness(None, _event(ends=NOW), NOW, True, 900)[0] == "expired"
    old = _event(received=NOW - 901)
    assert not is_fresh(old, NOW, 900)
    assert staleness(None, old, NOW, False, 900)[0] == "too_old"
    assert staleness(None, _event("resolved", received=NOW - 10_000), NOW, False, 900) == ("", "")
    assert staleness(None, _event(), NOW, True, 900) == ("", "")


def _incident(**fields: object) -> Incident:
    base = Incident(
        id=1, key="k", signature="s", fault_class="f", alertname="a", target=Target(kind="node", node="n1"),
        loop_key="node:n1", state="open", rung="", attempt=0, rung_started_at=None, temp_retries=0,
        next_at=NOW, firing_fps=("fp",), resolved_at=None, opened_at=NOW, updated_at=NOW, closed_at=None,
        resolution="", reason="", labels={}, annotations={}, page_pending=False, page_next_at=0.0,
        paged=False, page_group="", group_sent=False, trace_id="", span_id="", evidence_at=NOW, held=0,
        page_sticky=False,
    )  # fmt: skip
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "step"),
    [
        ({"state": "open"}, "start"),
        ({"state": "open", "firing_fps": ()}, "self_resolved"),
        ({"state": "verifying"}, "escalate"),
        ({"state": "cooldown"}, "still_firing"),
        ({"state": "cooldown", "firing_fps": ()}, "automated"),
        ({"state": "retry_wait"}, "retry"),
        ({"state": "paged"}, "unresolved"),
        ({"state": "cooldown", "held": 1}, "held"),
        ({"state": "paged", "held": 1}, "unresolved"),  # a paged incident is with a human: never held
    ],
)
def test_what_a_due_timer_does_in_each_state(fields: dict[str, object], step: str) -> None:
    assert due_step(_incident(**fields)) == step


def test_what_the_last_resolution_means_in_each_state() -> None:
    steps = {s: resolved_step(s) for s in ("open", "retry_wait", "acting", "verifying", "paged", "cooldown")}
    assert steps == {
        "open": "self_resolved",
        "retry_wait": "self_resolved",
        "acting": "mark_resolved",
        "verifying": "verify",
        "paged": "human",
        "cooldown": "",
    }


def test_unknown_alerts_on_one_target_do_not_merge_into_one_incident() -> None:
    sig = unknown_signature("")
    target = Target(kind="node", node="n1")
    one = incident_key(sig, target, {"alertname": "A"})
    other = incident_key(sig, target, {"alertname": "B"})
    assert one != other
    known = dataclasses.replace(sig, origin="builtin")
    assert incident_key(known, target, {"alertname": "A"}) == incident_key(known, target, {"alertname": "B"})


def test_the_page_budget_is_spent_at_its_limit() -> None:
    budgets = BudgetSettings(max_pages_per_signature=3, max_pages_per_window=3, page_window_seconds=600)
    assert page_budget_spent(2, 2, "s", budgets) == ""
    assert "3 incidents paged within 600 s (limit 3)" in page_budget_spent(3, 0, "s", budgets)
