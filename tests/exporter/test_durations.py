"""Exporter flags take seconds or Prometheus-style durations, like node_exporter's."""

from __future__ import annotations

import argparse

import pytest

from exporter.config import duration_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1", 1.0),
        ("0.5", 0.5),
        ("500ms", 0.5),
        ("15s", 15.0),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
    ],
)
def test_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "s", "1s5", "-1s", "-2", "1 s"])
def test_bad_durations_are_refused_with_a_clear_message(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        duration_seconds(text)
