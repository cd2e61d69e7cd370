"""Kubernetes time formats: Lease MicroTime out, RFC 3339 in (the clock itself is gpupulse.clock)."""

from __future__ import annotations

from datetime import UTC, datetime


def micro_time(moment: datetime) -> str:
    """Format a Lease MicroTime (RFC 3339 with microseconds, UTC, 'Z')."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime | None:
    """Parse an RFC 3339 time as the API returns it; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
