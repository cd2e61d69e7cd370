"""Field by field, what intake accepts from Alertmanager (Go) and what it refuses, asserted both ways."""

from __future__ import annotations

import json
from typing import Any

import pytest

from remediation.errors import PayloadError
from remediation.intake import MAX_FINGERPRINT_CHARS, parse_notification, parse_rfc3339
from tests.fakes.intake import alert, notification


def _parse(**fields: Any) -> Any:
    doc = alert()
    doc.update(fields)
    for key in [k for k, v in fields.items() if v is _DROP]:
        del doc[key]
    return parse_notification(json.dumps(notification([doc])).encode(), 1.0)[0]


_DROP = object()


def _refused(**fields: Any) -> PayloadError:
    with pytest.raises(PayloadError) as raised:
        _parse(**fields)
    return raised.value


def test_null_annotations_are_no_annotations() -> None:
    # Go marshals a nil map as null; Alertmanager's template makes the map, other senders may not
    assert _parse(annotations=None).annotations == {}
    assert _parse(annotations=_DROP).annotations == {}


def test_null_labels_are_refused() -> None:
    # an alert without labels has no name and no target: there is nothing to remediate
    err = _refused(labels=None)
    assert err.field == "alerts[0].labels"
    assert _refused(labels=_DROP).field == "alerts[0].labels"
    assert _refused(labels={"alertname": 3}).field == "alerts[0].labels.alertname"


def test_an_alert_without_generator_url_is_accepted() -> None:
    assert _parse(generatorURL=_DROP).generator_url == ""
    assert _parse(generatorURL=None).generator_url == ""
    assert _refused(generatorURL=7).field == "alerts[0].generatorURL"


def test_fingerprints_up_to_the_limit_are_accepted_and_longer_ones_refused() -> None:
    assert len(_parse(fingerprint="f" * MAX_FINGERPRINT_CHARS).fingerprint) == MAX_FINGERPRINT_CHARS
    err = _refused(fingerprint="f" * (MAX_FINGERPRINT_CHARS + 1))
    assert (err.field, err.message) == ("alerts[0].fingerprint", "longer than 128 characters")
    assert _refused(fingerprint="").field == "alerts[0].fingerprint"


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("2026-11-30T00:25:25.886825742Z", 886825),  # Go's nanoseconds: truncated, never rounded up
        ("2026-11-30T00:25:25.999999999Z", 999999),
        ("2026-11-30T00:25:25.5Z", 500000),
        ("2026-11-30T00:25:25.123456789012Z", 123456),
        ("2026-11-30T00:25:25Z", 0),
    ],
)
def test_fraction_digits_beyond_microseconds_are_truncated(text: str, micros: int) -> None:
    parsed = parse_rfc3339(text, "f")
    assert (parsed.second, parsed.microsecond) == (25, micros)


def test_offsets_are_normalised_to_utc() -> None:
    assert parse_rfc3339("2026-11-30T02:25:25.5+02:00", "f").isoformat() == "2026-11-30T00:25:25.500000+00:00"


@pytest.mark.parametrize(
    "text",
    [
        "0001-01-01T00:00:00+01:00",
        "0001-01-01T12:00:00-01:00",
        "9999-12-31T23:00:00-01:00",
        "9999-12-31T23:59:59-14:00",
    ],
)
def test_year_1_and_year_9999_instants_with_offsets_give_a_payload_error(text: str) -> None:
    with pytest.raises(PayloadError) as raised:
        parse_rfc3339(text, "alerts[0].startsAt")
    assert raised.value.field == "alerts[0].startsAt"


def test_go_zero_time_means_no_end_and_is_no_start() -> None:
    assert _parse(endsAt="0001-01-01T00:00:00Z").ends_at is None
    assert _parse(endsAt="0001-01-01T00:00:00.000000000Z").ends_at is None
    assert _refused(startsAt="0001-01-01T00:00:00Z").field == "alerts[0].startsAt"


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"labels": {**alert()["labels"], "summary": "gpu\ud800"}}, "alerts[0].labels"),
        ({"labels": {**alert()["labels"], "\udfff": "x"}}, "alerts[0].labels"),
        ({"annotations": {"summary": "\ud800"}}, "alerts[0].annotations"),
        ({"generatorURL": "http://p/\ud800"}, "alerts[0].generatorURL"),
    ],
    ids=["label-value", "label-name", "annotation", "generator-url"],
)
def test_a_lone_surrogate_in_any_string_is_refused_naming_its_field(
    fields: dict[str, Any], where: str
) -> None:
    # JSON may escape one ("\ud800"); SQLite text must be UTF-8, so it never reaches the inbox
    err = _refused(**fields)
    assert (err.field, err.message) == (where, "contains an invalid Unicode code point")


def test_escaped_characters_that_are_real_code_points_are_accepted() -> None:
    record = _parse(annotations={"summary": "caf\u00e9 \U0001f525"})  # json.dumps escapes both
    assert record.annotations == {"summary": "caf\u00e9 \U0001f525"}


def test_a_wrongly_typed_field_says_whether_it_was_required() -> None:
    assert _refused(generatorURL=7).message == "must be a string"
    with pytest.raises(PayloadError) as raised:
        parse_notification(json.dumps(notification([alert()], receiver=7)).encode(), 1.0)
    assert (raised.value.field, raised.value.message) == ("receiver", "is required and must be a string")


@pytest.mark.parametrize("status", ["suppressed", "unprocessed", "active", "Resolved", "", None])
def test_only_firing_and_resolved_are_alert_states(status: str | None) -> None:
    # Alertmanager's API speaks of active/suppressed/unprocessed; a webhook alert is firing or resolved
    err = _refused(status=status)
    assert (err.field, err.message) == ("alerts[0].status", 'must be "firing" or "resolved"')
