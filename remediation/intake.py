"""Alertmanager webhook payload (version 4) → validated InboxRecords.

Strict about what the controller needs, tolerant of everything else: fields that newer Alertmanager
releases add (`notification_reason` 0.32, `routeLabels` 0.34, ...) are ignored, never rejected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import orjson

from remediation.errors import PayloadError

from .inbox import InboxRecord, canonical_json
from .model import AlertStatus

SUPPORTED_VERSION = "4"
MAX_FINGERPRINT_CHARS = 128
# RFC 3339 date-time: a 'T' (or space), seconds, optional fraction, and a zone (Z or ±hh:mm)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
# Go's zero time.Time: Alertmanager sends it as endsAt when an alert has no end yet
_GO_ZERO_YEAR = 1
_GO_ZERO = datetime(1, 1, 1, tzinfo=UTC)


def parse_rfc3339(value: object, field: str) -> datetime:
    """Parse an RFC 3339 timestamp (nanoseconds truncated to microseconds) into an aware UTC datetime.

    Go's zero time (`0001-01-01T00:00:00Z`, Alertmanager's "no end yet") comes back as year 1 UTC;
    any other instant that is not representable in UTC between years 1 and 9999 is a PayloadError.
    """
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise PayloadError(field, "must be an RFC 3339 timestamp such as 2026-01-02T03:04:05Z")
    text = value if value[-1] != "z" else value[:-1] + "Z"
    try:
        # 3.11 reads "Z", "t" and " " as RFC 3339 allows, and truncates Go's nanoseconds (any digits
        # past the sixth) to the microseconds Python keeps
        parsed = datetime.fromisoformat(text)
        utc = parsed.astimezone(UTC)
    except ValueError as e:
        raise PayloadError(field, f"not a valid timestamp ({e})") from e
    except OverflowError:  # e.g. 9999-12-31T23:59:59-14:00 lies past year 9999 in UTC
        raise PayloadError(field, "lies outside the years 1 to 9999 once converted to UTC") from None
    if utc.year == _GO_ZERO_YEAR and utc != _GO_ZERO:
        # only the zero time itself means something in year 1; anything else there is a broken clock
        raise PayloadError(field, "lies in year 1 but is not Go's zero time 0001-01-01T00:00:00Z")
    return utc


def _string_map(value: object, field: str, required: bool, escapes: bool) -> dict[str, str]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(field, "must be an object of string values")
    for k, v in value.items():
        if not isinstance(v, str):
            raise PayloadError(f"{field}.{k}", "must be a string")
        if escapes:
            _encodable(k, field)
            _encodable(v, field)
    return cast(dict[str, str], value)


def _encodable(value: str, field: str) -> str:
    # JSON may carry lone surrogates ("\\ud800"); SQLite text must be valid UTF-8
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PayloadError(field, "contains an invalid Unicode code point") from e
    return value


def _string(obj: Mapping[str, Any], key: str, field: str, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise PayloadError(field, "is required and must be a string" if required else "must be a string")
    return _encodable(value, field)


def _status(value: object, field: str) -> AlertStatus:
    if value == "firing":
        return "firing"
    if value == "resolved":
        return "resolved"
    raise PayloadError(field, 'must be "firing" or "resolved"')


def _no_constant(name: str) -> Any:
    # Python's parser reads NaN and Infinity, which JSON (and orjson, and Go) do not have
    raise ValueError(f"{name} is not a JSON value")


def decode_json(body: bytes) -> Any:
    """Decode a request body as UTF-8 JSON, mapping every failure to PayloadError."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        # the standard parser decides: it names the error, and it accepts lone surrogates, which
        # parse_notification then rejects naming the field that holds one
        pass
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PayloadError("body", f"not UTF-8 ({e.reason} at byte {e.start})") from e
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError as e:
        raise PayloadError("body", "JSON nested too deeply") from e
    except ValueError as e:  # JSONDecodeError, and int strings beyond Python's digit limit
        raise PayloadError("body", f"not valid JSON ({e})") from e


def parse_notification(body: bytes, received_at: float) -> list[InboxRecord]:
    """Validate one webhook body and return one record per alert; raise PayloadError otherwise."""
    doc = decode_json(body)
    # a lone surrogate can only come from a \\u escape; bodies without one skip the per-string check
    escapes = b"\\u" in body
    if not isinstance(doc, dict):
        raise PayloadError("body", "must be a JSON object (an Alertmanager webhook notification)")
    version = doc.get("version")
    if version != SUPPORTED_VERSION:
        raise PayloadError("version", f'must be "{SUPPORTED_VERSION}" (Alertmanager webhook payload version)')
    _status(doc.get("status"), "status")
    receiver = _string(doc, "receiver", "receiver")
    group_key = _string(doc, "groupKey", "groupKey")
    alerts = doc.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts", "is required and must be a list")
    if not alerts:
        raise PayloadError("alerts", "must not be empty")
    records: list[InboxRecord] = []
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(alert, dict):
            raise PayloadError(where, "must be an object")
        fingerprint = alert.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise PayloadError(f"{where}.fingerprint", "is required (Alertmanager always sends it)")
        if len(fingerprint) > MAX_FINGERPRINT_CHARS:
            raise PayloadError(f"{where}.fingerprint", f"longer than {MAX_FINGERPRINT_CHARS} characters")
        _encodable(fingerprint, f"{where}.fingerprint")
        status = _status(alert.get("status"), f"{where}.status")
        labels = _string_map(alert.get("labels"), f"{where}.labels", True, escapes)
        # Go marshals an empty annotation map as null in some releases; treat as none
        annotations = _string_map(alert.get("annotations"), f"{where}.annotations", False, escapes)
        starts_at = parse_rfc3339(alert.get("startsAt"), f"{where}.startsAt")
        if starts_at == _GO_ZERO:
            raise PayloadError(f"{where}.startsAt", "is the zero time")
        ends_raw = alert.get("endsAt")
        ends_at: datetime | None = None
        if ends_raw not in (None, ""):
            ends_at = parse_rfc3339(ends_raw, f"{where}.endsAt")
            if ends_at == _GO_ZERO:
                ends_at = None
        generator_url = _string(alert, "generatorURL", f"{where}.generatorURL", required=False)
        records.append(
            InboxRecord(
                fingerprint=fingerprint,
                status=status,
                starts_at=starts_at.isoformat(),
                ends_at=ends_at.isoformat() if ends_at else None,
                starts=starts_at,
                ends=ends_at,
                labels=labels,
                annotations=annotations,
                generator_url=generator_url,
                receiver=receiver,
                group_key=group_key,
                received_at=received_at,
                raw=canonical_json(alert),
            )
        )
    return records
