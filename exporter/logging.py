"""Log setup: text for people, one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
from typing import Final

LEVELS: Final = ("debug", "info", "warning", "error")
FORMATS: Final = ("text", "json")


class JsonFormatter(logging.Formatter):
    """ts, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    """Configure the root logger once; stderr only."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}")
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
