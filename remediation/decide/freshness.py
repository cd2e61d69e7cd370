"""Whether a notification is evidence to act on: fresh, too old, reordered or already expired."""

from __future__ import annotations

from typing import Literal

from remediation.model import AlertEvent
from remediation.records import AlertSeen

Staleness = Literal["", "out_of_order", "expired", "too_old"]


def is_fresh(event: AlertEvent, now: float, max_event_age_seconds: float) -> bool:
    """The event was received recently enough that what it says may still be true."""
    return now - event.received_at.timestamp() <= max_event_age_seconds


def staleness(
    seen: AlertSeen | None, event: AlertEvent, now: float, fresh: bool, max_event_age_seconds: float
) -> tuple[Staleness, str]:
    """(reason, detail) when the event must not act, ("", "") when it is fresh evidence.

    `seen` is the newest (startsAt, status) recorded for the event's fingerprint.
    """
    starts = event.starts_at.timestamp()
    if seen is not None:
        if seen.starts > starts:
            return "out_of_order", (
                f"an older episode (startsAt {event.starts_at.isoformat()}) of an alert whose latest "
                f"{seen.status} notification started later"
            )
        if seen.starts == starts and seen.status == "resolved" and event.status == "firing":
            return "out_of_order", "the firing notification arrived after its own resolution"
    if event.status != "firing":
        return "", ""  # a resolution never acts; however old, it is still true
    if event.ends_at is not None and event.ends_at.timestamp() <= now:
        return "expired", (
            f"endsAt {event.ends_at.isoformat()} has passed: Alertmanager counts the alert resolved"
        )
    if not fresh:
        age = now - event.received_at.timestamp()
        limit = max_event_age_seconds
        return "too_old", f"received {age:.0f} s before it was processed (limit {limit:.0f} s)"
    return "", ""
