"""The one duration grammar: Prometheus's model.ParseDuration, checked against promtool itself.

Prometheus (prometheus/common model/time.go) reads `<integer><unit>` parts, units y w d h m s ms from
the largest to the smallest, each once, `0` alone without a unit, nothing else; values past Go's
int64 nanoseconds are "duration out of range". The flags of both services also take a bare number of
seconds, as they did before the grammar was shared.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from demo.neighbours import DEBIAN, LINES, line
from gpupulse.durations import (
    DURATION_PATTERN,
    MAX_MILLISECONDS,
    DurationError,
    duration_flag,
    format_duration,
    parse_duration,
    parse_duration_ms,
    parse_flag_duration,
)

DAY_MS = 86_400_000
VALID = [
    ("0", 0),
    ("0s", 0),
    ("0ms", 0),
    ("500ms", 500),
    ("15s", 15_000),
    ("1m30s", 90_000),
    ("90s", 90_000),  # not normalised: 90s is as good as 1m30s
    ("2h", 7_200_000),
    ("2d", 2 * DAY_MS),
    ("1w", 7 * DAY_MS),
    ("1y", 365 * DAY_MS),  # a Prometheus year is always 365 days
    ("1y2w3d4h5m6s7ms", 365 * DAY_MS + 17 * DAY_MS + 4 * 3_600_000 + 5 * 60_000 + 6_007),
    ("1h1ms", 3_600_001),
    ("01s", 1_000),  # leading zeros, as strconv.ParseUint takes them
    ("0000000000000000000000001s", 1_000),
    ("292y", 292 * 365 * DAY_MS),  # the largest whole number of years that fits
    (f"{MAX_MILLISECONDS}ms", MAX_MILLISECONDS),
]
INVALID = {
    "": "empty",
    " ": "whitespace",
    " 1s": "whitespace",
    "1s ": "whitespace",
    "1 s": "whitespace",
    "1h 30m": "whitespace",
    "1s\n": "whitespace",
    "-1s": "negative",
    "-0": "negative",
    "+1s": "number",
    "1.5h": "fractions",
    "0.5s": "fractions",
    ".5s": "fractions",
    "1s1m": "largest to the smallest",
    "30m1h": "largest to the smallest",
    "1m1m": "largest to the smallest",
    "1ms1s": "largest to the smallest",
    "1s1s": "largest to the smallest",
    "5": "no unit",
    "1h30": "no unit",
    "00": "no unit",
    "1S": "unknown unit",
    "1H": "unknown unit",
    "1sec": "unknown unit",
    "1us": "unknown unit",  # Go's time.ParseDuration has us and ns; Prometheus does not
    "1ns": "unknown unit",
    "1µs": "unknown unit",
    "1e3s": "unknown unit",
    "0x10s": "unknown unit",
    "1_000s": "unknown unit",  # int() would take the underscore; the grammar does not
    "s": "number before",
    "ms": "number before",
    "m5": "number before",
    "inf": "number before",
    "nan": "number before",
    "\u0663s": "numbers with units",  # an Arabic-Indic three: str.isdigit() says yes, Prometheus says no
    "293y": "out of range",
    f"{MAX_MILLISECONDS + 1}ms": "out of range",
    "9223372036855ms": "out of range",
    "9" * 5000 + "s": "out of range",  # past int()'s 4300-digit limit: still a DurationError
    "292y25w": "out of range",  # 292y24w still fits
}


@pytest.mark.parametrize(("text", "ms"), VALID)
def test_prometheus_durations_parse_to_milliseconds(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms
    assert parse_duration(text) == ms / 1000
    assert re.fullmatch(DURATION_PATTERN, text)


@pytest.mark.parametrize("text", sorted(INVALID))
def test_anything_else_is_refused_saying_why(text: str) -> None:
    with pytest.raises(DurationError, match=re.escape(INVALID[text])):
        parse_duration(text)
    if INVALID[text] != "out of range":  # the pattern cannot count; parse_duration does
        assert not re.fullmatch(DURATION_PATTERN, text)


def test_an_error_message_never_repeats_a_huge_input() -> None:
    with pytest.raises(DurationError) as caught:
        parse_duration("9" * 5000 + "s")
    assert len(str(caught.value)) < 200


@given(st.text(alphabet="0123456789ywdhms. -", max_size=14))
def test_the_schema_pattern_and_the_parser_agree(text: str) -> None:
    try:
        parse_duration(text)
        parses = True
    except DurationError as e:
        # too large: the pattern cannot count, and like Prometheus the parser stops at the first
        # part that overflows, before it reads the rest
        assume("out of range" not in str(e))
        parses = False
    assert bool(re.fullmatch(DURATION_PATTERN, text)) == parses


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),  # what Prometheus's Duration.String() writes for zero
        (0.25, "250ms"),
        (90, "1m30s"),
        (3600, "1h"),
        (8 * 86400, "1w1d"),
        (366 * 86400, "1y1d"),
        (365 * 86400 + 1.5, "1y1s500ms"),
    ],
)
def test_durations_are_written_the_way_prometheus_writes_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "seconds", [-1, float("nan"), float("inf"), 0.0005, 1e-9, MAX_MILLISECONDS / 1000 + 1]
)
def test_what_no_duration_can_say_is_refused(seconds: float) -> None:
    with pytest.raises(DurationError):
        format_duration(seconds)


@given(st.integers(min_value=0, max_value=MAX_MILLISECONDS))
def test_format_then_parse_is_the_identity(ms: int) -> None:
    assert parse_duration_ms(format_duration(ms / 1000)) == ms


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1", 1.0),
        ("90", 90.0),
        ("0.5", 0.5),  # a bare number is seconds, fractions allowed, as the flags always took
        ("0", 0.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("7d", 7 * 86400.0),
        (" 5m\n", 300.0),  # env vars and files often end in a newline
    ],
)
def test_flags_take_durations_or_bare_seconds(text: str, seconds: float) -> None:
    assert parse_flag_duration(text) == seconds
    assert duration_flag(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "-2", "-1s", "1.5h", "1s1m", "1e3", "5 minutes", "1_0", "nan", "1" * 30]
)
def test_bad_flag_values_fail_the_way_argparse_reports(text: str) -> None:
    with pytest.raises(DurationError):
        parse_flag_duration(text)
    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        duration_flag(text)


# --- the neighbour's real semantics: promtool reads `for:` with model.ParseDuration, on both lines
# (demo/neighbours.py). Debian's 2.42 still accepts "" (as 0) and wraps past int64 silently, so those
# two are not asked of it; Prometheus 3.x's prometheus/common refuses both, as we do.


def _promtool_accepts(line_name: str, text: str, tmp_path: Path) -> bool:
    rules = tmp_path / "rules.yaml"
    # a JSON string is a YAML double-quoted string: any text arrives exactly
    rules.write_text(
        f"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: vector(1)\n    for: {json.dumps(text)}\n"
    )
    promtool = str(line(line_name).promtool)
    done = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, timeout=30, check=False
    )
    return done.returncode == 0


def _asked_of(line_name: str) -> list[str]:
    texts = [t for t, _ in VALID] + [t for t in INVALID if "\n" not in t]
    if line_name == DEBIAN:
        return [t for t in texts if INVALID.get(t) != "out of range" and t != ""]
    return texts


@pytest.mark.integration
@pytest.mark.parametrize(("line_name", "text"), [(n, t) for n in LINES for t in _asked_of(n)])
def test_promtool_agrees(line_name: str, text: str, tmp_path: Path) -> None:
    try:
        parse_duration(text)
        ours = True
    except DurationError:
        ours = False
    assert _promtool_accepts(line_name, text, tmp_path) == ours
