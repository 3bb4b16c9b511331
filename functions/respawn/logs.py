"""Structured log lines: one JSON object per line, which Cloud Logging reads as a structured entry."""

from __future__ import annotations

import json
import sys
from typing import Any


def log(severity: str, message: str, **fields: Any) -> None:
    """Write one line {"severity", "message", **fields} to stderr (Cloud Run/Functions parse it)."""
    entry = {"severity": severity, "message": message, **{k: v for k, v in fields.items() if v is not None}}
    print(json.dumps(entry, default=str, sort_keys=False), file=sys.stderr, flush=True)


def error(message: str, **fields: Any) -> None:
    log("ERROR", message, **fields)


def info(message: str, **fields: Any) -> None:
    log("INFO", message, **fields)
