"""The one duration grammar: Prometheus durations (`1m30s`, `500ms`, `2d`, `1w`, `0`), parse and format.

The grammar is that of Prometheus's `model.ParseDuration` (prometheus/common, model/time.go), which
Prometheus, Alertmanager, promtool and the prometheus-operator CRDs all read:

- one or more `<integer><unit>` parts, units `y` (365d), `w` (7d), `d` (24h), `h`, `m`, `s`, `ms`;
- units from the largest to the smallest, each at most once (`1h30m`, never `30m1h` or `1m1m`);
- only ASCII digits: no sign, no fraction (`1.5h` is `1h30m`), no whitespace, no other characters;
- `0` alone is allowed without a unit; the empty string is not a duration;
- at most what Go's time.Duration holds (2**63 - 1 ns, about 292 years): more is "out of range".

The alert config and the chart's rule values are Prometheus durations exactly (`parse_duration`).
Command-line flags and their environment variables (`parse_flag_duration`, `duration_flag`) take the
same grammar and, as they always have, a bare number of seconds (`90`, `0.5`), with surrounding
whitespace ignored. `format_duration` writes what Prometheus's Duration.String() writes.
"""

from __future__ import annotations

import argparse
import math
import re

# unit -> milliseconds, largest first: the order units must appear in
_UNIT_MS: dict[str, int] = {
    "y": 365 * 86_400_000,
    "w": 7 * 86_400_000,
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
}
_RANK = {unit: rank for rank, unit in enumerate(_UNIT_MS)}
# one part: ASCII digits, then everything up to the next digit is its unit (so `1h 30m` names the
# unknown unit "h " instead of being read as something else)
_PART = re.compile(r"([0-9]+)([^0-9]*)")
_BARE_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")
# Go's time.Duration is int64 nanoseconds
MAX_MILLISECONDS = (2**63 - 1) // 1_000_000
MAX_SECONDS = MAX_MILLISECONDS / 1000


def _pattern() -> str:
    """The grammar as a regular expression: `0`, or parts in unit order starting at any unit.

    Plain groups, alternation and `[0-9]+` only, so it means the same to Python, to ECMA-262 (JSON
    schema tools) and to Go's RE2 (Helm's schema check). Unlike the prometheus-operator CRDs' pattern
    it refuses the empty string. It cannot express the range limit; parse_duration checks that.
    """
    units = list(_UNIT_MS)
    starts = ["[0-9]+" + u + "".join(f"([0-9]+{v})?" for v in units[i + 1 :]) for i, u in enumerate(units)]
    return "^(0|" + "|".join(starts) + ")$"


DURATION_PATTERN = _pattern()
EXAMPLES = "e.g. 0, 500ms, 15s, 1m30s, 2h, 7d, 1w, 1y"


class DurationError(ValueError):
    """A string that is not a duration; the message says why and what would be."""


def parse_duration_ms(text: str) -> int:
    """Milliseconds in a Prometheus duration; raises DurationError for anything else."""
    if text == "0":
        return 0
    if text == "":
        raise DurationError(f"empty duration ({EXAMPLES})")
    total = 0
    last_rank = -1
    pos = 0
    while pos < len(text):
        part = _PART.match(text, pos)
        if part is None:
            raise DurationError(_explain(text))
        digits, unit = part.groups()
        if unit not in _UNIT_MS:
            raise DurationError(_explain(text, unit))
        if _RANK[unit] <= last_rank:
            raise DurationError(
                f"{text!r} is not a duration: units go from the largest to the smallest, each once "
                f"(y w d h m s ms; e.g. 1h30m, not 30m1h or 1m1m)"
            )
        last_rank = _RANK[unit]
        significant = digits.lstrip("0")  # leading zeros are allowed, as strconv.ParseUint allows them
        if len(significant) > 19:  # more than int64 milliseconds; also spares int() its 4300-digit limit
            raise DurationError(f"{text[:40]!r}: duration out of range (at most about 292 years)")
        total += int(significant or "0") * _UNIT_MS[unit]
        if total > MAX_MILLISECONDS:
            raise DurationError(f"{text!r}: duration out of range (at most about 292 years)")
        pos = part.end()
    return total


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration (millisecond resolution); raises DurationError otherwise."""
    return parse_duration_ms(text) / 1000


def parse_flag_duration(text: str) -> float:
    """Seconds in a flag or environment value: a Prometheus duration, or a bare number of seconds.

    Surrounding whitespace is ignored (values often come from files and env vars with a newline).
    """
    value = text.strip()
    if _BARE_SECONDS.fullmatch(value):
        seconds = float(value)
        if seconds > MAX_SECONDS:
            raise DurationError(f"{text!r}: duration out of range (at most about 292 years)")
        return seconds
    return parse_duration(value)


def duration_flag(text: str) -> float:
    """argparse `type=` for a duration flag: parse_flag_duration, failing the way argparse reports."""
    try:
        return parse_flag_duration(text)
    except DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def format_duration(seconds: float) -> str:
    """A Prometheus duration for `seconds`, largest units first (90 -> `1m30s`, 0 -> `0s`).

    Raises DurationError for a negative, non-finite or out-of-range value, or one that is not a
    whole number of milliseconds (Prometheus has no smaller unit).
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise DurationError(f"{seconds!r} seconds cannot be written as a duration")
    ms = round(seconds * 1000)
    if abs(seconds * 1000 - ms) > 1e-6 * max(1.0, abs(seconds * 1000)):
        raise DurationError(f"{seconds!r} seconds is not a whole number of milliseconds")
    if ms > MAX_MILLISECONDS:
        raise DurationError(f"{seconds!r} seconds: duration out of range (at most about 292 years)")
    if ms == 0:
        return "0s"
    out = []
    for unit, size in _UNIT_MS.items():
        count, ms = divmod(ms, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


def _explain(text: str, unit: str | None = None) -> str:
    """Why `text` is not a duration, naming the likely mistake."""
    if text.lstrip().startswith("-"):
        why = "a duration cannot be negative"
    elif text != text.strip() or " " in text:
        why = "no whitespace is allowed"
    elif "." in text:
        why = "no fractions: use a smaller unit (1h30m, not 1.5h; 500ms, not 0.5s)"
    elif text[:1].isalpha():
        why = "each unit needs a number before it"
    elif unit == "":
        why = "the last number has no unit"
    elif unit is not None:
        why = f"unknown unit {unit!r} (units: y w d h m s ms)"
    else:
        why = "it must be numbers with units"
    return f"{text!r} is not a duration: {why} ({EXAMPLES})"
