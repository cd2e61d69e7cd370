"""The one log setup: json, logfmt and text carry the same fields (ts, level, logger, msg, extras, exc)."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from gpupulse.logs import FORMATS, LEVELS, setup_logging

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def _emit(fmt: str, level: str = "info") -> str:
    out = io.StringIO()
    setup_logging(fmt, level, stream=out)
    log = logging.getLogger("gpupulse.test")
    log.debug("hidden at info")
    log.info("restarted %s", "pod-1", extra={"pod": "ns/p 1", "attempt": 2, "dry_run": False, "level": "x"})
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        log.exception('boom "quoted"\nsecond line')
    return out.getvalue()


def test_json_is_one_object_per_line_with_the_shared_fields() -> None:
    lines = _emit("json").splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert list(first)[:4] == ["ts", "level", "logger", "msg"]
    assert TS.match(first["ts"])
    assert first | {"ts": ""} == {
        "ts": "",
        "level": "info",
        "logger": "gpupulse.test",
        "msg": "restarted pod-1",
        "pod": "ns/p 1",
        "attempt": 2,
        "dry_run": False,
        "extra_level": "x",  # an extra never overwrites a shared field
    }
    assert second["level"] == "error" and second["msg"] == 'boom "quoted"\nsecond line'
    assert second["exc"].startswith("Traceback") and "ZeroDivisionError" in second["exc"]


def _logfmt_pairs(line: str) -> dict[str, str]:
    pairs = re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line)
    return {k: json.loads(v) if v.startswith('"') else v for k, v in pairs}


def test_logfmt_is_one_line_of_pairs_with_the_same_fields() -> None:
    lines = _emit("logfmt").splitlines()
    assert len(lines) == 2  # the traceback and the newline in msg stay inside quoted values
    first, second = (_logfmt_pairs(line) for line in lines)
    assert lines[0].startswith("ts=") and " level=info logger=gpupulse.test msg=" in lines[0]
    assert TS.match(first["ts"])
    assert {k: first[k] for k in ("msg", "pod", "attempt", "dry_run", "extra_level")} == {
        "msg": "restarted pod-1",
        "pod": "ns/p 1",
        "attempt": "2",
        "dry_run": "false",
        "extra_level": "x",
    }
    assert second["msg"] == 'boom "quoted"\nsecond line'
    assert "ZeroDivisionError" in second["exc"]


def test_text_is_for_people_with_the_traceback_below() -> None:
    out = _emit("text")
    first = out.splitlines()[0]
    assert re.match(
        r"^\S+Z INFO gpupulse\.test: restarted pod-1 pod=\"ns/p 1\" attempt=2 dry_run=false", first
    ), first
    assert "\nTraceback (most recent call last):" in out


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_level_filters_in_every_format(fmt: str) -> None:
    assert "hidden at info" not in _emit(fmt)
    assert "hidden at info" in _emit(fmt, "debug")


def test_unknown_format_or_level_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="json, logfmt, text"):
        setup_logging("yaml")
    with pytest.raises(ValueError, match="debug, info"):
        setup_logging("json", "loud")
    assert LEVELS == ("debug", "info", "warning", "error")


def test_values_json_cannot_hold_are_written_as_text() -> None:
    out = io.StringIO()
    setup_logging("json", stream=out)
    logging.getLogger("t").warning("odd", extra={"where": object.__new__(type("Spot", (), {}))})
    assert "Spot object" in json.loads(out.getvalue())["where"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_both_services_take_every_format(fmt: str) -> None:
    from exporter import cli as exporter_cli
    from remediation import cli as remediation_cli

    exporter_args = exporter_cli.build_parser().parse_args([f"--log.format={fmt}"])
    assert exporter_cli.settings_from_args(exporter_args).log_format == fmt
    ns = remediation_cli.build_parser().parse_args(["serve", "--insecure-no-auth", f"--log.format={fmt}"])
    assert remediation_cli.settings_from_flags(ns, {}).log_format == fmt


def test_each_service_keeps_its_default_format() -> None:
    from exporter import cli as exporter_cli
    from remediation import cli as remediation_cli

    assert exporter_cli.settings_from_args(exporter_cli.build_parser().parse_args([])).log_format == "text"
    ns = remediation_cli.build_parser().parse_args(["serve", "--insecure-no-auth"])
    assert remediation_cli.settings_from_flags(ns, {}).log_format == "logfmt"
