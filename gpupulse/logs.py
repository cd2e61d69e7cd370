"""The one log setup of both services: `--log.format json|logfmt|text`, the same fields in each.

Every line carries `ts` (RFC 3339, UTC, milliseconds: `2026-01-01T12:00:00.000Z`), `level` (debug,
info, warning, error, critical), `logger` (the Python logger's name), `msg`, then the extra fields a
call passes (`log.info("restarted", extra={"pod": name})`), then `exc` (the traceback) when there is
one. `json` writes one object per line, `logfmt` writes key=value pairs (the Prometheus ecosystem's
default shape), `text` writes `ts LEVEL logger: msg key=value` for people, with a traceback on the
lines after. Everything goes to stderr.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, Final, Literal, TextIO, get_args

LogFormat = Literal["json", "logfmt", "text"]
FORMATS: Final[tuple[str, ...]] = get_args(LogFormat)
LEVELS: Final = ("debug", "info", "warning", "error")
# attributes every LogRecord has: anything else on a record came in through `extra=`
_RECORD_FIELDS: Final = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
_RESERVED: Final = ("ts", "level", "logger", "msg", "exc")


def timestamp(record: logging.LogRecord) -> str:
    """The record's time as RFC 3339 in UTC with milliseconds."""
    seconds = int(record.created)
    millis = min(int((record.created - seconds) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """ts, level, logger, msg, the extra fields, exc: the content of one line in every format."""
    doc: dict[str, Any] = {
        "ts": timestamp(record),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in _extras(record):
        doc[key if key not in _RESERVED else f"extra_{key}"] = value
    if record.exc_info:
        doc["exc"] = formatter.formatException(record.exc_info)
    elif record.exc_text:
        doc["exc"] = record.exc_text
    if record.stack_info:
        doc["stack"] = formatter.formatStack(record.stack_info)
    return doc


class JsonFormatter(logging.Formatter):
    """One JSON object per line; values that JSON cannot hold are written as their str()."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record, self), default=str, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    """`ts=… level=… logger=… msg="…" key=value`; msg is always quoted, other values when they must be."""

    def format(self, record: logging.LogRecord) -> str:
        doc = fields(record, self)
        msg = doc.pop("msg")
        head = [
            f"ts={doc.pop('ts')}",
            f"level={doc.pop('level')}",
            f"logger={_logfmt_value(doc.pop('logger'))}",
        ]
        head.append(f"msg={_quote(str(msg))}")
        return " ".join(head + [f"{_logfmt_key(k)}={_logfmt_value(v)}" for k, v in doc.items()])


class TextFormatter(logging.Formatter):
    """`ts LEVEL logger: msg key=value` for people; a traceback follows on its own lines."""

    def format(self, record: logging.LogRecord) -> str:
        doc = fields(record, self)
        exc = doc.pop("exc", None)
        stack = doc.pop("stack", None)
        line = f"{doc.pop('ts')} {record.levelname} {doc.pop('logger')}: {doc.pop('msg')}"
        doc.pop("level")
        if doc:
            line += " " + " ".join(f"{_logfmt_key(k)}={_logfmt_value(v)}" for k, v in doc.items())
        for tail in (exc, stack):
            if tail:
                line += "\n" + str(tail)
        return line


_FORMATTERS: Final[dict[str, type[logging.Formatter]]] = {
    "json": JsonFormatter,
    "logfmt": LogfmtFormatter,
    "text": TextFormatter,
}


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of one of FORMATS; ValueError names the choices otherwise."""
    if fmt not in _FORMATTERS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return _FORMATTERS[fmt]()


def setup_logging(fmt: str, level: str = "info", stream: TextIO | None = None) -> None:
    """Send the root logger to stderr (or `stream`) in `fmt` at `level`, replacing its handlers."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _extras(record: logging.LogRecord) -> Iterator[tuple[str, Any]]:
    for key, value in record.__dict__.items():
        if key not in _RECORD_FIELDS and not key.startswith("_"):
            yield key, value


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _logfmt_key(key: str) -> str:
    # a key is a bare word: anything that would break the pair becomes _
    return "".join(c if c.isprintable() and c not in ' ="' else "_" for c in key) or "_"


def _logfmt_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        text = repr(value)
    elif isinstance(value, dict | list | tuple):
        text = json.dumps(value, default=str, ensure_ascii=False)
    else:
        text = str(value)
    if text == "" or any(c in ' ="\\' or not c.isprintable() for c in text):
        return _quote(text)
    return text
