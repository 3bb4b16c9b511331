"""`respawn logs JOB`: a job's trainer output and lifecycle entries, read from Cloud Logging.

Two logs hold a job's lines, both found by the job id the machine's startup script gave them:

* `respawn-trainer`: the lifecycle entries (`started`, `checkpoint`, `progress`, `stopped`, `completed`,
  `failed`) with `jsonPayload.job_id` and `jsonPayload.attempt`. The trainer writes them with google-cloud-logging
  (labels `respawn-job`, `respawn-attempt` too); the startup script's `failed` entry for a trainer that died
  without a word is written by `gcloud logging write`, which sets no labels, so the filter reads the payload.
* `gcplogs-docker-driver`: every line the trainer container prints (its progress lines), sent by docker's
  gcplogs log driver (adapters/startup.py) with `jsonPayload.message`, `jsonPayload.instance.name` (the worker
  VM, `t1v-n-HASH-w-I` on a TPU) and the container's RESPAWN_JOB_ID and RESPAWN_ATTEMPT in
  `jsonPayload.container.metadata`.

The filter is built here as text (job_filter, since_filter) and read through a LogReader port; following polls
with a timestamp cursor, reaching back `lag_s` for entries Cloud Logging ingests late, and drops entries it
printed already by insertId.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from respawn.machine import TRAINER_LOG
from respawn.parsing import rfc3339
from respawn.ports import LogReader

CONTAINER_LOG = "gcplogs-docker-driver"
JOB_ENV, ATTEMPT_ENV = "RESPAWN_JOB_ID", "RESPAWN_ATTEMPT"  # the container's variables gcplogs copies to entries
POLL_S = 5.0  # Cloud Logging allows 60 entries.list calls a minute per project
LAG_S = 60.0  # how far behind the newest entry a poll looks again, for entries ingested late
_WORKER_VM = re.compile(r"-w-(\d+)$")


@dataclass(frozen=True)
class LogLine:
    """One line of a job's log: a line the trainer printed (`text`) or a lifecycle entry's payload (`entry`)."""

    attempt: int | None
    worker: int | None = None
    text: str = ""
    entry: Mapping[str, Any] | None = None

    def render(self, workers: bool) -> str:
        """`[a2] text`, or `[a2 w1] text` when the job's machine has several workers."""
        where = "-" if self.attempt is None else str(self.attempt)
        prefix = f"[a{where}" + (f" w{self.worker}" if workers and self.worker is not None else "") + "]"
        return f"{prefix} {lifecycle_text(self.entry) if self.entry is not None else self.text}"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"entry": dict(self.entry)} if self.entry is not None else {"line": self.text}
        return {"attempt": self.attempt, "worker": self.worker, **body}


def lifecycle_text(payload: Mapping[str, Any]) -> str:
    """`started {"restored_step": 0, "step": 0}`: the event and what it says, less the job and attempt."""
    rest = {k: v for k, v in payload.items() if k not in ("event", "job_id", "attempt")}
    return f"{payload.get('event')} {json.dumps(rest, sort_keys=True, default=str)}"


def lifecycle_payload(text: str) -> dict[str, Any] | None:
    """The payload of a lifecycle line (one JSON object with an `event`), else None: a plain line."""
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("event"), str) else None


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def job_filter(project: str, job_id: str, attempt: int | None = None) -> str:
    """The Cloud Logging query selecting a job's (or one attempt's) lifecycle entries and container lines."""
    trainer = [f"logName={_quote(f'projects/{project}/logs/{TRAINER_LOG}')}", f"jsonPayload.job_id={_quote(job_id)}"]
    container = [
        f"logName={_quote(f'projects/{project}/logs/{CONTAINER_LOG}')}",
        f"jsonPayload.container.metadata.{JOB_ENV}={_quote(job_id)}",
    ]
    if attempt is not None:
        trainer.append(f"jsonPayload.attempt={int(attempt)}")
        container.append(f"jsonPayload.container.metadata.{ATTEMPT_ENV}={_quote(str(int(attempt)))}")
    return f"({' AND '.join(trainer)})\nOR\n({' AND '.join(container)})"


def timestamp(t: float) -> str:
    """Seconds since the epoch -> RFC 3339 UTC with microseconds, as Cloud Logging filters compare them."""
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def since_filter(selection: str, t: float) -> str:
    """`selection` restricted to entries from `t` on. Without a timestamp google-cloud-logging adds its own
    default of the last 24 hours, which would cut a long job short."""
    return f'({selection})\nAND timestamp>="{timestamp(t)}"'


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def entry_line(entry: Mapping[str, Any]) -> LogLine | None:
    """A LogEntry (API JSON) of one of the two logs -> a LogLine; None for anything else."""
    log_id = str(entry.get("logName", "")).rpartition("/logs/")[2]
    payload = entry.get("jsonPayload")
    if not isinstance(payload, Mapping):
        return None
    if log_id == TRAINER_LOG:  # only process 0 writes lifecycle entries; the startup script names its worker
        worker = _int(payload.get("worker"))
        return LogLine(_int(payload.get("attempt")), 0 if worker is None else worker, entry=payload)
    if log_id == CONTAINER_LOG:
        container = payload.get("container")
        meta = container.get("metadata") if isinstance(container, Mapping) else None
        instance = payload.get("instance")
        name = str(instance.get("name", "")) if isinstance(instance, Mapping) else ""
        vm = _WORKER_VM.search(name)
        attempt = _int(meta.get(ATTEMPT_ENV)) if isinstance(meta, Mapping) else None
        return LogLine(attempt, int(vm.group(1)) if vm else None, text=str(payload.get("message", "")).rstrip("\n"))
    return None


def _key(entry: Mapping[str, Any]) -> str:
    insert_id = entry.get("insertId")
    if isinstance(insert_id, str) and insert_id:
        return insert_id
    return hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode()).hexdigest()


def stream(
    reader: LogReader,
    selection: str,
    since: float,
    out: Callable[[Mapping[str, Any]], None],
    *,
    follow: bool = False,
    finished: Callable[[], bool] = lambda: True,
    sleep: Callable[[float], None],
    poll_s: float = POLL_S,
    lag_s: float = LAG_S,
) -> int:
    """Hand every entry of `selection` from `since` on to `out`, oldest first, each once; returns how many.

    Without `follow`, one read. With it, read again every `poll_s` from the newest timestamp seen less `lag_s`
    (an entry already handed out is recognised by its insertId), until `finished()` said yes before a read."""
    seen: dict[str, float] = {}
    cursor, count, last = since, 0, False
    while True:
        for entry in reader.entries(since_filter(selection, cursor - lag_s)):
            key = _key(entry)
            if key in seen:
                continue
            t = rfc3339(entry.get("timestamp"))
            seen[key] = cursor if t is None else t
            out(entry)
            count += 1
        if not follow or last:
            return count
        cursor = max([cursor, *seen.values()])
        seen = {k: t for k, t in seen.items() if t >= cursor - lag_s}  # older ones are never read again
        last = finished()
        sleep(poll_s)
