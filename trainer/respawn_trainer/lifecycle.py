"""Lifecycle entries (started, checkpoint, completed, failed, stopped) to the configured sink.

Each entry is the jsonPayload {"event", "job_id", "attempt", "step", ...} of log `respawn-trainer`:
`cloud` writes structured entries to Cloud Logging (labels respawn-job, respawn-attempt),
`stdout` prints one JSON line per entry (and nothing else reaches stdout), a path appends JSON lines.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import urllib.request
from typing import Any, Protocol, TextIO

from respawn_trainer.env import DEFAULT_METADATA_URL

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


class MetadataServer:
    """The machine's metadata server: its values, and its service account's access token (cached until a minute
    before it expires)."""

    TIMEOUT_S = 10.0

    def __init__(self, url: str = DEFAULT_METADATA_URL) -> None:
        self.url = url.rstrip("/")
        self._token, self._token_until = "", 0.0

    def get(self, path: str) -> str:
        request = urllib.request.Request(f"{self.url}/{path}", headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=self.TIMEOUT_S) as response:
            return str(response.read().decode())

    def token(self) -> str:
        if time.monotonic() > self._token_until:
            token = json.loads(self.get("instance/service-accounts/default/token"))
            self._token = token["access_token"]
            self._token_until = time.monotonic() + float(token.get("expires_in", 300)) - 60.0
        return self._token


class CloudLoggingSink:
    """Structured entries through Cloud Logging's REST API (`entries:write`), authorized by the machine's service
    account token from the metadata server: no client library to import on the way to the first step.

    The entry is what google-cloud-logging's `log_struct` writes on a VM: log `respawn-trainer`, resource
    `gce_instance`, labels respawn-job and respawn-attempt, severity by event."""

    ENDPOINT = "https://logging.googleapis.com/v2/entries:write"
    TIMEOUT_S = 10.0

    def __init__(
        self, job_id: str, attempt: int, metadata_url: str = DEFAULT_METADATA_URL, endpoint: str = ENDPOINT
    ) -> None:
        self.metadata, self.endpoint = MetadataServer(metadata_url), endpoint
        self.labels = {"respawn-job": job_id, "respawn-attempt": str(attempt)}
        self._where: tuple[str, dict[str, Any]] | None = None  # logName, resource

    def _location(self) -> tuple[str, dict[str, Any]]:
        if self._where is None:
            get = self.metadata.get
            project = get("project/project-id")
            zone = get("instance/zone").rsplit("/", 1)[-1]
            labels = {"project_id": project, "instance_id": get("instance/id"), "zone": zone}
            self._where = f"projects/{project}/logs/{LOG_NAME}", {"type": "gce_instance", "labels": labels}
        return self._where

    def write(self, payload: dict[str, Any]) -> None:
        log_name, resource = self._location()
        entry = {
            "logName": log_name,
            "resource": resource,
            "labels": self.labels,
            "severity": SEVERITY.get(payload["event"], "INFO"),
            "jsonPayload": payload,
        }
        body = json.dumps({"entries": [entry]}).encode()
        headers = {"Authorization": f"Bearer {self.metadata.token()}", "Content-Type": "application/json"}
        request = urllib.request.Request(self.endpoint, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.TIMEOUT_S) as response:
            response.read()


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


def open_sink(spec: str, job_id: str, attempt: int, metadata_url: str | None = None) -> Sink:
    if spec == "stdout":
        return stdout_sink()
    if spec == "cloud":
        return CloudLoggingSink(job_id, attempt, metadata_url or DEFAULT_METADATA_URL)
    return FileSink(spec)


class Lifecycle:
    def __init__(self, sink: Sink, job_id: str, attempt: int, extra: dict[str, Any] | None = None) -> None:
        """extra: fields of every entry (a world's `world` version and `slice`)."""
        self.sink, self.job_id, self.attempt, self.extra = sink, job_id, attempt, extra or {}

    def emit(self, event: str, step: int, **fields: Any) -> dict[str, Any]:
        payload = {"event": event, "job_id": self.job_id, "attempt": self.attempt, "step": step, **self.extra, **fields}
        try:
            self.sink.write(payload)
        except Exception as e:  # a lost entry is repaired by the sweep; training must go on
            log.error("could not write the %s entry: %s", event, e)
        return payload
