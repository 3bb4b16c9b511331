"""Lifecycle entries (started, checkpoint, completed, failed, stopped) to the configured sink.

Each entry is the jsonPayload {"event", "job_id", "attempt", "step", ...} of log `respawn-trainer`:
`cloud` writes structured entries with google-cloud-logging (labels respawn-job, respawn-attempt),
`stdout` prints one JSON line per entry (and nothing else reaches stdout), a path appends JSON lines.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Protocol, TextIO

LOG_NAME = "respawn-trainer"
log = logging.getLogger("trainer")
SEVERITY = {"failed": "ERROR", "stopped": "WARNING"}


class Sink(Protocol):
    def write(self, payload: dict[str, Any]) -> None: ...


class StreamSink:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, payload: dict[str, Any]) -> None:
        self.stream.write(json.dumps(payload, separators=(",", ":")) + "\n")
        self.stream.flush()


class FileSink:
    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def write(self, payload: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(payload, separators=(",", ":")) + "\n")


class CloudLoggingSink:
    def __init__(self, job_id: str, attempt: int, logger: Any = None) -> None:
        if logger is None:
            from google.cloud import logging as cloud_logging

            logger = cloud_logging.Client().logger(LOG_NAME)
        self.logger = logger
        self.labels = {"respawn-job": job_id, "respawn-attempt": str(attempt)}

    def write(self, payload: dict[str, Any]) -> None:
        severity = SEVERITY.get(payload["event"], "INFO")
        self.logger.log_struct(payload, labels=self.labels, severity=severity)


class NullSink:
    """Processes other than 0 of a multi-host job stay silent."""

    def write(self, payload: dict[str, Any]) -> None:
        return None


def stdout_sink() -> StreamSink:
    """Keep the real stdout for entries alone: fd 1 (and sys.stdout) now lead to stderr."""
    entries = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return StreamSink(entries)


def open_sink(spec: str, job_id: str, attempt: int) -> Sink:
    if spec == "stdout":
        return stdout_sink()
    if spec == "cloud":
        return CloudLoggingSink(job_id, attempt)
    return FileSink(spec)


class Lifecycle:
    def __init__(self, sink: Sink, job_id: str, attempt: int) -> None:
        self.sink, self.job_id, self.attempt = sink, job_id, attempt

    def emit(self, event: str, step: int, **fields: Any) -> dict[str, Any]:
        payload = {"event": event, "job_id": self.job_id, "attempt": self.attempt, "step": step, **fields}
        try:
            self.sink.write(payload)
        except Exception as e:  # a lost entry is repaired by the sweep; training must go on
            log.error("could not write the %s entry: %s", event, e)
        return payload
